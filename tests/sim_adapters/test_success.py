"""Success-aligned rewards (sim_adapters/success.py): a bonus on success steps, episodes that end there.

A scripted adapter pins the row semantics exactly (which rows get the bonus, which end, which reset);
MetaWorld envs driven by their scripted experts (which reach success in tens of steps) check the same
through EnvPool's own resets: single task, a task list with async pools and action chunks, and the
env groups a training run builds for the async scheduler.
"""

from __future__ import annotations

import numpy as np
import pytest

from ebrl.telemetry.episodes import EpisodeTracker
from sim_adapters import make_adapter
from sim_adapters.base import EnvSpec, ObsSpec, StepBatch, gather_all
from sim_adapters.chunks import ChunkAdapter
from sim_adapters.success import SuccessAdapter

BONUS = 100.0  # Above any MetaWorld step reward (at most 10), so a bonus row is unmistakable.


class ScriptedEnv:
  """Sync adapter: env i succeeds from step `succeed_at[i]` of each episode on; episodes truncate at
  `limit`; obs["state"] is [episode index, step in episode]; reward is 1 per real step."""

  def __init__(self, succeed_at, limit: int = 10):
    n = len(succeed_at)
    self.spec = EnvSpec(name="MetaWorld/Scripted", obs={"state": ObsSpec((2,), np.dtype(np.float32))}, action_dim=1,
                        action_low=-np.ones(1, np.float32), action_high=np.ones(1, np.float32),
                        max_episode_steps=limit, has_success=True)
    self.num_envs, self.limit, self.succeed_at = n, limit, np.asarray(succeed_at)
    self.episode, self.t = np.full(n, -1), np.zeros(n, np.int64)
    self.reset_next = np.ones(n, bool)
    self.ignored = 0  # Actions sent to an env that was resetting.

  def reset(self):
    self.reset_next[:] = True
    self.pending = np.ones(self.num_envs, bool)

  def send(self, actions, env_ids):
    assert not self.pending[env_ids].any(), "sent to an env in flight"
    self.pending[env_ids] = True

  def can_recv(self):
    return bool(self.pending.any())

  def recv(self):
    ids = np.flatnonzero(self.pending)
    self.pending[:] = False
    reset = self.reset_next[ids].copy()
    self.ignored += int(reset.sum())
    self.episode[ids] += reset
    self.t[ids] = np.where(reset, 0, self.t[ids] + 1)
    truncated = ~reset & (self.t[ids] >= self.limit)
    self.reset_next[ids] = truncated
    success = (~reset & (self.t[ids] >= self.succeed_at[ids])).astype(np.float32)
    obs = {"state": np.stack([self.episode[ids], self.t[ids]], 1).astype(np.float32)}
    return StepBatch(obs, (~reset).astype(np.float32), np.zeros(len(ids), bool), truncated, success,
                     ids.astype(np.int32), reset)

  def step(self, actions):
    self.send(actions, np.arange(self.num_envs))
    return self.recv()

  def reset_envs(self, env_ids):
    self.reset_next[np.asarray(env_ids)] = True

  def close(self):
    pass


def _rows(adapter, steps):
  adapter.reset()
  first = gather_all(adapter, adapter.num_envs)
  actions = np.zeros((adapter.num_envs, adapter.spec.action_dim), np.float32)
  return first, [adapter.step(actions) for _ in range(steps)]


def test_bonus_is_added_exactly_on_success_steps():
  inner = ScriptedEnv([3, 20])  # Env 1 never succeeds.
  _, rows = _rows(SuccessAdapter(inner, bonus=2.5), 12)
  for b in rows:
    expected = np.where(b.reset_step, 0.0, 1.0) + 2.5 * (b.success > 0)
    np.testing.assert_array_equal(b.reward, expected.astype(np.float32))
    assert not b.terminated.any()  # Without end_on_success the episodes run to their limit.
  success_steps = [int(b.obs["state"][0, 1]) for b in rows if b.success[0] > 0]
  assert success_steps == list(range(3, 11))  # Every success step of the full-length episode is paid.
  assert inner.ignored == 2 + 2  # The first reset and the truncations' resets only.


