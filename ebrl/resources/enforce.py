"""Applies a plan's CPU quotas to the threads that do each stage's work.

Linux affinity is per thread (`sched_setaffinity(tid)`), and a new thread
inherits its creator's mask. So:
  - stage threads (env groups, sampler, learner) pin themselves when they start
    (`pin_stage`), and threads they create later (a multi-task env's receivers) inherit it;
  - EnvPool creates its worker threads in its constructor, in the caller's
    thread: building the simulators inside `adopt("sim")` records the threads
    that appeared, which are then pinned to the sim quota (EnvPool's own
    thread_affinity_offset pins one worker per core, used where the plan gives
    one pool a dedicated block);
  - XLA's CPU compute pool (threads named tf_XLAEigen*) serves both the sampler
    and the learner, so it gets the union of their quotas;
  - the render stage's thread is created with the simulators (inside
    adopt("sim")) and moved to its own quota (`assign`); Mesa's rasterizer
    threads (llvmpipe-*), started by its first draw, inherit that quota and are
    recorded by name (`pin_named`).
A re-plan re-pins every recorded thread at once. Every pin is read back, and
`readback()` reports what the kernel really applied.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

from ebrl.resources.plan import Plan

XLA_THREAD_PREFIX = "tf_XLAEigen"
MESA_THREAD_PREFIX = "llvmpipe"


def parse_cores(text: str, usable: tuple[int, ...]) -> tuple[int, ...]:
  """'0-3,6' -> (0, 1, 2, 3, 6); ValueError naming the cores that are not usable here."""
  cores: set[int] = set()
  for part in str(text).replace(" ", "").split(","):
    if not part:
      continue
    try:
      lo, _, hi = part.partition("-")
      a, b = int(lo), int(hi) if hi else int(lo)
    except ValueError:
      raise ValueError(f"'{text}' is not a core list; write it like '0-3,6'") from None
    if b < a:
      raise ValueError(f"'{text}' has an empty range '{part}'")
    cores.update(range(a, b + 1))
  if not cores:
    raise ValueError(f"'{text}' names no cores")
  bad = sorted(cores - set(usable))
  if bad:
    raise ValueError(f"'{text}' names cores {bad} that this process cannot use; usable: {format_cores(usable)}")
  return tuple(sorted(cores))


def format_cores(cores) -> str:
  """(0, 1, 2, 5) -> '0-2,5'."""
  cores = sorted(cores)
  out, i = [], 0
  while i < len(cores):
    j = i
    while j + 1 < len(cores) and cores[j + 1] == cores[j] + 1:
      j += 1
    out.append(str(cores[i]) if i == j else f"{cores[i]}-{cores[j]}")
    i = j + 1
  return ",".join(out)


def thread_ids() -> set[int]:
  return {int(t) for t in os.listdir("/proc/self/task")}


def thread_name(tid: int) -> str:
  try:
    with open(f"/proc/self/task/{tid}/comm") as f:
      return f.read().strip()
  except OSError:
    return ""


def pin(tid: int, cores: tuple[int, ...]) -> tuple[int, ...]:
  """Pins one thread (0 = the calling one); returns the mask the kernel reports back."""
  os.sched_setaffinity(tid, cores)
  return tuple(sorted(os.sched_getaffinity(tid)))


class Enforcer:
  """Keeps which threads do which stage, and pins them to the current plan's quotas."""

  def __init__(self, plan: Plan):
    self.plan = plan
    self._lock = threading.Lock()
    self._threads: dict[str, set[int]] = {}  # Stage -> native thread ids.

  def _cores(self, stage: str) -> tuple[int, ...]:
    if stage == "xla":
      return tuple(sorted(set(self.plan.cpu_sets["gen"]) | set(self.plan.cpu_sets["train"])))
    return self.plan.cpu_sets[stage]

  def _record(self, stage: str, tid: int) -> None:
    with self._lock:
      self._threads.setdefault(stage, set()).add(tid)

  def pin_stage(self, stage: str) -> tuple[int, ...]:
    """Called by a stage's thread as it starts: pins itself (and what it will create)."""
    tid = threading.get_native_id()
    self._record(stage, tid)
    return pin(0, self._cores(stage))

  @contextlib.contextmanager
  def adopt(self, stage: str) -> Iterator[None]:
    """Threads created inside the block (EnvPool's workers) belong to `stage` and are pinned."""
    before = thread_ids()
    yield
    for tid in thread_ids() - before:
      self._record(stage, tid)
      with contextlib.suppress(OSError):  # A thread that already ended.
        pin(tid, self._cores(stage))

  def assign(self, stage: str, tids) -> None:
    """These threads do `stage`'s work (whatever they were recorded as before) and are pinned."""
    tids = set(tids)
    with self._lock:
      for owned in self._threads.values():
        owned -= tids
    for tid in tids:
      self._record(stage, tid)
      with contextlib.suppress(OSError):  # A thread that already ended.
        pin(tid, self._cores(stage))

  def pin_named(self, stage: str, prefix: str) -> int:
    """Assigns every thread whose name starts with `prefix` to `stage`; returns how many."""
    found = [t for t in thread_ids() if thread_name(t).startswith(prefix)]
    self.assign(stage, found)
    return len(found)

  def pin_xla(self) -> int:
    """Pins XLA's CPU compute threads to gen + train; returns how many were found."""
    return self.pin_named("xla", XLA_THREAD_PREFIX)

  def apply(self, plan: Plan) -> None:
    """A new plan: every recorded thread moves to its stage's new quota at once."""
    with self._lock:
      self.plan = plan
      threads = {s: set(t) for s, t in self._threads.items()}
    for stage, tids in threads.items():
      for tid in tids:
        with contextlib.suppress(OSError):
          pin(tid, self._cores(stage))

  def readback(self) -> dict[str, dict[int, tuple[int, ...]]]:
    """What the kernel applied: stage -> {tid: mask} for every recorded live thread."""
    out: dict[str, dict[int, tuple[int, ...]]] = {}
    with self._lock:
      threads = {s: set(t) for s, t in self._threads.items()}
    for stage, tids in threads.items():
      for tid in tids:
        with contextlib.suppress(OSError):
          out.setdefault(stage, {})[tid] = tuple(sorted(os.sched_getaffinity(tid)))
    return out

  def summary(self) -> dict[str, str]:
    """Stage -> 'N threads on cores 0-1' as applied (for metrics and the start-up line)."""
    out = {}
    for stage, masks in self.readback().items():
      cores = sorted(set().union(*masks.values())) if masks else []
      out[stage] = f"{len(masks)} threads on cores {format_cores(cores)}"
    return out
