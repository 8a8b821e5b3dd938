"""The driver loop: a scheduler's reports in, the recorder and the tuners fed, knobs back out.

Every run, benchmark and test drives its stages the same way:

  apply each tuner's initial knobs to the scheduler
  for each report the scheduler yields (one per update):
    the recorder records it        (state, metrics, checkpoints, progress)
    each tuner decides              (knobs or None; knobs go to the scheduler,
                                     what the tuner did to the recorder's timeline)
    the report is handed on         (a benchmark's window, a test's assertions)
    stop when the budget is spent or a stop was requested

Data flows one way: a scheduler never calls back into the run, and a tuner
never holds the scheduler. The driver is a generator, so its caller sees every
report after it was recorded and stops the run by not asking for more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Iterator, Protocol, Sequence

from ebrl.scheduler.context import Scheduler
from ebrl.tuning import Mark, Tuner, UpdateReport


class Recorder(Protocol):

  def record(self, report: UpdateReport) -> None:
    """Takes the update's state and writes what is due (metrics, checkpoint, progress)."""

  def mark(self, mark: Mark, t: float) -> None:
    """A tuner's action at time.time() `t`, for the timeline."""


@dataclasses.dataclass(frozen=True)
class Budget:
  """When a run stops: after `updates` updates (a learning scheduler: the count its learning-rate
  schedule decays over), or after `env_steps` env steps (one that does not learn), or at `stop`."""

  updates: int
  env_steps: int
  stop: threading.Event

  def spent(self, learns: bool, updates_done: int, env_steps: int) -> bool:
    if self.stop.is_set():
      return True
    return updates_done >= self.updates if learns else env_steps >= self.env_steps


def drive(scheduler: Scheduler, state, recorder: Recorder, tuners: Sequence[Tuner], budget: Budget,
          updates_done: int, env_steps: int) -> Iterator[UpdateReport]:
  """Runs `scheduler` from `state` (`updates_done` and `env_steps` into the run) until `budget` is
  spent; yields each report once recorded and tuned."""
  if budget.spent(scheduler.learns, updates_done, env_steps):
    return
  for tuner in tuners:
    scheduler.apply(tuner.initial())
  with contextlib.closing(scheduler.run(state)) as reports:
    for report in reports:
      recorder.record(report)
      for tuner in tuners:
        knobs = tuner.decide(report)
        if knobs is not None:
          scheduler.apply(knobs)
          for mark in knobs.marks:
            recorder.mark(mark, report.time)
      yield report
      if budget.spent(scheduler.learns, int(report.state.version), report.env_steps):
        return
