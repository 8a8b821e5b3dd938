"""The ebrl scheduler on a device simulator: env groups collect while the learner trains.

The envs are split into `ebrl.num_groups` groups, each its own SimState of
one DeviceSim (the compiled reset/step/collect are shared). Threads:

  group g (one per group) : reserves a segment start in the TrajectoryQueue,
                            takes the newest published (params, version), runs
                            the fused jitted collect of T steps for its group
                            (policy sample + sim step in one lax.scan, as the
                            sync device rollout) and queues the resulting
                            [T(+1), B_g] SegmentBatch, still on the device
  learner                 : takes segments_per_update env-segments (whole group
                            batches), runs Learner.update_segments (decoupled
                            PPO or V-trace, proximal values/log-probs from its
                            own params), publishes params with a new version

Rollout overlaps training: while the learner updates, every group keeps
collecting with the params it last saw. The queue counts group batches, so
AReaL's capacity rule (fewer than (eta + 1) * k batches started and not yet
consumed, k batches per update) is the env-segment rule scaled by the group
size; a group waits until the learner makes room. Batches are numbered when
their start is granted and handed to the learner in that order, which is also
the queue's earliest-deadline order, so batch n feeds update floor(n / k). It
was granted at a learner version V after updates 0 .. V - 1 consumed V * k
batches, so n < (eta + V + 1) * k; its params are read after the grant (the
learner publishes params before it raises the queue's version), so its
behaviour version is >= V and its lag floor(n / k) - V <= eta: the bound holds
by construction and nothing is masked. All groups step the same sim at the same batch size, so ordering costs
no straggler wait. With eta = 0 every batch comes from the params the update
starts from: exactly sync PPO on the same data (tests/schedulers/test_mjx_async.py).

Truncated episodes: the collect records gamma * V(final_obs) for a truncated
step (SegmentBatch.bootstrap, added to its scaled reward by the learner) and
marks it terminal (ebrl/scheduler/device_sync.py), here with the *behaviour* params. Carrying final_obs instead would add a
second [T, B] observation tensor to every batch and a new SegmentBatch field
for a value needed on one step in an episode. With eta = 0 the behaviour
params are the learner's, so the targets are sync PPO's exactly; with eta > 0
only truncation steps use a value at most eta versions old.

`ebrl.recv_batch`, `max_gen_batch` and `max_wait_ms` shape host env batches
and do not apply here. Any exception in a thread stops the run and is
re-raised by `run`; Ctrl-C or the step budget stops every thread within one
collect or update.
"""

from __future__ import annotations

import threading
from typing import Iterator

import chex
import jax
import jax.numpy as jnp

from ebrl.scheduler.context import Knobs, RunContext, Scheduler, UpdateReport
from ebrl.acting import Finished, device_unroll
from ebrl.scheduler.device_sync import add_finished_episodes, device_keys
from ebrl.scheduler.admission import Admission
from ebrl.scheduler.loop_threads import POLL_S, LoopThreads, learner_loop
from ebrl.trajectories.queue import TrajectoryQueue
from ebrl.types import SegmentBatch, TrainState
from policies.base import Policy
from sim_adapters.mjx.device_sim import DeviceSim, SimState


def make_segment_collect(sim: DeviceSim, policy: Policy, horizon: int, gamma: float):
  """Jitted (params, sim_state, key, version) -> (sim_state, SegmentBatch, Finished).

  The same scan as the sync device rollout; obs gets the bootstrap row (the state's obs after the
  last step) and values are left to the learner, which takes them from its own params.
  """
  scan, _ = device_unroll(sim, policy, horizon, gamma)

  def segments(params, state: SimState, key: jax.Array, version: jax.Array):
    state, rows = scan(params, state, key)
    obs = jax.tree.map(lambda r, last: jnp.concatenate([r, last[None]]), rows["obs"], state.obs)
    chex.assert_shape(jax.tree.leaves(obs)[0], (horizon + 1, sim.num_envs, ...))
    done = rows["done"]
    batch = SegmentBatch(obs=obs, actions=rows["actions"], logp=rows["logp"], rewards=rows["rewards"],
                         terminated=done, done=done, valid=jnp.ones_like(done),
                         version=jnp.full(done.shape, version, jnp.int32), bootstrap=rows["bootstrap"])
    return state, batch, rows["fin"]

  return jax.jit(segments, donate_argnums=(1,))


def concat_segment_batches(batches: list[SegmentBatch]) -> SegmentBatch:
  """Group batches side by side along the env axis (axis 1)."""
  if len(batches) == 1:
    return batches[0]
  return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1 if xs[0].ndim > 1 else 0), *batches)  # env_ids: [B].