@pytest.mark.parametrize("scale", [0.0, 0.25])
def test_dense_reward_scale_scales_the_env_reward_and_leaves_the_bonus(scale):
  """reward = scale * env reward + bonus on success rows: 0 is a sparse success reward."""
  inner = ScriptedEnv([3, 20])
  _, rows = _rows(SuccessAdapter(inner, bonus=2.5, dense_scale=scale), 12)
  for b in rows:
    expected = scale * np.where(b.reset_step, 0.0, 1.0) + 2.5 * (b.success > 0)
    np.testing.assert_array_equal(b.reward, expected.astype(np.float32))
  assert sum(float(b.reward[1]) for b in rows) == scale * sum(float(~b.reset_step[1]) for b in rows)
  assert any(b.success[0] > 0 for b in rows)


def test_end_on_success_terminates_at_the_first_success_and_the_next_row_is_a_reset():
  inner = ScriptedEnv([3, 20])
  adapter = SuccessAdapter(inner, bonus=1.0, end_on_success=True)
  tracker = EpisodeTracker(2, has_success=True)
  first, rows = _rows(adapter, 9)
  for b in [first, *rows]:
    tracker.observe(b)
  env0 = [(int(b.obs["state"][0, 0]), int(b.obs["state"][0, 1]), bool(b.terminated[0]), bool(b.truncated[0]),
           bool(b.reset_step[0]), float(b.reward[0])) for b in rows]
  # (episode, step, terminated, truncated, reset_step, reward): terminal at the first success (step 3,
  # reward 1 + bonus), then a reset row (the action sent was ignored), then the new episode.
  assert env0 == [(0, 1, False, False, False, 1.0), (0, 2, False, False, False, 1.0), (0, 3, True, False, False, 2.0),
                  (1, 0, False, False, True, 0.0), (1, 1, False, False, False, 1.0), (1, 2, False, False, False, 1.0),
                  (1, 3, True, False, False, 2.0), (2, 0, False, False, True, 0.0), (2, 1, False, False, False, 1.0)]
  assert not any(b.terminated[1] for b in rows)  # Env 1 never succeeded: its episode runs on.
  assert adapter.success_ends == 2
  # The tracker sees the shortened episodes: 3 steps, return 3 + bonus, a success.
  assert list(tracker.recent) == [(4.0, 3, 1.0), (4.0, 3, 1.0)]


def test_a_success_on_the_last_step_is_a_terminal_and_resets_once():
  inner = ScriptedEnv([10], limit=10)  # Success and the time limit on the same step.
  _, rows = _rows(SuccessAdapter(inner, end_on_success=True), 12)
  k = next(t for t, b in enumerate(rows) if b.success[0] > 0)
  assert rows[k].obs["state"][0, 1] == 10  # The last step of the episode.
  assert rows[k].terminated[0] and not rows[k].truncated[0]  # A true terminal: no bootstrap.
  assert rows[k + 1].reset_step[0] and rows[k + 1].obs["state"][0, 0] == 1 and not rows[k + 2].reset_step[0]
  assert inner.ignored == 2  # One reset after it (the env's own), not two.


def test_with_chunks_a_chunk_ends_at_the_success_step():
  inner = ScriptedEnv([3, 20])
  adapter = ChunkAdapter(SuccessAdapter(inner, bonus=1.0, end_on_success=True), chunk_size=2)
  _, rows = _rows(adapter, 4)
  # Chunks of env 0: steps 1-2 (reward 2), step 3 cut short by the success (reward 1 + bonus,
  # terminated), then the reset row, then steps 1-2 of the next episode.
  got = [(float(b.reward[0]), bool(b.terminated[0]), bool(b.reset_step[0]), tuple(b.obs["state"][0])) for b in rows]
  assert got == [(2.0, False, False, (0.0, 2.0)), (2.0, True, False, (0.0, 3.0)), (0.0, False, True, (1.0, 0.0)),
                 (2.0, False, False, (1.0, 2.0))]


