"""The loop threads of an asynchronous scheduler: started together, stopped together.

Why one place: both asynchronous schedulers (host env groups and device
groups) need the same guarantees, and they are easy to get subtly wrong. The
first exception in any stage stops every stage and is re-raised as the run's
error (never a hang); a stop (step budget, deadline, Ctrl-C) ends every thread
within 10 s, or, for a thread inside a long step such as a first compile, once
that step ends (bounded); a thread that still does not stop is reported by name.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ebrl.scheduler.context import RunContext, update_and_publish
from ebrl.types import TrainState

POLL_S = 0.05
_JOIN_S = 10.0  # A stage thread polls its stop flag at least this often, unless inside a step.
_STEP_JOIN_S = 300.0  # The longest a stop waits for a thread's current step (a first compile).


class LoopThreads:

  def __init__(self, log: Callable[[str], None] = print):
    self.stop = threading.Event()  # Stage loops poll it; setting it ends the run.
    self.errors: list[BaseException] = []
    self._log = log

  def run(self, stages: list[tuple[str, Callable, tuple]], on_stop: Callable[[], None] = lambda: None) -> None:
    """Runs `(name, fn, args)` stages until one stops the run; `on_stop` wakes blocked stages.

    A KeyboardInterrupt in the calling thread stops every stage the same way, waits for the
    steps they are in (an update, a first compile) and is then re-raised, so the caller can
    checkpoint a train state no update still holds.
    """
    threads = [threading.Thread(target=self._guard, args=(fn, *args), name=name, daemon=True)
               for name, fn, args in stages]
    for th in threads:
      th.start()
    interrupted = False
    try:
      while not self.stop.is_set():
        self.stop.wait(POLL_S)
    except KeyboardInterrupt:
      interrupted = True
    self.stop.set()
    on_stop()
    alive = self._join(threads)
    if self.errors:
      raise self.errors[0]
    if alive:
      raise RuntimeError(f"loop threads did not stop within {_JOIN_S + _STEP_JOIN_S:.0f} s: {alive}")
    if interrupted:
      raise KeyboardInterrupt

  def _join(self, threads: list[threading.Thread]) -> list[str]:
    """Joins every thread; one still inside a step gets up to _STEP_JOIN_S more. Returns those alive."""
    deadline = time.monotonic() + _JOIN_S
    for th in threads:
      th.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = [th for th in threads if th.is_alive()]
    if alive:
      self._log(f"waiting for {', '.join(th.name for th in alive)} to finish the step they are in "
                "(Ctrl-C again to exit at once)")
      deadline = time.monotonic() + _STEP_JOIN_S
      for th in alive:
        th.join(timeout=max(0.0, deadline - time.monotonic()))
    return [th.name for th in threads if th.is_alive()]

  def _guard(self, fn, *args) -> None:
    try:
      fn(*args)
    except BaseException as e:  # pylint: disable=broad-except  # Surfaced by run().
      self.errors.append(e)
    finally:
      self.stop.set()


def learner_loop(ctx: RunContext, state: TrainState, queue, stopping: Callable[[], bool],
                 assemble: Callable[[list], Any], on_publish: Callable[[TrainState], None]) -> TrainState:
  """The learner stage of both asynchronous schedulers: an update on every batch the queue
  releases; after each, the new params are published and `on_publish(state)` wakes waiting groups.
  Returns the last state."""
  while not stopping():
    ctx.learner.check_alive()  # A learner process that died ends the run (ebrl/learner_process.py).
    items = queue.get_batch(timeout=POLL_S)
    if items is None:
      continue
    state = update_and_publish(ctx, state, assemble(items), segments=True, lane="learner", on_publish=on_publish)
  return state
