"""The learner in a process of its own: segment batches in through shared memory, the state back.

Why a process: on one GPU, XLA runs one process's computations on one compute
stream, so a learner thread and a sampler thread hardly overlap their GPU
work; as separate processes each can hold an MPS SM share
(`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, set in `env` before the child's CUDA
starts). On CPUs the child has XLA thread pools of its own, pinned to the
learner's cores (`cores`), and the update's host work leaves the generation
process's GIL.

`RemoteLearner` keeps the in-process Learner's contract, so every scheduler
drives it unchanged: `update_segments(state, batch) -> (state, metrics)`,
one batch in flight, as the learner thread already takes one after another,
so the staleness bound and both corrections are untouched.

  parent (scheduler's learner thread)            child (spawned, never forked)
  a new state?  -> state slot (versioned)         attach ring and slot, build the Learner
  batch -> SegmentRing slot (one copy) ───────►   ring.get: update_segments (state read from the slot
                                                  when flagged), state -> slot, slot back to the ring
  ("updated", version, metrics) over a pipe ◄───  conn.send
  state slot.read -> TrainState on this side

Only slot indices and small messages (metrics, "stop", new cores) cross the
pipe: no segment and no param is pickled. The child ignores SIGINT and
SIGTERM (Ctrl-C, `timeout`, scancel and preemption signal the whole process
group; the parent stops the run after the current update and then the
child), exits on its own once its parent is gone, and the parent checks the
child between all waits (`check_alive`), so a dead learner ends the run
within a second with an error naming it. The ring and the state slot take
/dev/shm space, checked and reserved before the child starts
(`shared_memory_bytes`; a one-line ShmSpaceError when it does not fit).
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import sys
import time
import traceback
import weakref
from typing import Any

import jax
import numpy as np

from ebrl import spawn
from ebrl.errors import StageProcessError  # pylint: disable=unused-import  # Raised here; callers import it from here too.
from ebrl.learner import Learner, LearnerConfig, make_mesh
from ebrl.transport import shm
from ebrl.transport.param_slot import ParamSlot
from ebrl.transport.segment_ring import SegmentRing
from ebrl.types import SegmentBatch, TrainState
from sim_adapters.base import EnvSpec

SPAWN = spawn.SPAWN
_POLL_S = 0.2
_STOP_S = 10.0  # How long a stopped child may take to exit before it is killed.


@dataclasses.dataclass(frozen=True)
class LearnerProcessSpec:
  """What the child needs to build the same learner (picklable)."""
  policy_name: str
  policy_cfg: Any  # The config's `policy` ConfigDict.
  env_spec: EnvSpec
  learner_cfg: LearnerConfig
  rollout_length: int
  segments_per_update: int
  action_size: int
  train_devices: tuple[int, ...] = (0,)  # Local device indices of the learner's mesh.
  cores: tuple[int, ...] = ()  # CPU affinity of the whole child (its XLA pools too); () = inherited.
  env: tuple[tuple[str, str], ...] = ()  # Set before JAX starts there: MPS share, memory fraction.
  unset_env: tuple[str, ...] = ()  # Inherited variables removed there before JAX starts (see gpu_sharing).
  priority: str = "normal"  # "idle": SCHED_IDLE for every thread of the child (see `resolve_priority`).
  # Fault injection (tests, soak runs): a uniform random sleep in [lo, hi] s before each update.
  delay_s: tuple[float, float] = (0.0, 0.0)


def resolve_priority(requested: str, platform: str) -> str:
  """The learner process's CPU priority: `requested` ("normal" / "idle"), or for "auto" idle where
  the learner computes on the CPU (`platform`, JAX's backend) and normal on an accelerator.

  Why idle on CPUs: the rollout is a chain (simulate, then generate, then simulate) whose gaps
  leave cores free, while the learner is bulk work that only has to keep within the staleness
  bound. At equal priority the learner's XLA threads take their share of the cores from the
  chain and stretch it; under SCHED_IDLE they run only on cycles the chain leaves, and once the
  learner falls eta versions behind the rollout waits for it, its cores fall idle and the learner
  gets them: work-conserving, and never worse than the barrier sync puts there. On an
  accelerator the child's host thread launches kernels; delayed behind a busy simulator, it
  would leave the GPU idle, so it stays normal there.
  """
  if requested != "auto":
    return requested
  return "idle" if platform == "cpu" else "normal"


def segment_fields(spec: EnvSpec, horizon: int, batch: int, action_size: int) -> dict[str, tuple[tuple, Any]]:
  """The ring slot's arrays for one update's SegmentBatch ([T(+1), B, ...], as `stack_segments`)."""
  t, b = horizon, batch
  fields = {f"obs/{k}": ((t + 1, b) + tuple(v.shape), v.dtype) for k, v in spec.obs.items()}
  fields.update(actions=((t, b, action_size), np.float32), logp=((t, b), np.float32),
                rewards=((t, b), np.float32), terminated=((t, b), np.bool_), done=((t, b), np.bool_),
                valid=((t, b), np.bool_), version=((t, b), np.int32), discount=((t, b), np.float32),
                env_ids=((b,), np.int32))
  return fields


def _batch_arrays(batch: SegmentBatch) -> dict[str, np.ndarray]:
  out = {f"obs/{k}": v for k, v in batch.obs.items()}
  out.update(actions=batch.actions, logp=batch.logp, rewards=batch.rewards, terminated=batch.terminated,
             done=batch.done, valid=batch.valid, version=batch.version)
  if batch.discount is not None:
    out["discount"] = batch.discount
  if batch.env_ids is not None:
    out["env_ids"] = batch.env_ids
  return out


def _batch_from(arrays: dict[str, np.ndarray], has_discount: bool, has_env_ids: bool) -> SegmentBatch:
  obs = {k[len("obs/"):]: v for k, v in arrays.items() if k.startswith("obs/")}
  return SegmentBatch(obs=obs, actions=arrays["actions"], logp=arrays["logp"], rewards=arrays["rewards"],
                      terminated=arrays["terminated"], done=arrays["done"], valid=arrays["valid"],
                      version=arrays["version"], discount=arrays["discount"] if has_discount else None,
                      env_ids=arrays["env_ids"] if has_env_ids else None)


def _state_leaves(state: TrainState) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state))]


def _state_template(local: Learner) -> list[np.ndarray]:
  return [np.zeros(x.shape, x.dtype) for x in jax.tree.leaves(jax.eval_shape(local.init, jax.random.PRNGKey(0)))]


def shared_memory_bytes(local: Learner, spec: LearnerProcessSpec) -> int:
  """/dev/shm a learner process takes: its state slot and its one-slot segment ring (no compile)."""
  fields = segment_fields(spec.env_spec, spec.rollout_length, spec.segments_per_update, spec.action_size)
  return ParamSlot.nbytes(_state_template(local)) + SegmentRing.nbytes(fields, slots=1)


class RemoteLearner:
  """The Learner's interface, with `update_segments` run by a spawned learner process.

  `local` is this process's Learner over the same policy and config: it makes the initial state
  (`init`), the state's tree structure and its placement here (checkpoints, the param store).
  """

  def __init__(self, local: Learner, spec: LearnerProcessSpec):
    self.local, self.spec = local, spec
    self.policy, self.cfg, self.mesh = local.policy, local.cfg, local.mesh
    self._treedef = jax.tree.structure(jax.eval_shape(local.init, jax.random.PRNGKey(0)))
    shm.check_space(shared_memory_bytes(local, spec), "the learner process (placement=processes)")
    self._slot = ParamSlot.create(_state_template(local))
    self._ring = None
    self._closed = False
    try:
      fields = segment_fields(spec.env_spec, spec.rollout_length, spec.segments_per_update, spec.action_size)
      self._ring = SegmentRing.create(fields, slots=1, mp_context=SPAWN)
      self._start_child()
    except BaseException:
      self._release_memory()
      raise

  def _start_child(self) -> None:
    """A child over this learner's ring and state slot, with `self.spec` (its env, cores, priority)."""
    self._conn, child_conn = SPAWN.Pipe()
    self._proc = SPAWN.Process(target=child_main, name="ebrl-learner",
                               args=(self.spec, self._ring, self._slot.spec, child_conn, os.getpid()), daemon=True)
    with spawn.main_module_hidden():
      self._proc.start()
    child_conn.close()
    self.pid = self._proc.pid
    self.child_env: dict[str, str | None] = {}  # The child's values of `spec.env` / `unset_env` once ready.
    self._last: TrainState | None = None  # The state the child holds (the last one returned).
    self._finalizer = weakref.finalize(self, RemoteLearner._cleanup, self._proc, self._conn, self._ring, self._slot)

  # -- the Learner interface ---------------------------------------------------------------

  def init(self, key: jax.Array) -> TrainState:
    return self.local.init(key)

  def update(self, state, rollout):
    raise NotImplementedError("the learner process runs segment updates (scheduler=ebrl) only")

  def update_segments(self, state: TrainState, batch: SegmentBatch) -> tuple[TrainState, dict]:
    """One update in the child: `state` is sent along unless it is the one the child already
    holds (the last returned); the new state comes back placed as the local learner's."""
    self.check_alive()
    fresh = state is not self._last
    if fresh:
      self._slot.write(_state_leaves(state), int(jax.device_get(state.version)))
    arrays = _batch_arrays(jax.device_get(batch))
    meta = (batch.discount is not None, fresh, batch.env_ids is not None)
    while not self._ring.put(arrays, meta=meta, timeout=_POLL_S):
      self.check_alive()
    metrics = self._reply("updated")
    got = self._slot.read()
    if got is None:
      raise StageProcessError(f"learner process (pid {self.pid}) reported an update but published no state")
    leaves, _ = got
    new_state = jax.device_put(jax.tree.unflatten(self._treedef, leaves), self.local.replicated)
    self._last = new_state
    return new_state, metrics

  def check_alive(self) -> None:
    """Raises StageProcessError if the child died or reported an error (the run's watchdog)."""
    if self._closed:
      raise StageProcessError("the learner process was closed")
    while self._conn.poll(0):
      self._handle(self._recv())
    if not self._proc.is_alive():
      raise StageProcessError(f"learner process (pid {self.pid}) {_how_it_ended(self._proc.exitcode)}; "
                              "the run stops")

  def set_cores(self, cores: tuple[int, ...]) -> None:
    """A re-plan's CPU quota for the learner: every thread of the child moves to it."""
    if not self._closed and self._proc.is_alive():
      self._conn.send(("cores", tuple(int(c) for c in cores)))

  def respawn(self, **changes) -> None:
    """A new child with the spec's `changes` (env, cores): an MPS share takes effect only when a
    process creates its CUDA context, so a new share needs a new process. Call it between updates,
    as the learner thread does after one: nothing is in the ring then, and the next update hands
    the new child its state (it holds none), so training goes on from the same state and version."""
    self.check_alive()
    self._finalizer.detach()
    try:
      RemoteLearner._cleanup(self._proc, self._conn, ring=None, slot=None)  # Stop, join; the memory stays.
      self.spec = dataclasses.replace(self.spec, **changes)
      self._start_child()
    except BaseException:  # No child holds the ring and the slot now: nothing else would remove them.
      self._release_memory()
      raise

  def close(self) -> None:
    """Stops the child (killed if it does not exit within 10 s) and removes the shared memory."""
    if self._closed:
      return
    self._closed = True
    self._finalizer()

  # -- internals -----------------------------------------------------------------------------

  def _release_memory(self) -> None:
    """Removes the ring and the state slot when no child (and no finalizer) owns them."""
    self._closed = True
    try:
      if self._ring is not None:
        self._ring.close()
    finally:
      self._slot.close()

  def _recv(self):
    try:
      return self._conn.recv()
    except (EOFError, OSError):
      self._proc.join(timeout=_STOP_S)
      raise StageProcessError(f"learner process (pid {self.pid}) "
                              f"{_how_it_ended(self._proc.exitcode)}; the run stops") from None

  def _handle(self, msg) -> Any:
    kind = msg[0]
    if kind == "error":
      raise StageProcessError(f"learner process (pid {self.pid}) failed: {msg[1]}")
    if kind == "ready":
      self.child_env = dict(msg[1])
    return msg

  def _reply(self, kind: str) -> Any:
    while True:
      if self._conn.poll(_POLL_S):
        msg = self._handle(self._recv())
        if msg[0] == kind:
          return msg[1]
      elif not self._proc.is_alive():
        self.check_alive()

  @staticmethod
  def _cleanup(proc, conn, ring, slot) -> None:
    try:
      if proc.is_alive():
        try:
          conn.send(("stop",))
        except (OSError, ValueError):
          pass
        proc.join(timeout=_STOP_S)
      if proc.is_alive():
        proc.kill()
        proc.join(timeout=_STOP_S)
    finally:
      conn.close()
      if ring is not None:  # A respawn keeps the ring and the slot for the next child.
        ring.close()
      if slot is not None:
        slot.close()


def _how_it_ended(code: int | None) -> str:
  if code is None:
    return "stopped answering"
  if code < 0:
    return f"was killed by {signal.Signals(-code).name}"
  return f"exited with code {code}"


# -- the child --------------------------------------------------------------------------------


def child_main(spec: LearnerProcessSpec, ring: SegmentRing, slot_spec, conn, parent_pid: int) -> None:
  """The learner process: builds its learner, then one update per batch until told to stop."""
  spawn.ignore_group_signals()  # The parent stops this process; see the module's docstring.
  for key in spec.unset_env:  # Before JAX starts its backend here.
    os.environ.pop(key, None)
  os.environ.update(dict(spec.env))
  if spec.priority == "idle":  # Before XLA's pools start: threads inherit their creator's policy.
    _on_all_threads(lambda tid: os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0)))
  if spec.cores:
    os.sched_setaffinity(0, spec.cores)  # Every thread started from now on (XLA's pools) inherits it.
  slot = None
  try:
    from ebrl import runtime  # pylint: disable=g-import-not-at-top
    from policies import make_policy  # pylint: disable=g-import-not-at-top

    runtime.enable_compilation_cache()
    policy = make_policy(spec.policy_name, spec.env_spec, spec.policy_cfg)
    local = jax.local_devices()
    learner = Learner(policy, spec.learner_cfg, mesh=make_mesh([local[i] for i in spec.train_devices]))
    treedef = jax.tree.structure(jax.eval_shape(learner.init, jax.random.PRNGKey(0)))
    slot = ParamSlot.attach(slot_spec)
    # What the child's JAX sees of what was set and removed (None: absent).
    conn.send(("ready", tuple((k, os.environ.get(k)) for k in [*(k for k, _ in spec.env), *spec.unset_env])))
    _serve(spec, learner, treedef, ring, slot, conn, parent_pid)
  except BaseException as e:  # pylint: disable=broad-except  # Reported to the parent, then exit 1.
    traceback.print_exc(file=sys.stderr)
    try:
      conn.send(("error", f"{type(e).__name__}: {e}"))
    except (OSError, ValueError):
      pass
    sys.exit(1)
  finally:
    if slot is not None:
      slot.close()
    ring.close()
    conn.close()