@pytest.mark.parametrize("bonus, end, message", [
    (-1.0, False, "success_bonus=-1.0 must be a finite number >= 0"),
    (float("nan"), False, "success_bonus=nan must be a finite number >= 0"),
    (float("inf"), False, "success_bonus=inf must be a finite number >= 0"),
    (0.0, "yes", "end_on_success='yes' must be True or False"),
])
def test_bad_values_are_one_line_errors(bonus, end, message):
  with pytest.raises(ValueError, match=message):
    SuccessAdapter(ScriptedEnv([1]), bonus, end)
  with pytest.raises(ValueError, match=message):
    make_adapter("MetaWorld/Reach-v3", 1, success_bonus=bonus, end_on_success=end)


@pytest.mark.parametrize("bonus, scale, message", [
    (1.0, -0.5, "dense_reward_scale=-0.5 must be a finite number >= 0"),
    (1.0, float("nan"), "dense_reward_scale=nan must be a finite number >= 0"),
    (0.0, 0.0, "dense_reward_scale=0 with success_bonus=0 leaves no reward"),
])
def test_bad_dense_reward_scales_are_one_line_errors(bonus, scale, message):
  with pytest.raises(ValueError, match=message):
    SuccessAdapter(ScriptedEnv([1]), bonus, False, scale)
  with pytest.raises(ValueError, match=message):
    make_adapter("MetaWorld/Reach-v3", 1, success_bonus=bonus, dense_reward_scale=scale)


def test_make_adapter_rejects_envs_other_than_metaworld():
  with pytest.raises(ValueError, match="apply to MetaWorld host envs, not 'CartpoleBalance-v1'"):
    make_adapter("CartpoleBalance-v1", 1, end_on_success=True)
  with pytest.raises(ValueError, match="apply to MetaWorld host envs, not 'CartpoleBalance-v1'"):
    make_adapter("CartpoleBalance-v1", 1, dense_reward_scale=0.5)


# -- MetaWorld, driven by its experts ----------------------------------------------------------


def _expert(tasks):
  from ebrl.demos.experts import ExpertActor  # pylint: disable=g-import-not-at-top

  return ExpertActor(tasks)


def test_metaworld_reach_ends_on_success_with_the_bonus_and_resets():
  """Wrapped and plain pools with one seed, stepped alike: identical rows until the first success, which
  the wrapped pool pays with the bonus and ends; its next row is a fresh episode (a new goal)."""
  wrapped = make_adapter("MetaWorld/Reach-v3", 2, success_bonus=BONUS, end_on_success=True)
  plain = make_adapter("MetaWorld/Reach-v3", 2)
  expert = _expert(["Reach-v3"])
  tracker = EpisodeTracker(2, has_success=True)
  try:
    wrapped.reset()
    plain.reset()
    w, p = gather_all(wrapped, 2), gather_all(plain, 2)
    tracker.observe(w)
    ended = np.zeros(2, bool)
    for step in range(1, 150):
      actions = expert.act(w.obs["state"], np.zeros(2, np.int32))
      prev, w = w, wrapped.step(actions)
      tracker.observe(w)
      p = plain.step(actions) if not ended.any() else None
      if p is not None:
        np.testing.assert_array_equal(w.obs["state"], p.obs["state"])
        hit = p.success > 0
        np.testing.assert_allclose(w.reward, p.reward + BONUS * hit, rtol=1e-6)
        np.testing.assert_array_equal(w.terminated, hit)
        assert not w.truncated.any() and not p.done.any()
      for i in np.flatnonzero(ended):  # The row after a success terminal: a reset, a new goal.
        if prev.terminated[i]:
          assert w.reset_step[i] and not w.done[i] and w.reward[i] == 0.0
          assert not np.allclose(w.obs["state"][i, -3:], prev.obs["state"][i, -3:])
      ended |= w.terminated
      if ended.all() and not w.terminated.any():
        break
    assert ended.all(), "the Reach expert did not succeed in 150 steps"
    assert wrapped.success_ends >= 2
    returns, lengths, successes = zip(*tracker.recent)
    assert all(s == 1.0 for s in successes) and all(0 < n < 150 for n in lengths)
    assert all(r > BONUS for r in returns)
  finally:
    wrapped.close()
    plain.close()


