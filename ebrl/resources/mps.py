"""NVIDIA MPS: splitting one GPU's SMs between stage processes.

MPS limits are per process (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is read when a
process creates its CUDA context), so a plan that splits a GPU by SM share runs
its stages as processes, each started with the environment `stage_env` builds.

`MpsDaemon` runs a private control daemon whose pipe and log directories live in
a fresh temporary directory, so it never talks to, or disturbs, a system-wide
daemon's /tmp/nvidia-mps pipes. Nothing here changes the GPU compute mode (it
never runs `nvidia-smi -c`, nor nvidia-smi at all): MPS works in the default
compute mode, and the compute mode belongs to the machine's administrator.
"""

from __future__ import annotations

import atexit
import math
import numbers
import os
import shutil
import subprocess
import tempfile
from typing import Callable, Mapping

CONTROL = "nvidia-cuda-mps-control"
QUIT = "quit\n"  # What stop_command() reads on stdin: the control daemon's shutdown command.
_TOLERANCE = 1e-9  # Float rounding in a sum of fractions that is meant to be exactly 1.


def daemon_env(pipe_dir: str, log_dir: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
  """The control daemon's environment: its pipes and logs go to the given directories."""
  env = dict(os.environ if base is None else base)
  env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
  env["CUDA_MPS_LOG_DIRECTORY"] = log_dir
  return env


def start_command(binary: str = CONTROL) -> list[str]:
  """Starts the control daemon in the background (it forks and the command returns)."""
  return [binary, "-d"]


def stop_command(binary: str = CONTROL) -> list[str]:
  """Stops the control daemon: run it with QUIT ("quit\\n") on stdin and the daemon's env.

  The control binary without arguments is an interactive client of the daemon
  named by CUDA_MPS_PIPE_DIRECTORY; "quit" shuts that daemon and its servers down.
  """
  return [binary]


def _check_sm(sm_percent) -> None:
  if isinstance(sm_percent, bool) or not isinstance(sm_percent, numbers.Integral) or not 1 <= sm_percent <= 100:
    raise ValueError(f"sm_percent={sm_percent!r} must be an integer in [1, 100]")


def _check_mem(mem_fraction) -> None:
  ok = (isinstance(mem_fraction, numbers.Real) and not isinstance(mem_fraction, bool)
        and not math.isnan(mem_fraction) and 0 < mem_fraction <= 1)
  if not ok:
    raise ValueError(f"mem_fraction={mem_fraction!r} must be a number in (0, 1]")


MEM_FRACTION_VARS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")  # jaxlib's name, then the old one.


def stage_env(sm_percent: int, mem_fraction: float, pipe_dir: str | None, base: Mapping[str, str] | None = None,
              visible_devices: tuple[int, ...] | None = None) -> dict[str, str]:
  """A stage process's environment: its SM share, and a hard cap on its GPU memory.

  Preallocation stays on, so XLA reserves the fraction at start-up and never grows
  past it: a stage that needs more fails alone instead of starving its neighbours.
  The fraction goes in XLA_CLIENT_MEM_FRACTION, jaxlib's current name; the
  deprecated XLA_PYTHON_CLIENT_MEM_FRACTION is dropped (jaxlib refuses to start
  with both set), and so is an inherited XLA_PYTHON_CLIENT_ALLOCATOR (the
  platform allocator ignores the fraction).
  """
  _check_sm(sm_percent)
  _check_mem(mem_fraction)
  env = dict(os.environ if base is None else base)
  for key in ("XLA_PYTHON_CLIENT_ALLOCATOR", *MEM_FRACTION_VARS):
    env.pop(key, None)
  env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(int(sm_percent))
  env["XLA_CLIENT_MEM_FRACTION"] = str(float(mem_fraction))
  env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true"
  if pipe_dir is not None:
    env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
  if visible_devices is not None:
    if not visible_devices or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in visible_devices):
      raise ValueError(f"visible_devices={visible_devices!r} must be a non-empty tuple of GPU indices >= 0")
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in visible_devices)
  return env