def _serve(spec, learner: Learner, treedef, ring: SegmentRing, slot: ParamSlot, conn, parent_pid: int) -> None:
  rng = random.Random(os.getpid())
  state = None
  while True:
    if os.getppid() != parent_pid:
      return  # The parent is gone: nobody will read what this process makes.
    while conn.poll(0):
      msg = conn.recv()
      if msg[0] == "stop":
        return
      if msg[0] == "cores":
        _on_all_threads(lambda tid, cores=msg[1]: os.sched_setaffinity(tid, cores))
    item = ring.get(timeout=_POLL_S)
    if item is None:
      continue
    index, (has_discount, fresh, has_env_ids) = item
    if fresh or state is None:
      leaves, _ = slot.read()
      state = jax.device_put(jax.tree.unflatten(treedef, leaves), learner.replicated)
    lo, hi = spec.delay_s
    if hi > 0:
      time.sleep(rng.uniform(lo, hi))
    batch = _batch_from(ring.arrays(index), bool(has_discount), bool(has_env_ids))
    state, metrics = learner.update_segments(state, batch)
    jax.block_until_ready(state)
    ring.release_slot(index)  # The update has read the batch (on a CPU it may have aliased the slot).
    slot.write(_state_leaves(state), int(jax.device_get(state.version)))
    conn.send(("updated", {k: np.asarray(v) for k, v in jax.device_get(metrics).items()}))


def _on_all_threads(apply) -> None:
  """`apply(tid)` for every thread of this process (some exist before child_main runs: imports
  start them), skipping threads that ended meanwhile."""
  for tid in os.listdir("/proc/self/task"):
    try:
      apply(int(tid))
    except OSError:
      pass