def _drive_async(adapter, expert, task_ids, decisions):
  """send/recv as the async scheduler does (each env sent again as soon as it comes back); returns
  every row of every env, in order."""
  n = adapter.num_envs
  adapter.reset()
  rows = {i: [] for i in range(n)}
  count = 0
  while count < decisions:
    b = adapter.recv()
    for j, i in enumerate(b.env_ids.tolist()):
      rows[i].append(b.take(np.array([j])))
    count += len(b)
    chunk = adapter.spec.chunk_size
    one = expert.act(b.obs["state"], task_ids[b.env_ids])
    adapter.send(np.tile(one, (1, chunk)), b.env_ids)
  while adapter.can_recv():  # Collect what is in flight before closing.
    adapter.recv()
  return rows


def _check_episodes(rows, chunked=False):
  """Every success row is a terminal; the row after it is a reset; no row continues an episode that ended."""
  ends = 0
  for env_rows in rows.values():
    for prev, cur in zip(env_rows, env_rows[1:]):
      if prev.success[0] > 0 and not prev.reset_step[0]:
        assert prev.terminated[0] and not prev.truncated[0]
      if prev.done[0]:
        assert cur.reset_step[0], "the env stepped on in an episode that had ended"
        ends += int(prev.terminated[0])
      else:
        assert not cur.reset_step[0]
    if chunked:  # A chunk is cut at the success: its reward holds at most one bonus.
      assert all(r.reward[0] < 2 * BONUS for r in env_rows)
  return ends


def test_metaworld_task_list_async_with_chunks():
  """Two tasks, one pool per task, async receiving, chunks of 2: every episode ends at its success."""
  name = "MetaWorld/MT:Reach-v3,ReachWall-v3"
  adapter = make_adapter(name, 2, batch_size=1, chunk_size=2, success_bonus=BONUS, end_on_success=True)
  try:
    rows = _drive_async(adapter, _expert(["Reach-v3", "ReachWall-v3"]), adapter.task_ids, 160)
    assert _check_episodes(rows, chunked=True) >= 2
    assert all(any(r.terminated[0] for r in env_rows) for env_rows in rows.values())
  finally:
    adapter.close()


def test_training_env_groups_carry_the_options_and_evaluation_does_not():
  """The groups a run with scheduler=ebrl builds end episodes at success; evaluation's RunEnv has neither
  option, so evaluation keeps MetaWorld's protocol."""
  from ebrl import stages  # pylint: disable=g-import-not-at-top
  from ebrl.evaluation import RunEnv  # pylint: disable=g-import-not-at-top
  from ebrl.telemetry.stages import StageClock  # pylint: disable=g-import-not-at-top
  from ebrl.validation import resolve  # pylint: disable=g-import-not-at-top
  from tiny_configs import tiny_config  # pylint: disable=g-import-not-at-top

  cfg = tiny_config(scheduler="ebrl", ebrl__num_groups=2, ebrl__recv_batch=1, env__success_bonus=BONUS,
                    env__end_on_success=True)
  run = resolve(cfg)
  assert (run.env.success_bonus, run.env.end_on_success) == (BONUS, True)
  kwargs = RunEnv.of_spec(run).adapter_kwargs()
  assert "success_bonus" not in kwargs and "end_on_success" not in kwargs
  groups = stages._host_groups(run, run.layout, 0, StageClock(), None)  # pylint: disable=protected-access
  try:
    assert len(groups) == 2
    for g in range(len(groups)):
      assert isinstance(groups[g], SuccessAdapter) and groups[g].bonus == BONUS and groups[g].end_on_success
    group = groups[1]
    rows = _drive_async(group, _expert(["Reach-v3"]), np.zeros(group.num_envs, np.int32), 120)
    assert _check_episodes(rows) >= 1
  finally:
    groups.close()
