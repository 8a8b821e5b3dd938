"""A fresh env per episode for the MetaWorld tasks whose EnvPool reset moves the goal
(sim_adapters/fresh_episodes.py).

The upstream defect is checked first, on EnvPool itself: when EnvPool fixes it, that test fails and
the workaround can go. Then the adapters every run builds (a single task, a task list in sync and
async mode, with action chunks and success-ended episodes) must give every episode MetaWorld's goal,
the first episodes those of a plain pool, and the scripted expert its success on later episodes too.
"""

from __future__ import annotations

import numpy as np
import pytest

from ebrl.demos.experts import ExpertActor
from sim_adapters import make_adapter
from sim_adapters.base import gather_all
from sim_adapters.envpool_adapter import EnvPoolAdapter
from sim_adapters.fresh_episodes import RESET_DRIFT_TASKS, FreshEpisodeAdapter, episode_seed, needs_fresh_episodes
from sim_adapters.multitask import MultiTaskAdapter

LIMIT = 8  # Steps per episode where only resets matter.
TABLE_Y = 1.0  # Every MetaWorld goal lies on the table, within 1 m of the robot's base in y.


def _first_states(adapter, episodes: int) -> np.ndarray:
  """[episodes + 1, envs, 39] each episode's first observation (zero actions)."""
  adapter.reset()
  b = gather_all(adapter, adapter.num_envs)
  ys = [b.obs["state"]]
  zeros = np.zeros((adapter.num_envs, adapter.spec.action_dim), np.float32)
  for _ in range(episodes):
    b = adapter.step(zeros)
    while not b.reset_step.all():
      b = adapter.step(zeros)
    ys.append(b.obs["state"])
  return np.array(ys)


def _goal_ys(adapter, episodes: int) -> np.ndarray:
  """[episodes + 1, envs] the goal's y at each episode's first row."""
  return _first_states(adapter, episodes)[..., -2]


@pytest.mark.parametrize("task", RESET_DRIFT_TASKS)
def test_envpool_itself_still_moves_the_goal_at_every_reset(task):
  """The reason for the workaround: on a plain EnvPool the goal walks off the table."""
  pool = EnvPoolAdapter("MetaWorld/" + task, 2, seed=3, max_episode_steps=LIMIT, partially_observable=False)
  try:
    ys = _goal_ys(pool, 2)
  finally:
    pool.close()
  assert (np.abs(ys[0]) < TABLE_Y).all()
  assert (ys[2] > ys[0] + 1.0).all(), ys  # About +0.85 m per reset.


@pytest.mark.parametrize("task", RESET_DRIFT_TASKS)
def test_every_episode_keeps_its_goal_on_the_table_and_first_episodes_match_a_plain_pool(task):
  adapter = make_adapter("MetaWorld/" + task, 3, seed=5, max_episode_steps=LIMIT)
  assert isinstance(adapter, FreshEpisodeAdapter)
  try:
    states = _first_states(adapter, 3)
  finally:
    adapter.close()
  ys = states[..., -2]
  assert (np.abs(ys) < TABLE_Y).all(), ys
  # Fresh envs, fresh initial states: the object's randomised position differs in every episode.
  assert len(np.unique(np.round(states[..., 4], 5))) == states.shape[0] * states.shape[1]
  pool = EnvPoolAdapter("MetaWorld/" + task, 3, seed=5, max_episode_steps=LIMIT, partially_observable=False)
  try:
    pool.reset()
    first = gather_all(pool, 3)
  finally:
    pool.close()
  np.testing.assert_array_equal(first.obs["state"][:, -2], ys[0])


def test_other_tasks_keep_one_pool():
  assert not needs_fresh_episodes("MetaWorld/Reach-v3")
  assert needs_fresh_episodes("MetaWorld/ShelfPlace-v3")
  assert not needs_fresh_episodes("Hammer-v3")  # Not a MetaWorld EnvPool name.


