"""The run's figures over several processes (ebrl/telemetry/process_tally.py), from each process's
own tracker: counts summed, rates over the union of the windows, per task, the success target
only when every window is full, stage time as the mean, and every process's flags. Two trackers
stand for two processes; the group's gather stacks their rows as jax.distributed's would."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ebrl.process_group import ProcessGroup
from ebrl.telemetry.episodes import EpisodeTracker
from ebrl.telemetry.process_tally import ProcessTally
from ebrl.telemetry.stages import StageClock
from ebrl.telemetry.trace import Tracer


class _TwoProcesses(ProcessGroup):
  """Process 0 of two; the other process's row is `other()` at each gather."""

  def __init__(self, other):
    super().__init__(count=2, index=0)
    self.other = other

  def gather(self, values):
    values = np.asarray(values, np.float64)  # The other process sends as many flags (none or three).
    return np.stack([values, self.other()[:len(values)]])


def _tracker(tasks=("reach", "push")) -> EpisodeTracker:
  return EpisodeTracker(num_envs=4, has_success=True, window=4, target=0.75, tasks=tasks,
                        env_tasks=np.array([0, 1, 0, 1]))


def _finish(tracker: EpisodeTracker, successes: list[float], returns: float, task: int) -> None:
  n = len(successes)
  tracker._add_finished(np.full(n, returns), np.full(n, 10), np.asarray(successes, np.float32),  # pylint: disable=protected-access
                        np.full(n, task))


def _pair():
  mine, theirs = _tracker(), _tracker()
  their_clock = StageClock(Tracer())
  flags = {"theirs": (False, False, False)}

  def other_row():
    return np.concatenate([[theirs.env_steps, theirs.episodes], theirs.window_sums(),
                           [their_clock.snapshot().get(s, 0.0) for s in ("sim", "gen", "train")],
                           np.asarray(flags["theirs"], np.float64)])

  clock = StageClock(Tracer())
  return mine, theirs, flags, clock, ProcessTally(mine, clock, _TwoProcesses(other_row)), their_clock


def test_counts_sum_and_rates_cover_both_windows():
  mine, theirs, _, clock, tally, their_clock = _pair()
  mine.count_steps(100)
  theirs.count_steps(60)
  _finish(mine, [1, 1], returns=4.0, task=0)
  _finish(theirs, [0, 0, 0, 1], returns=2.0, task=1)
  clock.totals["sim"] = 3.0
  their_clock.totals["sim"] = 1.0
  tally.refresh((False, True, False))
  assert tally.env_steps == 160 and tally.episodes == 6
  assert tally.success_rate == pytest.approx(3 / 6)
  assert tally.episode_return == pytest.approx((2 * 4.0 + 4 * 2.0) / 6)
  assert tally.success_rate_by_task == {"reach": 1.0, "push": 0.25}
  assert tally.busy_s()["sim"] == pytest.approx(2.0)  # The processes' mean.
  assert not tally.window_full  # Process 0's window holds 2 of 4.
  assert tally.first_hit is None


def test_target_only_once_every_window_is_full():
  mine, theirs, _, _, tally, _ = _pair()
  _finish(mine, [1, 1, 1, 1], returns=1.0, task=0)  # Process 0 alone is at 1.0 >= 0.75.
  _finish(theirs, [1, 1], returns=1.0, task=1)
  tally.refresh(())
  assert tally.first_hit is None
  _finish(theirs, [1, 0], returns=1.0, task=1)  # Both full: 7 of 8 = 0.875.
  theirs.count_steps(40)
  tally.refresh(())
  assert tally.first_hit is not None and tally.env_steps_at_hit == 40
  assert tally.window_full and tally.success_rate == pytest.approx(7 / 8)


def test_flags_come_back_per_process():
  _, _, flags, _, tally, _ = _pair()
  flags["theirs"] = (True, False, True)
  agreed = tally.refresh((False, True, False))
  assert agreed.tolist() == [[False, True, False], [True, False, True]]


def test_no_episodes_is_nan_not_zero():
  _, _, _, _, tally, _ = _pair()
  tally.refresh(())
  assert math.isnan(tally.success_rate) and math.isnan(tally.episode_return)
  assert tally.success_rate_by_task == {"reach": None, "push": None}
