"""What flows between a scheduler, the driver and the tuners: reports out, knobs in.

A scheduler yields an `UpdateReport` per update; the driver (ebrl/driver.py)
records it and gives it to each tuner, whose `decide` returns the `Knobs` to
change, or None. A tuner (the overlap probe, the resource controller) sees
only reports and returns only knobs: it holds no reference to the scheduler,
and nothing registers a callback anywhere. This module sits low in the import
graph so that both the schedulers and the resource tuners can speak it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True)
class UpdateReport:
  """One update, as its scheduler saw it when the new params were published."""

  state: Any  # The TrainState the update made (the driver's until the next report).
  metrics: dict  # The update's metrics ({} for a scheduler that does not learn).
  env_steps: int  # The run's env steps when the params were published (the tracker's count).
  busy_s: dict[str, float]  # The stages' busy seconds so far (StageClock.snapshot).
  time: float  # time.time() at publication.
  force_started: int = 0  # Segments the deadlock breaker started beyond capacity since the last report.


@dataclasses.dataclass(frozen=True)
class Mark:
  """Something a tuner did, for the run's timeline (trace.json) and controller plot."""

  name: str  # The trace's instant event, e.g. "replan".
  label: str  # The plot's label, e.g. "re-plan".
  args: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Knobs:
  """What a tuner may change while a run goes on; None leaves a knob as it is."""

  admission: int | None = None  # Versions ahead a segment may start (0 = a barrier; <= max_staleness).
  max_gen_batch: int | None = None  # Rows the host sampler merges into one call.
  max_wait_s: float | None = None  # The longest a host generation batch waits to fill.
  marks: tuple[Mark, ...] = ()  # What the tuner did, for the timeline.


class Tuner(Protocol):
  """Something that turns a running schedule's knobs from what the run measures."""

  def initial(self) -> Knobs:
    """The knobs the run starts with (applied before the first step)."""

  def decide(self, report: UpdateReport) -> Knobs | None:
    """After each update: the knobs to change, or None."""
