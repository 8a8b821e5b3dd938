"""The episode window and the moment it first reaches the success target.

Time to success is what users compare against other systems: it must be the moment the
last-100 window of finished episodes got there, even when that happened in the middle of
a batch of episodes finishing at the same step, and never before the window was full.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from ebrl.telemetry.episodes import EpisodeTracker
from sim_adapters.base import StepBatch


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


# -- success per task -------------------------------------------------------------------------

TASKS = ("Reach-v3", "Push-v3", "DialTurn-v3")
ENV_TASKS = np.array([0, 0, 1, 1, 2])  # Five envs: two of Reach, two of Push, one of DialTurn.


def _step(tracker: EpisodeTracker, success=(), done=(), reset=()) -> None:
  """One step of all five envs: `success` lists the envs whose row reports success, `done` those
  whose episode ends with this row, `reset` those whose row is an automatic reset's."""
  n = len(ENV_TASKS)
  flag = lambda ids: np.isin(np.arange(n), ids)
  tracker.observe(StepBatch(obs={}, reward=np.ones(n, np.float32), terminated=np.zeros(n, bool),
                            truncated=flag(done), success=flag(success).astype(np.float32),
                            env_ids=np.arange(n, dtype=np.int32), reset_step=flag(reset)))


def test_success_per_task_on_a_scripted_sequence_of_episodes():
  """Each task's window holds its own last `window` episodes; an episode succeeded when any of its
  steps did (a success before the last step counts, an auto-reset row's does not)."""
  tracker = EpisodeTracker(5, has_success=True, window=3, tasks=TASKS, env_tasks=ENV_TASKS)
  assert tracker.success_rate_by_task == {"Reach-v3": None, "Push-v3": None, "DialTurn-v3": None}
  _step(tracker, success=[0])  # Env 0 (Reach) succeeds mid-episode.
  _step(tracker, done=[0, 2, 4], success=[4])  # Reach 1, Push 0, DialTurn 1 (at its last step).
  assert tracker.success_rate_by_task == {"Reach-v3": 1.0, "Push-v3": 0.0, "DialTurn-v3": 1.0}
  assert tracker.success_rate == 2 / 3 and tracker.episodes == 3
  _step(tracker, reset=[0, 2, 4], success=[0, 2, 4])  # Reset rows: their success is no step of an episode.
  _step(tracker, done=[0, 1, 2, 3])  # Reach 0 (env 0), Reach 0 (env 1), Push 0, Push 0.
  assert tracker.success_rate_by_task == {"Reach-v3": 1 / 3, "Push-v3": 0.0, "DialTurn-v3": 1.0}
  _step(tracker, reset=[0, 1, 2, 3])
  _step(tracker, success=[1, 3], done=[1, 3, 4])  # Reach 1, Push 1, DialTurn 0 (env 4 since its reset).
  # Reach's window: the first of its four episodes has left it: [0, 0, 1]; Push: [0, 0, 1]; DialTurn: [1, 0].
  assert tracker.success_rate_by_task == {"Reach-v3": 1 / 3, "Push-v3": 1 / 3, "DialTurn-v3": 0.5}
  # The mixed window (the last three of all ten episodes) is what success_rate always was.
  assert tracker.episodes == 10 and tracker.success_rate == 2 / 3

  restored = EpisodeTracker(5, has_success=True, window=3, tasks=TASKS, env_tasks=ENV_TASKS)
  restored.load_state_dict(tracker.state_dict())
  assert restored.success_rate_by_task == tracker.success_rate_by_task
  assert restored.success_rate == tracker.success_rate


def test_success_per_task_matches_a_reference_over_many_episodes():
  rng = np.random.default_rng(0)
  tracker = EpisodeTracker(5, has_success=True, window=7, tasks=TASKS, env_tasks=ENV_TASKS)
  history: dict[str, list[float]] = {t: [] for t in TASKS}
  succeeded = np.zeros(5, bool)
  for _ in range(400):
    success = np.flatnonzero(rng.random(5) < 0.1)
    done = np.flatnonzero(rng.random(5) < 0.2)
    succeeded[success] = True
    for i in done:
      history[TASKS[ENV_TASKS[i]]].append(float(succeeded[i]))
      succeeded[i] = False
    _step(tracker, success=success, done=done)
  expected = {t: sum(h[-7:]) / len(h[-7:]) for t, h in history.items()}
  assert all(len(h) > 7 for h in history.values())
  assert tracker.success_rate_by_task == pytest.approx(expected, abs=1e-12)


def test_a_single_task_tracker_has_no_per_task_rates():
  tracker = EpisodeTracker(4, has_success=True)
  _finish(tracker, [1, 0])
  assert tracker.success_rate_by_task is None and "recent_by_task" not in tracker.state_dict()
  with pytest.raises(ValueError, match="task id of each of the 4 envs"):
    EpisodeTracker(4, has_success=True, tasks=TASKS, env_tasks=ENV_TASKS)


def test_per_task_rates_become_one_tensorboard_tag_per_task(tmp_path):
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

  from ebrl.telemetry.writers import MetricsWriter, read_jsonl

  writer = MetricsWriter(str(tmp_path))
  writer.write({"env_steps": 10, "success_rate": 0.5,
                "success_rate_by_task": {"Reach-v3": 1.0, "Push-v3": 0.0, "DialTurn-v3": None}})
  writer.close()
  assert read_jsonl(str(tmp_path / "metrics.jsonl"))[0]["success_rate_by_task"] == {
      "Reach-v3": 1.0, "Push-v3": 0.0, "DialTurn-v3": None}
  events = EventAccumulator(str(tmp_path / "tb"))
  events.Reload()
  tags = set(events.Tags()["scalars"])
  assert {"success_rate", "success_rate_by_task/Reach-v3", "success_rate_by_task/Push-v3"} <= tags
  assert "success_rate_by_task/DialTurn-v3" not in tags  # No episode yet: nothing to draw.
  assert events.Scalars("success_rate_by_task/Reach-v3")[0].value == 1.0


def test_the_per_task_bar_chart_is_drawn(tmp_path):
  from ebrl.telemetry import plots

  path = tmp_path / "plots" / "success_by_task.png"
  plots.success_by_task({"Reach-v3": 0.9, "Push-v3": None}, {"Reach-v3": 1.0, "Push-v3": None}, str(path), "MT")
  assert path.stat().st_size > 1000
