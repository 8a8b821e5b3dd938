"""Action chunks: each env runs its K actions on its own; rewards and ends per action and per chunk."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim_adapters.base import EnvSpec, ObsSpec, StepBatch
from sim_adapters.chunks import ChunkAdapter
from sim_adapters.base import gather_all


class Scripted:
  """An async simulator: env i's step returns reward = its action's first value, obs = steps taken,
  and its episode ends after `lengths[i]` steps (then the next send is a reset step)."""

  def __init__(self, lengths, success_at=None):
    self.lengths = np.asarray(lengths)
    self.num_envs = n = len(lengths)
    self.spec = EnvSpec(name="scripted", obs={"state": ObsSpec((1,), np.dtype(np.float32))}, action_dim=2,
                        action_low=-np.ones(2, np.float32), action_high=np.ones(2, np.float32),
                        max_episode_steps=100, has_success=True)
    self.t = np.zeros(n, np.int64)
    self.needs_reset = np.ones(n, bool)
    self.queue: list[tuple[int, float, bool]] = []  # (env, reward, reset_step) in completion order
    self.sent: list[tuple[int, float]] = []  # (env, action[0]) in send order
    self.success_at = success_at or {}

  def reset(self):
    self.t[:] = 0
    self.needs_reset[:] = False
    self.queue = [(i, 0.0, True) for i in range(self.num_envs)]

  def send(self, actions, env_ids):
    for i, a in zip(env_ids.tolist(), np.asarray(actions)[:, 0].tolist()):
      self.sent.append((i, a))
      if self.needs_reset[i]:
        self.t[i], self.needs_reset[i] = 0, False
        self.queue.append((i, 0.0, True))
      else:
        self.t[i] += 1
        self.queue.append((i, a, False))

  def recv(self):
    i, r, reset = self.queue.pop(0)
    done = (not reset) and self.t[i] >= self.lengths[i]
    if done:
      self.needs_reset[i] = True
    succ = float(self.success_at.get(i, -1) == self.t[i])
    return StepBatch(obs={"state": np.array([[self.t[i]]], np.float32)}, reward=np.array([r], np.float32),
                     terminated=np.array([done]), truncated=np.array([False]), success=np.array([succ], np.float32),
                     env_ids=np.array([i], np.int32), reset_step=np.array([reset]))

  def can_recv(self):
    return bool(self.queue)

  def close(self):
    pass


def _chunk(values, k):
  """A [1, k*2] chunk whose j-th action is (values[j], 0)."""
  return np.stack([np.array([v, 0.0], np.float32) for v in values[:k]]).reshape(1, -1)


def test_spec_tiles_bounds_and_counts_chunk_dims():
  sim = ChunkAdapter(Scripted([10]), chunk_size=3)
  assert sim.spec.action_dim == 6 and sim.spec.chunk_size == 3
  np.testing.assert_array_equal(sim.spec.action_low, -np.ones(6))


def test_chunk_runs_in_order_and_sums_rewards_per_chunk():
  inner = Scripted([10])
  sim = ChunkAdapter(inner, chunk_size=3, reward_type="chunk")
  sim.reset()
  first = sim.recv()
  assert first.reset_step.all() and first.reward[0] == 0.0
  sim.send(_chunk([0.1, 0.2, 0.3], 3), np.array([0]))
  b = sim.recv()
  assert [a for _, a in inner.sent] == pytest.approx([0.1, 0.2, 0.3])  # Executed in chunk order.
  assert b.reward[0] == pytest.approx(0.6) and b.obs["state"][0, 0] == 3 and not b.done[0]
  assert sim.sim_steps == 3


def test_action_rewards_are_discounted_within_the_chunk():
  sim = ChunkAdapter(Scripted([10]), chunk_size=3, reward_type="action", gamma=0.5)
  sim.reset()
  sim.recv()
  sim.send(_chunk([1.0, 1.0, 1.0], 3), np.array([0]))
  assert sim.recv().reward[0] == pytest.approx(1.0 + 0.5 + 0.25)


def test_episode_end_cuts_the_chunk_and_the_reset_comes_back_alone():
  inner = Scripted([2], success_at={0: 2})
  sim = ChunkAdapter(inner, chunk_size=4)
  sim.reset()
  sim.recv()
  sim.send(_chunk([0.5, 0.5, 0.5, 0.5], 4), np.array([0]))
  b = sim.recv()
  assert b.terminated[0] and b.reward[0] == pytest.approx(1.0) and b.success[0] == 1.0
  assert len(inner.sent) == 2  # The rest of the chunk was dropped.
  sim.send(_chunk([0.9] * 4, 4), np.array([0]))
  r = sim.recv()
  assert r.reset_step[0] and r.reward[0] == 0.0 and len(inner.sent) == 3  # Reset row: chunk not continued.


def test_envs_come_back_independently_and_step_gathers_all_by_id():
  sim = ChunkAdapter(Scripted([100, 100, 100]), chunk_size=2)
  sim.reset()
  for _ in range(3):
    sim.recv()
  sim.send(np.concatenate([_chunk([0.1, 0.1], 2), _chunk([0.2, 0.2], 2)]), np.array([2, 0]))
  got = sim.recv()
  assert got.env_ids.tolist() == [2] and got.reward[0] == pytest.approx(0.2)  # Env 2 finished first.
  rest = sim.recv()
  assert rest.env_ids.tolist() == [0] and rest.reward[0] == pytest.approx(0.4)
  full = sim.step(np.concatenate([_chunk([0.3, 0.3], 2)] * 3))
  assert full.env_ids.tolist() == [0, 1, 2] and full.reward == pytest.approx([0.6] * 3)


def test_bad_settings_are_rejected():
  with pytest.raises(ValueError, match="reward_type='step'; valid: chunk, action"):
    ChunkAdapter(Scripted([1]), 2, reward_type="step")
  with pytest.raises(ValueError, match="chunk_size must be >= 1"):
    ChunkAdapter(Scripted([1]), 0)


def test_metaworld_chunks_through_envpool(make):
  sim = make("MetaWorld/Reach-v3", 4, chunk_size=3)
  assert sim.spec.action_dim == 12 and dataclasses.asdict(sim.spec)["chunk_size"] == 3
  sim.reset()
  rows = gather_all(sim, 4)  # First rows: the resets.
  assert rows.reset_step.all()
  rows = sim.step(np.zeros((4, 12), np.float32))
  assert rows.env_ids.tolist() == [0, 1, 2, 3] and not rows.reset_step.any()
  assert sim.sim_steps == 12


def test_learner_discount_per_chunk():
  from ebrl.validation import resolve
  from launch.configs import default
  cfg = default.get_config()
  cfg.algorithm.gamma, cfg.policy.chunk_size = 0.9, 3
  assert resolve(cfg).layout.gamma == pytest.approx(0.9)  # reward_type=chunk: a chunk is one step.
  cfg.env.reward_type = "action"
  assert resolve(cfg).layout.gamma == pytest.approx(0.9 ** 3)  # Rewards discounted inside: K actions per chunk.


def test_a_chunk_cut_short_is_discounted_by_the_actions_it_took():
  """reward_type=action: the next decision is gamma^j away after j actions, gamma^K after a whole chunk."""
  sim = ChunkAdapter(Scripted([5]), chunk_size=3, reward_type="action", gamma=0.5)
  sim.reset()
  assert sim.recv().discount is not None
  sim.send(_chunk([1.0] * 3, 3), np.array([0]))
  whole = sim.recv()
  assert whole.discount[0] == pytest.approx(0.5 ** 3) and not whole.done[0]
  sim.send(_chunk([1.0] * 3, 3), np.array([0]))
  cut = sim.recv()  # The episode ends after 5 actions: 2 of this chunk.
  assert cut.done[0] and cut.discount[0] == pytest.approx(0.5 ** 2)
  assert ChunkAdapter(Scripted([5]), 3, reward_type="chunk").spec.chunk_size == 3
  plain = ChunkAdapter(Scripted([5]), 3, reward_type="chunk")
  plain.reset()
  assert plain.recv().discount is None  # reward_type=chunk: the learner's one gamma per chunk.


def test_per_row_discount_reaches_the_learners_targets():
  """A truncated row cut short bootstraps with its own discount, through the rollout buffer and GAE."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from ebrl.algorithms.gae import gae
  from ebrl.trajectories.rollout_buffer import RolloutBuffer
  from ebrl.sampler import Actions

  spec = Scripted([5]).spec
  buf = RolloutBuffer(spec, 2, 1)
  acts = Actions(np.zeros((1, 2), np.float32), np.zeros((1, 2), np.float32), np.zeros(1, np.float32),
                 np.zeros(1, np.float32))
  row = lambda truncated, discount: StepBatch(
      obs={"state": np.zeros((1, 1), np.float32)}, reward=np.ones(1, np.float32), terminated=np.zeros(1, bool),
      truncated=np.array([truncated]), success=np.zeros(1, np.float32), env_ids=np.zeros(1, np.int32),
      reset_step=np.zeros(1, bool), discount=np.array([discount], np.float32))
  buf.store(0, {"state": np.zeros((1, 1), np.float32)}, acts, 0, row(False, 0.25))
  buf.store(1, {"state": np.zeros((1, 1), np.float32)}, acts, 0, row(True, 0.5))
  ro = buf.rollout(np.array([2.0], np.float32))
  np.testing.assert_array_equal(ro.discount, [[0.25], [0.5]])
  values = jnp.asarray([[0.0], [0.0], [2.0]])
  adv, _ = gae(jnp.asarray(ro.rewards), values, jnp.asarray(ro.terminated), jnp.asarray(ro.done),
               jnp.asarray(ro.discount), 1.0)
  # Row 1 (truncated, 2 of 4 actions): 1 + 0.5 * V = 2; row 0: 1 + 0.25 * (0 + adv_1) = 1.5.
  np.testing.assert_allclose(np.asarray(adv)[:, 0], [1.5, 2.0])
