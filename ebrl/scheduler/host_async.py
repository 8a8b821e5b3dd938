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
for a sampler to merge and waits for its reply anyway: its thread generates itself (the group
loop with generation inline), saving two thread hand-offs per step of the chain.

A slow env never holds the others back: EnvPool returns envs as they finish
(async mode), and the learner takes whichever segments are complete. Rollout
overlaps training: the sampler switches to new params between batches without
waiting. Staleness is bounded by the TrajectoryQueue: an env whose next action
would start a segment beyond the queue's capacity is parked until the learner
catches up, while envs in the middle of a segment continue; the learner takes
segments earliest deadline first and waits for a straggler only when passing
it by would leave one more than max_staleness versions behind. With
max_staleness = 0 this is on-policy PPO.

Grants, parked envs and the deadlock breaker (one parked env started beyond
capacity when the learner waits and no group can return an env) are the
Admission object's (ebrl/scheduler/admission.py), shared with the device
scheduler. Only force-started segments can reach the learner too stale (it
masks those samples); `queue.forced` counts them.

Knobs (`apply`): a tuner may hold admission below the bound (a barrier) and
resize the generation batch and its wait while the run goes on.

Any exception in a thread stops the run and is re-raised by `run`.
"""

from __future__ import annotations

import queue
import time
from typing import Iterator

import numpy as np

from ebrl.scheduler.admission import Admission
from ebrl.trajectories.assembler import Segment, TrajectoryAssembler
from ebrl.scheduler.context import Knobs, RunContext, Scheduler, UpdateReport
from ebrl.scheduler.loop_threads import POLL_S, LoopThreads, learner_loop
from ebrl.trajectories.queue import TrajectoryQueue
from ebrl.types import SegmentBatch, TrainState
from sim_adapters.base import StepBatch, concat_step_batches, concat_sorted

_WAKE = ("wake", None)


def stack_segments(segments: list[Segment], env_id_offset: int = 0) -> SegmentBatch:
  """Segments (each [T, ...]) side by side as a [T, B, ...] batch; their env ids in the run's
  numbering (a process of a run over several numbers its envs from `env_id_offset`)."""
  stack = lambda xs: np.stack(xs, axis=1)
  return SegmentBatch(
      obs={k: stack([s.obs[k] for s in segments]) for k in segments[0].obs},
      actions=stack([s.actions for s in segments]), logp=stack([s.logp for s in segments]),
      rewards=stack([s.rewards for s in segments]), terminated=stack([s.terminated for s in segments]),
      done=stack([s.done for s in segments]), valid=stack([s.valid for s in segments]),
      version=stack([s.version for s in segments]),
      discount=None if segments[0].discount is None else stack([s.discount for s in segments]),
      env_ids=np.array([s.env_id for s in segments], np.int32) + env_id_offset)


def _rows(b: StepBatch, idx: np.ndarray) -> dict[str, np.ndarray]:
  return {k: v[idx] for k, v in b.obs.items()}


class HostAsyncScheduler(Scheduler):
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
    # One fully batched group: its thread generates too (see _group_loop).
    self.inline = len(self.groups) == 1 and self.gather_all[0]
    self.max_gen_batch = layout.max_gen_batch
    self.max_wait_s = ctx.max_wait_s
    self.pinning = ctx.pinning  # Pins each stage's thread to its quota, or None.
    self.queue = TrajectoryQueue(layout.segments_per_update, ctx.max_staleness)
    self.admission = Admission(self.queue, len(self.groups))
    self._forced_reported = 0
    self.assembler = TrajectoryAssembler(ctx.spec, layout.num_envs, layout.rollout_length,
                                         lambda seg: self.queue.put(seg, seg.start_version, seg.forced),
                                         ctx.action_size)
    self._ready: queue.Queue = queue.Queue()
    self._replies = [queue.Queue() for _ in range(len(self.groups))]
    self._late = [queue.Queue() for _ in range(len(self.groups))]  # Actions for parked envs, per group.
    self._stages = LoopThreads()
    self._stop = self._stages.stop

  def apply(self, knobs: Knobs) -> None:
    """A tuner's knobs: admission at once; the generation batch and wait from the sampler's next batch."""
    if knobs.admission is not None:
      self.admission.set_admission(knobs.admission)
    if knobs.max_gen_batch is not None:
      self.max_gen_batch = knobs.max_gen_batch
    if knobs.max_wait_s is not None:
      self.max_wait_s = knobs.max_wait_s

  def _pin(self, stage: str) -> None:
    if self.pinning is not None:
      self.pinning.pin_stage(stage)

  # -- lifecycle --------------------------------------------------------------

  def run(self, state: TrainState) -> Iterator[UpdateReport]:
    """Yields a report per update until the caller stops taking them, ctx.stop is set or a
    thread fails (re-raised)."""
    self._state = state
    # A resumed run starts at its restored version: count the segments of the updates
    # already made as started, or the capacity rule would start a burst of segments
    # that the learner then drops as too stale.
    self.admission.resume_at(int(state.version))
    stages = [(f"group{g}", self._group_loop, (g,)) for g in range(len(self.groups))]
    if not self.inline:
      stages.append(("sampler", self._sampler_loop, ()))
    stages.append(("learner", self._learner_loop, ()))
    yield from self._stages.run(stages, external_stop=self.ctx.stop, on_stop=self.admission.close)

  def _stopping(self) -> bool:
    return self._stop.is_set()

  # -- group threads: simulation ---------------------------------------------

  def _group_loop(self, g: int) -> None:
    """One env group: recv whichever of its envs are ready, get their actions, send them.

    Inline (one fully batched group) this thread also generates, as sync's loop does: the sampler
    would have nothing to merge and the group waits for its reply anyway, so a sampler thread would
    only add two thread hand-offs to every step of the chain (on cheap simulators most of a step).
    """
    adapter, lane, lockstep = self.groups[g], f"group{g}", self.gather_all[g]
    self._start_group(g)
    while not self._stopping():
      if self.inline:
        self._serve_parked()
      if not self._ready_to_recv(g, adapter, lockstep):
        continue
      with self.ctx.clock.stage("sim", lane=lane):
        batch = self._recv_every_env(adapter) if lockstep else adapter.recv()
      if self.inline:
        self._serve([(g, batch)])
        reply = self._replies[g].get_nowait()
      else:
        self._ready.put((g, batch))
        reply = self._wait(self._replies[g])
        if reply is None:
          return
      self._send_reply(g, *reply, with_late=lockstep)

  def _ready_to_recv(self, g: int, adapter, lockstep: bool) -> bool:
    """Whether a recv can return now. Envs parked by the staleness bound may leave too few in
    flight (an async pool waits for a whole batch; a lockstep pool has nothing in flight): then the
    parked envs' actions are sent as they come, and a group that gets none is starved (the
    deadlock breaker's signal)."""
    starved = self.admission.starved[g]
    if self.inline:
      if adapter.can_recv():
        starved.clear()
        return True
      if self._send_late(g, block=False):
        starved.clear()
      elif not self._wait_wake():
        # Starved only after a whole poll without a publish: right after one, the next pass
        # grants the room it made (set at once, the breaker would force envs the room covers).
        starved.set()
      return False
    # A lockstep pool takes one send per recv (a second send before the recv mixes up its rows):
    # parked envs' actions go out only with nothing in flight, or with a reply.
    sent = 0 if lockstep and adapter.can_recv() else self._send_late(g, block=not adapter.can_recv())
    if adapter.can_recv():
      starved.clear()
      return True
    if sent:
      starved.clear()
    else:
      starved.set()
    return False

  def _start_group(self, g: int) -> None:
    """A group thread's start: pinned to the sim quota, its simulators reset."""
    self._pin("sim")
    if self.pinning is not None:
      with self.pinning.adopt("sim"):  # Threads the adapter starts on reset (a multi-task env's receivers).
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
    merged = concat_step_batches([self.groups.to_global(g, b) for g, b in items])
    gids = merged.env_ids
    closed = self.assembler.pending[gids]
    ctx.tracker.observe(merged)
    self.assembler.complete(gids, merged)
    ctx.tracker.count_steps(int(closed.sum()))
    # The staleness throttle: envs that would start a segment beyond capacity are parked.
    serve = np.ones(len(gids), bool)
    starts = np.flatnonzero(self.assembler.needs_new_segment(gids))
    granted, start_version = self.admission.grant(len(starts))
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
        self.admission.park(g, b.env_ids[idx], _rows(b, idx))

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

  def _serve_parked(self) -> None:
    """Generates for the parked envs the admission releases (room made by the learner, or one env
    beyond capacity to break a deadlock); their actions go to their group's late queue."""
    offsets = self.groups.offsets
    for r in self.admission.release_parked():
      gids = r.ids + offsets[r.group]
      self.assembler.begin(gids, r.start_version, forced=r.forced)
      with self.ctx.clock.stage("gen", lane="sampler"):
        acts, version = self.ctx.sampler.act(r.obs, pad=True)
      self.assembler.start(gids, r.obs, acts, version)
      self._late[r.group].put((r.ids, acts.env_action))

  # -- learner thread: update -------------------------------------------------

  def _learner_loop(self) -> None:
    self._pin("train")
    if self.pinning is not None:
      self.pinning.pin_xla()
    offset = self.ctx.layout.env_id_offset
    self._state = learner_loop(self.ctx, self._state, self.queue, self._stages,
                               lambda segments: stack_segments(segments, offset), self._published, self._take_forced)

  def _take_forced(self) -> int:
    """Segments force-started since the last report (the queue counts them all)."""
    forced = self.queue.forced
    new, self._forced_reported = forced - self._forced_reported, forced
    return new

  def _published(self, state) -> None:
    """New params are in the store: admit more segments and wake the sampler."""
    self.admission.published(int(state.version))
    self._ready.put(_WAKE)