def env_change(env: Mapping[str, str], base: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
  """What turns `base` into `env`: (variables to set, variables to remove), for a process that
  inherits `base` (a spawned child inherits this process's environment)."""
  changed = {k: v for k, v in env.items() if base.get(k) != v}
  return changed, tuple(sorted(k for k in base if k not in env))


def check_split(sm_percent: Mapping[str, int], mem_fraction: Mapping[str, float]) -> None:
  """Checks the per-process shares of one GPU.

  Memory fractions must sum to at most 1: each process preallocates its fraction,
  so together they must fit. SM percentages may sum past 100: MPS allows
  over-subscription (each is a ceiling on one process, not a reservation), which
  lets a stage that is idle part of the time leave its SMs to the others.
  """
  for value in sm_percent.values():
    _check_sm(value)
  for value in mem_fraction.values():
    _check_mem(value)
  total = sum(mem_fraction.values())
  if total > 1.0 + _TOLERANCE:
    shares = ", ".join(f"{k}={v}" for k, v in mem_fraction.items())
    raise ValueError(f"memory fractions on one GPU sum to {total:.3g} > 1.0 ({shares})")


def _first_line(text: str | bytes | None) -> str:
  if isinstance(text, bytes):
    text = text.decode(errors="replace")
  return next((l.strip() for l in (text or "").splitlines() if l.strip()), "")


class MpsDaemon:
  """A private MPS control daemon for one run: `with MpsDaemon() as d: env = d.stage_env(50, 0.4)`.

  The daemon is stopped on `stop()`, on leaving the `with` block, and at
  interpreter exit, so a run that crashes does not leave it behind.
  """

  def __init__(self, binary: str = CONTROL, runner: Callable[..., subprocess.CompletedProcess] = subprocess.run,
               timeout_s: float = 30.0):
    self.binary, self.runner, self.timeout_s = binary, runner, timeout_s
    self._root: str | None = None  # The private directory while the daemon runs.
    self._binary_path = binary

  @property
  def pipe_dir(self) -> str:
    if self._root is None:
      raise RuntimeError("MPS daemon is not running; call start() first")
    return os.path.join(self._root, "pipe")

  @property
  def log_dir(self) -> str:
    if self._root is None:
      raise RuntimeError("MPS daemon is not running; call start() first")
    return os.path.join(self._root, "log")

  @property
  def running(self) -> bool:
    return self._root is not None

  def _env(self) -> dict[str, str]:
    return daemon_env(self.pipe_dir, self.log_dir)

  def start(self) -> "MpsDaemon":
    if self._root is not None:
      return self
    path = shutil.which(self.binary)
    if path is None:
      raise RuntimeError(f"cannot start MPS: {self.binary} not found")
    self._root = tempfile.mkdtemp(prefix="ebrl-mps-")
    os.mkdir(self.pipe_dir)
    os.mkdir(self.log_dir)
    try:
      proc = self.runner(start_command(path), env=self._env(), stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=self.timeout_s, check=False)
    except (OSError, subprocess.SubprocessError) as e:
      self._discard()
      raise RuntimeError(f"cannot start MPS: {_first_line(str(e)) or type(e).__name__}") from None
    if proc.returncode != 0:
      why = _first_line(proc.stderr) or _first_line(self._control_log()) or "no message"
      self._discard()
      raise RuntimeError(f"cannot start MPS: {self.binary} -d exited {proc.returncode}: {why}")
    self._binary_path = path
    atexit.register(self.stop)
    return self

  def _control_log(self) -> str:
    try:
      with open(os.path.join(self.log_dir, "control.log")) as f:
        return f.read()
    except OSError:
      return ""

  def _discard(self) -> None:
    if self._root is not None:
      shutil.rmtree(self._root, ignore_errors=True)
    self._root = None

  def stop(self) -> None:
    """Sends the daemon "quit" and waits for it; a no-op once stopped. Never raises: it also
    runs at interpreter exit, where there is nobody left to handle an error."""
    if self._root is None:
      return
    atexit.unregister(self.stop)
    try:
      self.runner(stop_command(self._binary_path), input=QUIT, env=self._env(), capture_output=True, text=True,
                  timeout=self.timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
      pass  # The daemon is gone already, or hung; its directory goes either way.
    self._discard()

  def stage_env(self, sm_percent: int, mem_fraction: float, base: Mapping[str, str] | None = None,
                visible_devices: tuple[int, ...] | None = None) -> dict[str, str]:
    """`stage_env` for a client of this daemon."""
    return stage_env(sm_percent, mem_fraction, self.pipe_dir, base=base, visible_devices=visible_devices)

  def __enter__(self) -> "MpsDaemon":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()