class DeviceAsyncScheduler(Scheduler):
  """scheduler=ebrl on a DeviceSim: one collecting thread per env group, one learner thread."""

  # Training runs beside the rollout (only the staleness bound couples them), so the
  # rollout rate is the e2e rate.
  overlaps_training = True

  def __init__(self, ctx: RunContext):
    self.ctx = ctx
    self.sim: DeviceSim = ctx.device_sim
    self.num_groups = ctx.layout.num_groups
    per_group = ctx.layout.envs_per_group
    chex.assert_equal(self.sim.num_envs, per_group)
    segments = ctx.layout.segments_per_update
    if segments % per_group:  # ebrl/validation.py rejects this first; kept for direct construction.
      raise ValueError(f"ebrl.segments_per_update={segments} must be a multiple of the {per_group} envs per group")
    self.queue = TrajectoryQueue(segments // per_group, ctx.max_staleness)
    self.admission = Admission(self.queue, self.num_groups)  # Grants starts in ticket order.
    lc = ctx.learner.cfg
    self.collect = make_segment_collect(self.sim, ctx.policy, ctx.layout.rollout_length, lc.gamma)
    self.reset_key, self.key = device_keys(ctx.seed, ctx.env_seed)
    self._lock = threading.Lock()  # Guards the nan reset counts.
    self._order = threading.Lock()  # Guards the batches waiting for an earlier ticket.
    self._pending: dict[int, tuple[SegmentBatch, int]] = {}  # ticket -> (batch, start version)
    self._next = 0  # The ticket the learner gets next.
    self._compile = threading.Lock()  # The first collect compiles once, not once per group.
    # Group g's envs are the run's envs g * per_group ... (g + 1) * per_group - 1.
    self._env_ids = [jnp.arange(g * per_group, (g + 1) * per_group, dtype=jnp.int32) for g in range(self.num_groups)]
    self._nan_resets = [0] * self.num_groups
    self._stages = LoopThreads()
    self._stop = self._stages.stop

  # -- lifecycle --------------------------------------------------------------

  def apply(self, knobs: Knobs) -> None:
    """A tuner's knobs: admission (overlap or a barrier); generation batches are the groups'."""
    if knobs.admission is not None:
      self.admission.set_admission(knobs.admission)

  def run(self, state: TrainState) -> Iterator[UpdateReport]:
    """Yields a report per update until the caller stops taking them, ctx.stop is set or a
    thread fails (re-raised)."""
    self._state = state
    # A resumed run counts the segments of its earlier updates as started (see TrajectoryQueue).
    self.admission.resume_at(int(state.version))
    stages = [(f"group{g}", self._group_loop, (g,)) for g in range(self.num_groups)]
    stages.append(("learner", self._learner_loop, ()))
    yield from self._stages.run(stages, external_stop=self.ctx.stop, on_stop=self.admission.close)

  def _stopping(self) -> bool:
    return self._stop.is_set()

  # -- group threads: fused sim + generation ----------------------------------

  def _group_loop(self, g: int) -> None:
    clock, lane = self.ctx.clock, f"group{g}"
    with clock.stage("sim", lane=lane):
      state = self.sim.reset(jax.random.fold_in(self.reset_key, g))
      jax.block_until_ready(state)
    first = True
    while not self._stopping():
      start = self._reserve()
      if start is None:
        continue
      ticket, start_version, params, version, key = start
      with clock.stage("sim", lane=lane):
        if first:
          with self._compile:
            state, batch, finished = self.collect(params, state, key, jnp.int32(version))
            jax.block_until_ready(batch)
          first = False
        else:
          state, batch, finished = self.collect(params, state, key, jnp.int32(version))
        finished, nan_resets = jax.device_get((finished, state.nan_resets))
      self._account(g, finished, int(nan_resets))
      self._release(ticket, batch.replace(env_ids=self._env_ids[g]), start_version)

  def _reserve(self) -> tuple | None:
    """The next batch's (ticket, start version, params, version, key) under the capacity rule, or None
    after a short wait."""
    reserved = self.admission.reserve(POLL_S)
    if reserved is None:
      return None
    params, version = self.ctx.params.latest()  # Read after the grant: at least its start version.
    return (*reserved, params, version, jax.random.fold_in(self.key, self.ctx.sampler.take_call()))

  def _release(self, ticket: int, batch: SegmentBatch, start_version: int) -> None:
    """Queues batches for the learner in ticket order (see the module docstring)."""
    with self._order:
      self._pending[ticket] = (batch, start_version)
      while self._next in self._pending:
        self.queue.put(*self._pending.pop(self._next))
        self._next += 1

  def _account(self, g: int, finished: Finished, nan_resets: int) -> None:
    add_finished_episodes(self.ctx.tracker, finished)
    with self._lock:
      self._nan_resets[g] = nan_resets
      self.sim.nan_resets = sum(self._nan_resets)
    self.ctx.tracker.count_steps(self.sim.num_envs * self.ctx.layout.rollout_length)

  # -- learner thread: update -------------------------------------------------

  def _learner_loop(self) -> None:
    self._state = learner_loop(self.ctx, self._state, self.queue, self._stages, concat_segment_batches,
                               self._published)

  def _published(self, state) -> None:
    """New params are in the store: admit more batches and wake groups waiting for room."""
    self.admission.published(int(state.version))
