"""The episode statistics of a run over several processes, combined once per update.

Why: each process tracks its own envs' episodes (ebrl/telemetry/episodes.py);
the run's figures are every process's together. `ProcessTally.refresh` gathers
each process's counts, window sums and stage times (ebrl/process_group.py) and, with them,
the flags every process must agree on (stop, log, checkpoint), so one gather
per update carries both. The tally answers the questions the recorder asks of
an EpisodeTracker, for the whole run:

  env_steps, episodes            summed over the processes
  busy_s                         each stage's busy seconds, the processes' mean
  success_rate, episode_return,  over the union of the processes' windows (each
  episode_length, by task        its last `window` episodes)
  first_hit, env_steps_at_hit    the first update at which every window was full
                                 and the union reached the target (to within
                                 one update, where one process notes it to
                                 within one step batch)
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np

from ebrl.process_group import ProcessGroup
from ebrl.telemetry.episodes import EpisodeTracker
from ebrl.telemetry.stages import StageClock

_COUNTS = 2  # env_steps, episodes; then the tracker's window sums, the stages' busy seconds, the flags.
STAGES = ("sim", "gen", "train")


class ProcessTally:

  def __init__(self, tracker: EpisodeTracker, clock: StageClock, group: ProcessGroup):
    self.tracker, self.clock, self.group = tracker, clock, group
    self.tasks = tracker.tasks
    self.window = tracker.window
    self._sums = len(tracker.window_sums())
    self._rows = np.zeros((group.count, _COUNTS + self._sums + len(STAGES)))
    self.first_hit: float | None = None
    self.env_steps_at_hit: int | None = None

  def refresh(self, flags: Sequence[bool]) -> np.ndarray:
    """Gathers every process's counts and `flags`; returns the flags, one row per process."""
    busy = self.clock.snapshot()
    local = np.concatenate([[self.tracker.env_steps, self.tracker.episodes], self.tracker.window_sums(),
                            [busy.get(stage, 0.0) for stage in STAGES], np.asarray(flags, np.float64)])
    rows = self.group.gather(local)
    width = self._rows.shape[1]
    self._rows = rows[:, :width]
    self._note_hit()
    return rows[:, width:] > 0.5

  def _note_hit(self) -> None:
    target = self.tracker.target
    if self.first_hit is not None or target is None or not self.tracker.has_success:
      return
    n = self._rows[:, _COUNTS]
    if (n == self.window).all() and self._rows[:, _COUNTS + 3].sum() >= target * n.sum():
      self.first_hit = time.time()
      self.env_steps_at_hit = self.env_steps

  def busy_s(self) -> dict[str, float]:
    """Each stage's busy seconds, the mean over the processes (each runs its own stages)."""
    first = _COUNTS + self._sums
    return {stage: float(self._rows[:, first + i].mean()) for i, stage in enumerate(STAGES)}

  @property
  def env_steps(self) -> int:
    return int(self._rows[:, 0].sum())

  @property
  def episodes(self) -> int:
    return int(self._rows[:, 1].sum())

  @property
  def first_step_time(self) -> float | None:
    return self.tracker.first_step_time

  @property
  def window_full(self) -> bool:
    return bool((self._rows[:, _COUNTS] == self.window).all())

  def _mean(self, column: int) -> float:
    n = self._rows[:, _COUNTS].sum()
    return float(self._rows[:, _COUNTS + column].sum() / n) if n else math.nan

  @property
  def episode_return(self) -> float:
    return self._mean(1)

  @property
  def episode_length(self) -> float:
    return self._mean(2)

  @property
  def success_rate(self) -> float:
    return self._mean(3) if self.tracker.has_success else math.nan

  @property
  def success_rate_by_task(self) -> dict[str, float | None] | None:
    if not self.tasks:
      return None
    rates = {}
    for k, task in enumerate(self.tasks):
      n, s = self._rows[:, _COUNTS + 4 + 2 * k].sum(), self._rows[:, _COUNTS + 5 + 2 * k].sum()
      rates[task] = float(s / n) if n and self.tracker.has_success else None
    return rates
