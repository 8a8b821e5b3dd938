"""One GPU shared by stage processes: MPS started before this process's CUDA, or one line saying why not.

Why before JAX: MPS reads CUDA_MPS_PIPE_DIRECTORY when a process creates its
CUDA context. A process whose context already exists is no MPS client, and its
kernels time-slice with the MPS server's instead of sharing the SMs. So the
entry points call `begin` before anything starts JAX's backend: this process
(the host envs and generation) becomes an MPS client with every SM, and the
learner process, spawned once the plan is known, gets the plan's SM share
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and memory fraction (`learner_env`).
Generation keeps every SM because it is on the rollout's critical path; the
learner is capped so that its long kernels cannot crowd generation out.

Both processes preallocate GPU memory, so this process's fraction is set here
too (unless the user set one, under either of jaxlib's names): XLA's default
would take 75% of the GPU before the learner process starts. The learner
process inherits this process's environment; `learner_env` says what to set
there and what to remove (an inherited allocator or fraction variable).

`begin` runs after the config is checked and before JAX's backend starts. It
decides per run (a notebook's next run with other settings decides again);
only the daemon is kept for the process's life, because a process whose CUDA
context was made under MPS needs it until it exits. A run that fails before
JAX's backend started gives it back (`abandon`): the daemon stops and the
variables `begin` set are restored.

The daemon is private (its pipes in a fresh temporary directory; see mps.py),
stopped at exit, and nothing here changes the GPU's compute mode.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, Callable, Mapping, MutableMapping

from ebrl.resources import inventory as inventory_lib
from ebrl.resources import mps

if TYPE_CHECKING:
  from ebrl.spec import RunSpec

GEN_MEM_FRACTION = 0.4  # This process's share of GPU memory with a learner process beside it.
LEARNER_MEM_FRACTION = 0.5


@dataclasses.dataclass
class GpuSharing:
  mode: str  # "mps" (daemon running, this process a client), "time-share" (no SM shares) or "off".
  note: str  # The one line a run prints about it ("" when off).
  daemon: Any = None

  def learner_env(self, sm_percent: int, mem_fraction: float = LEARNER_MEM_FRACTION,
                  environ: Mapping[str, str] | None = None) -> dict[str, tuple]:
    """The learner process's environment under MPS, as LearnerProcessSpec fields: `env` (its SM share
    and memory cap) and `unset_env` (inherited variables that would defeat them; `environ`, default
    os.environ, is what the child inherits). Without MPS: nothing to change."""
    if self.mode != "mps":
      return {"env": (), "unset_env": ()}
    base = dict(os.environ if environ is None else environ)
    changed, removed = mps.env_change(mps.stage_env(sm_percent, mem_fraction, self.daemon.pipe_dir, base=base), base)
    return {"env": tuple(sorted(changed.items())), "unset_env": removed}

  def close(self) -> None:
    if self.daemon is not None:
      self.daemon.stop()


_current: GpuSharing | None = None  # The latest run's decision.
_mps: GpuSharing | None = None  # The daemon this process started, kept until exit (see the docstring).
_restore: dict[str, str | None] = {}  # What `begin` changed in the environment: variable -> value before.


def current() -> GpuSharing | None:
  """What `begin` decided for the latest run in this process, or None if it never ran."""
  return _current


def wanted(run: RunSpec) -> bool:
  """Whether this run puts its learner in a process of its own, so MPS would serve it.

  Only placement=processes: with auto the plan is made after JAX has started, and starting MPS
  for a run that may keep one process would cap its memory at GEN_MEM_FRACTION for nothing.
  """
  return run.async_ is not None and run.learner_placement == "processes" and not run.device_env


def _jax_backend_started() -> bool:
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    return bool(xla_bridge.backends_are_initialized())
  except (ImportError, AttributeError):
    return False


def begin(run: RunSpec, status: Callable[[], tuple] | None = None, daemon_factory: Callable[[], Any] | None = None,
          environ: MutableMapping[str, str] = os.environ, backend_started: Callable[[], bool] = _jax_backend_started
          ) -> GpuSharing:
  """For one run, after its config is checked and before JAX's backend starts: an MPS daemon where
  a GPU allows one (the one already running, if an earlier run started it).

  `status()` returns (gpus, MpsStatus) (default: pynvml and PATH, without JAX).
  """
  global _current, _mps
  if not wanted(run):
    _current = GpuSharing("off", "")
    return _current
  if _mps is not None:
    _current = _mps
    return _current
  gpus, mps_status = (status or _status)()
  if not gpus:
    _current = GpuSharing("time-share", "[placement] no NVIDIA GPU: stage processes time-share the CPU cores "
                          "(no SM shares)")
  elif not mps_status.can_start:
    _current = GpuSharing("time-share", f"[placement] MPS cannot start ({mps_status.reason}): stage processes "
                          "time-share the GPU")
  elif backend_started():
    _current = GpuSharing("time-share", "[placement] JAX's backend started before MPS could: stage processes "
                          "time-share the GPU (start the run in a fresh process for SM shares)")
  else:
    try:
      daemon = (daemon_factory or mps.MpsDaemon)().start()
    except (RuntimeError, OSError) as e:
      _current = GpuSharing("time-share", f"[placement] MPS did not start ({e}): stage processes time-share the GPU")
    else:
      changes = {"CUDA_MPS_PIPE_DIRECTORY": daemon.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": daemon.log_dir}
      if not any(environ.get(k) for k in mps.MEM_FRACTION_VARS):  # The user's fraction, under either name, wins.
        changes["XLA_CLIENT_MEM_FRACTION"] = str(GEN_MEM_FRACTION)
      _restore.clear()
      for key, value in changes.items():
        _restore[key] = environ.get(key)
        environ[key] = value
      _mps = _current = GpuSharing("mps", f"[placement] MPS daemon started (pipes in {daemon.pipe_dir}): "
                                   "generation keeps every SM, the learner process gets its share", daemon)
  return _current


def abandon(environ: MutableMapping[str, str] = os.environ,
            backend_started: Callable[[], bool] = _jax_backend_started) -> None:
  """After a run failed: the daemon `begin` started stops and its variables are restored, unless
  JAX's backend has started meanwhile (this process is then the daemon's client until it exits)."""
  global _mps, _current
  if _mps is None or backend_started():
    return
  _mps.close()
  for key, value in _restore.items():
    if value is None:
      environ.pop(key, None)
    else:
      environ[key] = value
  _restore.clear()
  _mps = _current = None


def _status() -> tuple:
  gpus, error = inventory_lib.gpus()
  return gpus, inventory_lib.mps_status(gpus, error)


def learner_sm_percent(requested: int, gen_s_per_step: float, train_s_per_step: float) -> int:
  """The learner's SM share: `requested` if set (1-100), else its part of the two stages' GPU time
  per env step, in steps of 5 within [10, 90] (time at full share: a stage's rate scales with SMs)."""
  if requested:
    return int(requested)
  total = gen_s_per_step + train_s_per_step
  if total <= 0:
    return 50
  share = 100.0 * train_s_per_step / total
  return int(min(90, max(10, 5 * round(share / 5))))
