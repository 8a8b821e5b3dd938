"""The loop threads of an asynchronous scheduler: started together, stopped together, reporting
every update to the driver on the calling thread.

Why one place: both asynchronous schedulers (host env groups and device
groups) need the same guarantees, and they are easy to get subtly wrong. The
first exception in any stage stops every stage and is re-raised as the run's
error (never a hang); a stop (the driver's, a deadline, Ctrl-C) ends every
thread within 10 s, or, for a thread inside a long step such as a first
compile, once that step ends (bounded); a thread that still does not stop is
reported by name.

Reports: the learner thread hands each update's report to the calling thread
and waits until the driver has taken it (recorded, tuned) before it starts
the next update, so the state a report carries is never donated to an update
while the driver checkpoints it, and a knob the driver applies takes effect
before the next update. Rollout threads do not wait for the driver.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterator

from ebrl.scheduler.context import RunContext, UpdateReport, update_and_publish
from ebrl.types import TrainState

POLL_S = 0.05
_JOIN_S = 10.0  # A stage thread polls its stop flag at least this often, unless inside a step.
_STEP_JOIN_S = 300.0  # The longest a stop waits for a thread's current step (a first compile).


class LoopThreads:

  def __init__(self, log: Callable[[str], None] = print):
    self.stop = threading.Event()  # Stage loops poll it; setting it ends the run.
    self.errors: list[BaseException] = []
    self._log = log
    self._reports: queue.Queue = queue.Queue()  # (report, taken event), from the learner thread.

  def report(self, report: UpdateReport) -> None:
    """From the learner thread: hands `report` to the driver and waits until it was taken (or the
    run stops)."""
    taken = threading.Event()
    self._reports.put((report, taken))
    while not taken.wait(POLL_S) and not self.stop.is_set():
      pass

  def run(self, stages: list[tuple[str, Callable, tuple]], *, external_stop: threading.Event | None = None,
          on_stop: Callable[[], None] = lambda: None) -> Iterator[UpdateReport]:
    """Runs `(name, fn, args)` stages until one stops the run, `external_stop` is set or the caller
    closes the generator; yields each report in order. `on_stop` wakes blocked stages.

    Reports made while the run stops (an update that finished meanwhile) are still yielded, unless
    the caller closed the generator. A KeyboardInterrupt in the calling thread stops every stage
    the same way, waits for the steps they are in (an update, a first compile), yields what they
    reported and is then re-raised, so the caller can checkpoint a train state no update holds.
    """
    threads = [threading.Thread(target=self._guard, args=(fn, *args), name=name, daemon=True)
               for name, fn, args in stages]
    for th in threads:
      th.start()
    interrupted = False
    try:
      while not self.stop.is_set():
        if external_stop is not None and external_stop.is_set():
          break
        try:
          item, taken = self._reports.get(timeout=POLL_S)
        except queue.Empty:
          continue
        try:
          yield item
        except GeneratorExit:  # The driver stops here: no further update may start (every process
          self.stop.set()      # of a run over several stops after the same one).
          raise
        finally:
          taken.set()
    except KeyboardInterrupt:
      interrupted = True
    finally:  # Also when the caller closes the generator: its GeneratorExit then ends it here.
      self.stop.set()
      on_stop()
      alive = self._join(threads)
    while True:  # Updates that finished while the run stopped.
      try:
        item, taken = self._reports.get_nowait()
      except queue.Empty:
        break
      taken.set()
      yield item
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


def learner_loop(ctx: RunContext, state: TrainState, queue_, threads: LoopThreads,
                 assemble: Callable[[list], Any], on_publish: Callable[[TrainState], None],
                 force_started: Callable[[], int] = lambda: 0) -> TrainState:
  """The learner stage of both asynchronous schedulers: an update on every batch the queue
  releases; after each, the new params are published, `on_publish(state)` wakes waiting groups and
  the report goes to the driver (`force_started()`: segments forced since the last one). Returns
  the last state."""
  while not threads.stop.is_set():
    ctx.learner.check_alive()  # A learner process that died ends the run (ebrl/learner_process.py).
    items = queue_.get_batch(timeout=POLL_S)
    if items is None:
      continue
    report = update_and_publish(ctx, state, assemble(items), segments=True, lane="learner", on_publish=on_publish,
                                force_started=force_started())
    state = report.state
    threads.report(report)
  return state
