"""The ebrl scheduler: every env independent, stages overlapped, staleness bounded.

Threads and what they exchange (small messages over queues, as Sample Factory):

  group g (one per env group) : recv() whichever of its envs are ready
                                -> ready queue -> waits for their actions -> send()
  sampler                      : merges ready rows from all groups (up to
                                 max_gen_batch rows or max_wait), closes each env's
                                 pending transition in the TrajectoryAssembler,
                                 generates actions with the newest params, and
                                 replies to each group
  learner                      : takes segments_per_update finished segments from
                                 the TrajectoryQueue, runs the decoupled-PPO update,
                                 publishes params with a new version

One fully batched group (recv_batch = its envs: sync-mode pools stepping together) has nothing
for a sampler to merge and waits for its reply anyway: its thread generates itself
(`_inline_loop`), saving two thread hand-offs per step of the chain.

A slow env never holds the others back: EnvPool returns envs as they finish
(async mode), and the learner takes whichever segments are complete. Rollout
overlaps training: the sampler switches to new params between batches without
waiting. Staleness is bounded by the TrajectoryQueue: an env whose next action
would start a segment beyond the queue's capacity is parked until the learner
catches up, while envs in the middle of a segment continue; the learner takes
segments earliest deadline first and waits for a straggler only when passing
it by would leave one more than max_staleness versions behind. With
max_staleness = 0 this is on-policy PPO.

Deadlock breaker: async EnvPool returns whole batches, so a group with too many
envs parked cannot return the envs it still has in flight. If the learner then
waits for segments and every group is stuck that way, nothing can move: the
sampler force-starts one parked env at a time beyond capacity until a group
can return envs again. Only force-started segments can reach the learner too
stale (it masks those samples); `queue.forced` counts them.

Any exception in a thread stops the run and is re-raised by `run`.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from ebrl.trajectories.assembler import Segment, TrajectoryAssembler
from ebrl.scheduler.context import RunContext
from ebrl.scheduler.loop_threads import POLL_S, LoopThreads, learner_loop
from ebrl.trajectories.queue import TrajectoryQueue
from ebrl.types import SegmentBatch, TrainState
from sim_adapters.base import StepBatch, concat_batches, concat_sorted

_WAKE = ("wake", None)


def stack_segments(segments: list[Segment]) -> SegmentBatch:
  """Segments (each [T, ...]) side by side as a [T, B, ...] batch."""
  stack = lambda xs: np.stack(xs, axis=1)
  return SegmentBatch(
      obs={k: stack([s.obs[k] for s in segments]) for k in segments[0].obs},
      actions=stack([s.actions for s in segments]), logp=stack([s.logp for s in segments]),
      rewards=stack([s.rewards for s in segments]), terminated=stack([s.terminated for s in segments]),
      done=stack([s.done for s in segments]), valid=stack([s.valid for s in segments]),
      version=stack([s.version for s in segments]),
      discount=None if segments[0].discount is None else stack([s.discount for s in segments]),
      env_ids=np.array([s.env_id for s in segments], np.int32))


def _rows(b: StepBatch, idx: np.ndarray) -> dict[str, np.ndarray]:
  return {k: v[idx] for k, v in b.obs.items()}


class EbrlScheduler:
  # Training runs beside the rollout (only the staleness bound couples them), so the
  # rollout rate is the e2e rate.
  overlaps_training = True

  def __init__(self, ctx: RunContext):
    self.ctx = ctx
    layout = ctx.layout
    self.groups = ctx.host_envs
    # The fully batched layout (recv_batch = envs per group: sync-mode pools): a group's envs
    # step together, so its recv gathers every env in flight, as the sync scheduler's step does,
    # and the learner still trains beside the rollout.
    self.gather_all = [not getattr(self.groups[g], "is_async", True) for g in range(len(self.groups))]
    # One fully batched group: its thread generates too (see _inline_loop).
    self.inline = len(self.groups) == 1 and self.gather_all[0]
    self.max_gen_batch = layout.max_gen_batch
    self.max_wait_s = ctx.max_wait_s
    self.resources = ctx.resources  # Pins each stage's thread to its quota; re-plans reach us below.
    if self.resources is not None:
      self._apply_plan(self.resources.plan)
      self.resources.listeners.append(self._apply_plan)
    self.queue = TrajectoryQueue(layout.segments_per_update, ctx.max_staleness)
    if ctx.overlap is not None:  # Overlap or a barrier, as the run measures it.
      ctx.overlap.listeners.append(self.queue.set_admission)
      self.queue.set_admission(ctx.overlap.admission)
    self.assembler = TrajectoryAssembler(ctx.spec, layout.num_envs, layout.rollout_length,
                                         lambda seg: self.queue.put(seg, seg.start_version, seg.forced),
                                         ctx.action_size)
    self._ready: queue.Queue = queue.Queue()
    self._replies = [queue.Queue() for _ in range(len(self.groups))]
    self._late = [queue.Queue() for _ in range(len(self.groups))]
    self._parked: list[tuple[int, np.ndarray, dict[str, np.ndarray]]] = []  # (group, local ids, obs)
    self._stages = LoopThreads()
    self._stop = self._stages.stop
    # Set by a group that cannot recv (too few envs in flight for a whole batch) and
    # got no parked actions for a while; cleared when it can recv or sends again.
    self._starved = [threading.Event() for _ in range(len(self.groups))]

  def _apply_plan(self, plan) -> None:
    """A plan's generation batch (read by the sampler loop on its next batch)."""
    if not self.ctx.layout.gen_batch_fixed:
      self.max_gen_batch = plan.max_gen_batch
    self.max_wait_s = plan.max_wait_ms / 1000.0

  def _pin(self, stage: str) -> None:
    if self.resources is not None:
      self.resources.pin_stage(stage)

  # -- lifecycle --------------------------------------------------------------

  def run(self, state: TrainState, total_env_steps: int) -> TrainState:
    self._total = total_env_steps
    self._state = state
    # A resumed run starts at its restored version: count the segments of the updates
    # already made as started, or the capacity rule would start a burst of segments
    # that the learner then drops as too stale.
    self.queue.resume_at(int(state.version))
    if self.inline:
      stages = [("group0", self._inline_loop, ())]
    else:
      stages = [(f"group{g}", self._group_loop, (g,)) for g in range(len(self.groups))]
      stages.append(("sampler", self._sampler_loop, ()))
    stages.append(("learner", self._learner_loop, ()))
    self._stages.run(stages, on_stop=self.queue.close)
    return self._state

  def _stopping(self) -> bool:
    if self.ctx.log.should_stop(self._total):
      self._stop.set()
    return self._stop.is_set()

  # -- group threads: simulation ---------------------------------------------

  def _group_loop(self, g: int) -> None:
    adapter, clock, lane = self.groups[g], self.ctx.clock, f"group{g}"
    self._start_group(g)
    lockstep = self.gather_all[g]
    while not self._stopping():
      if lockstep:
        # A sync-mode pool takes one send per recv (a second send before the recv mixes up
        # its rows): parked envs' actions go out only with nothing in flight or with a reply.
        if not adapter.can_recv():
          if self._send_late(g, block=True):
            self._starved[g].clear()
          else:
            self._starved[g].set()
          continue
      else:
        # Envs parked by the staleness bound may leave too few in flight for a recv to
        # return (async EnvPool waits for a whole batch): then wait for their actions.
        sent = self._send_late(g, block=not adapter.can_recv())
        if not adapter.can_recv():
          if sent:
            self._starved[g].clear()
          else:
            self._starved[g].set()
          continue
      self._starved[g].clear()
      with clock.stage("sim", lane=lane):
        batch = self._recv_every_env(adapter) if lockstep else adapter.recv()
      self._ready.put((g, batch))
      reply = self._wait(self._replies[g])
      if reply is None:
        return
      self._send_reply(g, *reply, with_late=lockstep)

  def _inline_loop(self) -> None:
    """One fully batched group: simulation and generation on this one thread, as sync's loop has.

    With one group in lockstep the sampler has nothing to merge, and the group waits for its reply
    anyway, so a sampler thread would only add two thread hand-offs to every step of the chain:
    on cheap simulators that is most of a step (CartpoleBalance-v1, 32 envs: ebrl at 0.91x sync
    with a barrier that should equal sync, 53.7 against 43.5 CPU µs per env step). Parked envs,
    the staleness bound and the deadlock breaker work as with the sampler thread.
    """
    adapter, clock, lane = self.groups[0], self.ctx.clock, "group0"
    self._start_group(0)
    while not self._stopping():
      self._serve_parked()
      if not adapter.can_recv():  # Nothing in flight: parked envs' actions, or wait for room.
        if self._send_late(0, block=False):
          self._starved[0].clear()
        elif not self._wait_wake():
          # Starved only after a whole poll without a publish: right after one, the next pass
          # grants the room it made (set at once, the breaker would force envs the room covers).
          self._starved[0].set()
        continue
      self._starved[0].clear()
      with clock.stage("sim", lane=lane):
        batch = self._recv_every_env(adapter)
      self._serve([(0, batch)])
      self._send_reply(0, *self._replies[0].get_nowait(), with_late=True)

  def _start_group(self, g: int) -> None:
    """A group thread's start: pinned to the sim quota, its simulators reset."""
    self._pin("sim")
    if self.resources is not None:
      with self.resources.adopt("sim"):  # Threads the adapter starts on reset (a multi-task env's receivers).
        self.groups[g].reset()
    else:
      self.groups[g].reset()

  @staticmethod
  def _recv_every_env(adapter) -> StepBatch:
    """Every env in flight, as the sync scheduler's step gathers them (the fully batched layout)."""
    batches = [adapter.recv()]
    while adapter.can_recv():
      batches.append(adapter.recv())
    return concat_sorted(batches) if len(batches) > 1 else batches[0]

  def _send_reply(self, g: int, ids: np.ndarray, env_actions: np.ndarray | None, with_late: bool) -> None:
    """Sends a reply's actions; `with_late` (sync-mode pools, one send per recv) adds every action
    generated meanwhile for the group's parked envs to the same send."""
    late = self._take_late(g, block=False) if with_late else None
    if late:
      ids = np.concatenate([ids, late[0]])
      env_actions = late[1] if env_actions is None else np.concatenate([env_actions, late[1]])
    if len(ids):
      with self.ctx.clock.stage("sim", lane=f"group{g}"):  # Handing actions over is simulator work too.
        self.groups[g].send(env_actions, ids)

  def _wait_wake(self) -> bool:
    """Waits until the learner publishes (it may have made room for parked envs), at most a poll
    interval; returns whether it did."""
    try:
      self._ready.get(timeout=POLL_S)
      return True
    except queue.Empty:
      return False

  def _take_late(self, g: int, block: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """Every action generated so far for this group's parked envs, as one (ids, actions) pair."""
    items = []
    while True:
      try:
        items.append(self._late[g].get(timeout=POLL_S) if block and not items else self._late[g].get_nowait())
      except queue.Empty:
        break
    if not items:
      return None
    return np.concatenate([i for i, _ in items]), np.concatenate([a for _, a in items])

  def _send_late(self, g: int, block: bool) -> int:
    """Sends actions generated for this group's parked envs (one send); returns how many."""
    late = self._take_late(g, block)
    if late is None:
      return 0
    with self.ctx.clock.stage("sim", lane=f"group{g}"):
      self.groups[g].send(late[1], late[0])
    return len(late[0])

  def _wait(self, q: queue.Queue):
    while not self._stop.is_set():
      try:
        return q.get(timeout=POLL_S)
      except queue.Empty:
        continue
    return None

  # -- sampler thread: generation --------------------------------------------

  def _collect(self) -> list[tuple[int, StepBatch]]:
    """Ready batches: the first blocks briefly, then more until max_gen_batch rows, max_wait,
    or a batch from every group (each group waits for its reply, so no more can come)."""
    items, rows = [], 0
    try:
      first = self._ready.get(timeout=POLL_S)
    except queue.Empty:
      return items
    deadline = time.perf_counter() + self.max_wait_s
    while True:
      if first is not _WAKE:
        items.append(first)
        rows += len(first[1])
      remaining = deadline - time.perf_counter()
      if rows >= self.max_gen_batch or remaining <= 0 or len(items) == len(self.groups):
        return items
      try:
        first = self._ready.get(timeout=remaining)
      except queue.Empty:
        return items

  def _sampler_loop(self) -> None:
    self._pin("gen")
    while not self._stopping():
      self._serve_parked()
      items = self._collect()
      if items:
        self._serve(items)
    for r in self._replies:
      r.put(None)

  def _serve(self, items: list[tuple[int, StepBatch]]) -> None:
    """Closes the transitions of the ready rows, starts segments within the staleness bound (the
    rest are parked), generates for the served rows and puts each group's reply on its queue."""
    ctx = self.ctx
    merged = concat_batches([self.groups.to_global(g, b) for g, b in items])
    gids = merged.env_ids
    closed = self.assembler.pending[gids]
    ctx.tracker.observe(merged)
    self.assembler.complete(gids, merged)
    ctx.log.add_env_steps(int(closed.sum()))
    # The staleness throttle: envs that would start a segment beyond capacity are parked.
    serve = np.ones(len(gids), bool)
    starts = np.flatnonzero(self.assembler.needs_new_segment(gids))
    granted, start_version = self.queue.try_start(len(starts))
    self.assembler.begin(gids[starts[:granted]], start_version)
    serve[starts[granted:]] = False
    acts = self._generate(merged.obs, gids, serve)
    # Reply to every group (possibly with no actions: its envs are parked).
    start = 0
    for g, b in items:
      rows = slice(start, start + len(b))
      start += len(b)
      mine = serve[rows]
      self._replies[g].put((b.env_ids[mine], acts[rows][mine] if acts is not None else None))
      if (~mine).any():
        idx = np.flatnonzero(~mine)
        self._parked.append((g, b.env_ids[idx], _rows(b, idx)))

  def _generate(self, obs, gids, serve) -> np.ndarray | None:
    """Actions for the served rows; returns env actions for all rows (parked rows: zeros)."""
    if not serve.any():
      return None
    idx = np.flatnonzero(serve)
    with self.ctx.clock.stage("gen", lane="sampler"):
      acts, version = self.ctx.sampler.act({k: v[idx] for k, v in obs.items()}, pad=True)
    self.assembler.start(gids[idx], {k: v[idx] for k, v in obs.items()}, acts, version)
    env_actions = np.zeros((len(gids), acts.env_action.shape[1]), np.float32)
    env_actions[idx] = acts.env_action
    return env_actions

  def _deadlocked(self) -> bool:
    """The learner waits for segments and no group can return an env (see the module docstring)."""
    return self.queue.learner_waiting and all(s.is_set() for s in self._starved)

  def _serve_parked(self) -> None:
    """Generates for parked envs once the learner has made room, oldest first."""
    if not self._parked:
      return
    offsets = self.groups.offsets
    force = 1 if self._deadlocked() else 0  # One env at a time: as few beyond capacity as will do.
    keep = []
    for g, ids, obs in self._parked:
      granted, start_version = self.queue.try_start(len(ids))
      self.assembler.begin(ids[:granted] + offsets[g], start_version)
      if granted:
        force = 0  # Room came back since the check: the envs granted now end the wait.
      if force and granted < len(ids):
        self.assembler.begin(ids[granted:granted + 1] + offsets[g], self.queue.force_start(1), forced=True)
        self.ctx.log.note_force_started(1)
        granted, force = granted + 1, 0
      if granted:
        go = slice(0, granted)
        sub = {k: v[go] for k, v in obs.items()}
        with self.ctx.clock.stage("gen", lane="sampler"):
          acts, version = self.ctx.sampler.act(sub, pad=True)
        self.assembler.start(ids[go] + offsets[g], sub, acts, version)
        self._late[g].put((ids[go], acts.env_action))
      if granted < len(ids):
        rest = slice(granted, None)
        keep.append((g, ids[rest], {k: v[rest] for k, v in obs.items()}))
    self._parked = keep

  # -- learner thread: update -------------------------------------------------

  def _learner_loop(self) -> None:
    self._pin("train")
    if self.resources is not None:
      self.resources.enforcer.pin_xla()
    self._state = learner_loop(self.ctx, self._state, self.queue, self._stopping, stack_segments, self._published)

  def _published(self, state) -> None:
    """New params are in the store: raise the queue's version and wake the sampler."""
    self.queue.set_version(int(state.version))
    self._ready.put(_WAKE)