def test_episode_seeds_keep_the_first_and_differ_later():
  assert episode_seed(17, 0) == 17
  later = {episode_seed(17, k) for k in range(1, 50)} | {episode_seed(18, k) for k in range(1, 50)}
  assert len(later) == 98 and 17 not in later and all(0 <= s < 2**31 - 1 for s in later)
  assert episode_seed(17, 3) == episode_seed(17, 3)  # Same-seed envs share each episode's start.


def _expert_successes(adapter, task_ids: np.ndarray, tasks, steps: int) -> list[tuple[int, int, float]]:
  """(env, episode index, success) of every finished episode, the scripted experts acting."""
  expert = ExpertActor(tasks)
  adapter.reset()
  b = gather_all(adapter, adapter.num_envs)
  obs, n = b.obs["state"], adapter.num_envs
  episode, succ, out = np.zeros(n, np.int64), np.zeros(n), []
  for _ in range(steps):
    b = adapter.step(expert.act(obs, task_ids))
    real = ~b.reset_step
    succ = np.fmax(succ, np.where(real, b.success, 0.0))
    for i in np.flatnonzero(b.done):
      out.append((int(i), int(episode[i]), float(succ[i])))
      episode[i] += 1
      succ[i] = 0.0
    obs = b.obs["state"]
  return out


def test_the_expert_succeeds_in_later_shelf_place_episodes_ended_at_success():
  """end_on_success resets an env that is not done (reset_envs): its next episode is fresh too. On a
  plain EnvPool the expert succeeds in no ShelfPlace episode after an env's first."""
  adapter = make_adapter("MetaWorld/ShelfPlace-v3", 2, seed=0, success_bonus=10.0, end_on_success=True)
  try:
    eps = _expert_successes(adapter, np.zeros(2, np.int32), ["ShelfPlace-v3"], 700)
  finally:
    adapter.close()
  later = [s for _, k, s in eps if k >= 1]
  assert len(later) >= 4 and all(s == 1.0 for _, _, s in eps), eps


@pytest.mark.parametrize("batch_size", [None, 3])
def test_a_task_list_gives_its_drifting_task_fresh_envs_in_sync_and_async_mode(batch_size):
  name = "MetaWorld/MT:Reach-v3,Hammer-v3"
  adapter = make_adapter(name, 4, seed=2, batch_size=batch_size, max_episode_steps=LIMIT)
  assert isinstance(adapter, MultiTaskAdapter) and isinstance(adapter._subs[1], FreshEpisodeAdapter)
  assert isinstance(adapter._subs[0], EnvPoolAdapter)
  try:
    ys = _goal_ys(adapter, 3)
  finally:
    adapter.close()
  assert (np.abs(ys) < TABLE_Y).all(), ys


def test_chunks_and_success_ends_over_a_task_list_count_every_expert_success():
  """The stack a fine-tuning run builds (task list, async pools, success-ended episodes, chunks of 2):
  the Hammer expert succeeds in every episode, later ones included."""
  adapter = make_adapter("MetaWorld/MT:Reach-v3,Hammer-v3", 4, seed=1, batch_size=3, chunk_size=2,
                         success_bonus=10.0, end_on_success=True)
  try:
    expert = ExpertActor(["Reach-v3", "Hammer-v3"])
    adapter.reset()
    b = gather_all(adapter, 4)
    obs = b.obs["state"][np.argsort(b.env_ids)]
    task_ids = np.array([0, 0, 1, 1], np.int32)
    done_hammer, succ = [], np.zeros(4)
    for _ in range(300):
      first = expert.act(obs, task_ids)
      b = adapter.step(np.concatenate([first, first], axis=1))  # Each chunk repeats the expert's action.
      ids = b.env_ids
      succ[ids] = np.fmax(succ[ids], np.where(b.reset_step, 0.0, b.success))
      for row in np.flatnonzero(b.done):
        if ids[row] >= 2:
          done_hammer.append(float(succ[ids[row]]))
        succ[ids[row]] = 0.0
      obs = obs.copy()
      obs[ids] = b.obs["state"]
  finally:
    adapter.close()
  assert len(done_hammer) >= 4 and all(s == 1.0 for s in done_hammer), done_hammer
