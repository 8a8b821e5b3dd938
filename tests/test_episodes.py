"""The episode window and the moment it first reaches the success target.

Time to success is what users compare against other systems: it must be the moment the
last-100 window of finished episodes got there, even when that happened in the middle of
a batch of episodes finishing at the same step, and never before the window was full.
"""

from __future__ import annotations

import time

import numpy as np

from ebrl.telemetry.episodes import EpisodeTracker


def _finish(tracker: EpisodeTracker, successes: list[float]) -> None:
  n = len(successes)
  tracker.add_finished(np.zeros(n), np.full(n, 500), np.asarray(successes, np.float32))


def test_a_target_reached_mid_batch_is_noted_even_if_the_batch_ends_below_it():
  tracker = EpisodeTracker(num_envs=8, has_success=True, window=4, target=1.0)
  before = time.time()
  _finish(tracker, [1, 1, 1, 1, 0])  # The window is [1, 1, 1, 1] after the fourth episode.
  assert tracker.first_hit is not None and before <= tracker.first_hit <= time.time()
  assert tracker.success_rate == 0.75  # The window after the whole batch: [1, 1, 1, 0].
  assert tracker.episodes == 5 and len(tracker.recent) == 4


def test_no_hit_before_the_window_is_full_or_below_the_target():
  tracker = EpisodeTracker(num_envs=8, has_success=True, window=4, target=1.0)
  _finish(tracker, [1, 1, 1])
  assert tracker.first_hit is None  # 3 of 3 succeeded, but the window needs 4 episodes.
  _finish(tracker, [0, 0, 1, 1])
  assert tracker.first_hit is None  # [1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 1], [0, 0, 1, 1].
  _finish(tracker, [1])
  assert tracker.first_hit is None  # [0, 1, 1, 1] = 0.75.
  _finish(tracker, [1])
  assert tracker.first_hit is not None  # [1, 1, 1, 1].
  first = tracker.first_hit
  _finish(tracker, [0, 1, 1, 1, 1])
  assert tracker.first_hit == first  # The first crossing, not the latest.


def test_without_a_target_or_a_success_signal_nothing_is_noted():
  for tracker in (EpisodeTracker(4, has_success=True, window=2),
                  EpisodeTracker(4, has_success=False, window=2, target=0.5)):
    _finish(tracker, [1, 1, 1])
    assert tracker.first_hit is None
