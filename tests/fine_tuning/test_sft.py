"""Supervised pre-training: each family's loss against NumPy, loss falling on a tiny dataset, chunks
from episodes, the params warm-starting RL bit for bit, and bad demos as one line before a compile."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ebrl.demos import FORMAT, FORMAT_VERSION, MANIFEST, open_demos
from ebrl.demos import format as fmt
from ebrl.sft import data as data_lib
from ebrl.algorithms import imitation as losses
from ebrl.sft.train import SFTConfig, train
from ebrl.validation import resolve
from sim_adapters.base import EnvSpec, ObsSpec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATE, TASKS, A = 6, 2, 2
_LOG_2PI = float(np.log(2 * np.pi))


def spec(chunk: int = 1, pixels: bool = False) -> EnvSpec:
  obs = {"state": ObsSpec((STATE,), np.dtype(np.float32)), "task": ObsSpec((TASKS,), np.dtype(np.float32))}
  if pixels:
    obs = {"pixels": ObsSpec((3, 16, 16), np.dtype(np.uint8)), "state": obs["state"]}
  d = A * chunk
  return EnvSpec("MetaWorld/MT:Reach-v3,Push-v3", obs, d, -np.ones(d, np.float32), np.ones(d, np.float32), 50,
                 True, 1 if pixels else TASKS, chunk)


def make(name: str, chunk: int = 1, decode: str = "parallel"):
  from policies.cnn import CNNPolicy
  from policies.flow import FlowPolicy
  from policies.mlp import MLPPolicy
  from policies.vla import VLAPolicy
  if name == "mlp":
    return MLPPolicy(spec(chunk), hidden=(16, 16))
  if name == "cnn":
    return CNNPolicy(spec(pixels=True), channels=(4, 4), hidden=(16,))
  if name == "vla":
    return VLAPolicy(spec(chunk), chunk_size=chunk, bins=16, width=16, depth=1, heads=2, decode=decode,
                     instructions=["reach the goal", "push the puck"])
  return FlowPolicy(spec(chunk), chunk_size=chunk, steps=2, hidden=(16, 16), critic_hidden=(8,),
                    instructions=("reach the goal", "push the puck"))


def batch(policy, n: int = 5, seed: int = 0):
  rng = np.random.default_rng(seed)
  s = policy.spec
  obs = {"state": rng.normal(1.0, 2.0, (n, STATE)).astype(np.float32)}
  if "task" in s.obs:
    obs["task"] = np.eye(TASKS, dtype=np.float32)[rng.integers(0, TASKS, n)]
  if "pixels" in s.obs:
    obs["pixels"] = rng.integers(0, 256, (n, 3, 16, 16)).astype(np.uint8)
  actions = rng.uniform(-1, 1, (n, s.action_dim)).astype(np.float32)
  mask = np.ones_like(actions)
  mask[0, A:] = 0.0  # The first row's chunk was cut by its episode's end (a no-op without chunks).
  return obs, actions, mask


def fitted(policy, obs, seed=0):
  params = policy.init(jax.random.key(seed))
  return policy.update_normalizer(params, {k: jnp.asarray(v) for k, v in obs.items()}, jnp.ones(len(obs["state"])))


def np_normalize(stats, x):
  return np.clip((x - np.asarray(stats.mean)) / np.sqrt(np.asarray(stats.var) + 1e-8), -10, 10)


def np_torso(tree, x):
  """The tanh MLP of policies/mlp.py in NumPy."""
  layers = sorted(tree, key=lambda n: int(n.split("_")[1]))
  for i, name in enumerate(layers):
    x = x @ np.asarray(tree[name]["kernel"]) + np.asarray(tree[name]["bias"])
    if i < len(layers) - 1:
      x = np.tanh(x)
  return x


def np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


# ----------------------------------------------------------------------------- each loss against NumPy


@pytest.mark.parametrize("chunk", [1, 2])
def test_mlp_gaussian_nll_against_numpy(chunk):
  policy = make("mlp", chunk)
  obs, actions, mask = batch(policy)
  params = fitted(policy, obs)
  x = np_normalize(params["obs_norm"], np.concatenate([obs["state"], obs["task"]], -1))
  mean = np_torso(params["net"]["actor"], x)
  log_std = np.asarray(params["net"]["log_std"])
  nll = 0.5 * ((actions - mean) / np.exp(log_std)) ** 2 + log_std + 0.5 * _LOG_2PI
  want = float((nll * mask).sum() / len(actions))
  got = float(losses.gaussian_nll(policy, params, obs, jnp.asarray(actions), jnp.asarray(mask)))
  np.testing.assert_allclose(got, want, rtol=2e-5)


def test_cnn_gaussian_nll_against_numpy():
  policy = make("cnn")
  obs, actions, mask = batch(policy)
  params = fitted(policy, obs)
  mean, log_std, _ = (np.asarray(x) for x in policy._forward(params, obs))
  nll = 0.5 * ((actions - mean) / np.exp(log_std)) ** 2 + log_std + 0.5 * _LOG_2PI
  got = float(losses.gaussian_nll(policy, params, obs, jnp.asarray(actions), jnp.asarray(mask)))
  np.testing.assert_allclose(got, float(nll.sum() / len(actions)), rtol=2e-5)


@pytest.mark.parametrize("decode,chunk", [("parallel", 1), ("parallel", 2), ("autoregressive", 2)])
def test_vla_token_cross_entropy_against_numpy(decode, chunk):
  policy = make("vla", chunk, decode)
  obs, actions, mask = batch(policy)
  params = fitted(policy, obs)
  tokens = np.clip(np.floor((np.clip(actions, -1, 1) + 1) / (2 / 16)), 0, 15).astype(np.int32)  # 16 bins on [-1, 1].
  logits, _ = policy._net.apply({"params": params["net"]}, *policy._net_inputs(params, obs), jnp.asarray(tokens))
  logp = np_log_softmax(np.asarray(logits, np.float64))
  nll = -np.take_along_axis(logp, tokens[..., None], -1)[..., 0]
  want = float((nll * mask).sum() / mask.sum())
  got = float(losses.token_cross_entropy(policy, params, obs, jnp.asarray(actions), jnp.asarray(mask)))
  np.testing.assert_allclose(got, want, rtol=2e-5)
  if decode == "autoregressive":  # Teacher forcing: another token before the last changes the last's loss.
    other = tokens.copy()
    other[:, 0] = (other[:, 0] + 5) % 16
    logits2, _ = policy._net.apply({"params": params["net"]}, *policy._net_inputs(params, obs), jnp.asarray(other))
    assert not np.allclose(np.asarray(logits2)[:, -1], np.asarray(logits)[:, -1])


@pytest.mark.parametrize("chunk", [1, 2])
def test_flow_matching_against_numpy(chunk):
  policy = make("flow", chunk)
  obs, actions, mask = batch(policy)
  params = fitted(policy, obs)
  key = jax.random.key(3)
  x0, t = (np.asarray(v, np.float64) for v in losses.flow_noise(key, len(actions), policy.chunk_dim))
  xt = (1 - t[:, None]) * x0 + t[:, None] * actions  # MetaWorld's box is [-1, 1]: chain units are env units.
  obs_x = policy.normalized_obs(params, obs)
  v = np.asarray(policy.velocity(params, obs_x, jnp.asarray(xt, jnp.float32), jnp.asarray(t, jnp.float32)))
  want = float((((v - (actions - x0)) ** 2) * mask).sum() / mask.sum())
  got = float(losses.flow_matching(policy, params, obs, jnp.asarray(actions), jnp.asarray(mask), key))
  np.testing.assert_allclose(got, want, rtol=5e-5)
  if chunk == 1:  # Unmasked, it is the policy's own flow_matching_loss.
    ones = jnp.ones_like(jnp.asarray(actions))
    np.testing.assert_allclose(float(losses.flow_matching(policy, params, obs, jnp.asarray(actions), ones, key)),
                               float(policy.flow_matching_loss(params, obs, jnp.asarray(actions), key)), rtol=1e-6)


# ----------------------------------------------------------------------------- chunks and batches


def test_chunks_stay_within_their_episode_and_mask_the_tail():
  actions = np.arange(8, dtype=np.float32).reshape(4, 2)
  chunks, mask = data_lib.chunk_actions(actions, 3)
  np.testing.assert_array_equal(chunks[0], [0, 1, 2, 3, 4, 5])
  np.testing.assert_array_equal(chunks[2], [4, 5, 6, 7, 6, 7])  # Padded with the last action...
  np.testing.assert_array_equal(mask[2], [1, 1, 1, 1, 0, 0])  # ...which the mask drops.
  np.testing.assert_array_equal(mask[3], [1, 1, 0, 0, 0, 0])
  one, ones = data_lib.chunk_actions(actions, 1)
  np.testing.assert_array_equal(one, actions)
  assert ones.all()


def test_demo_rows_past_the_cap_are_thinned_evenly_across_tasks(tmp_path):
  """The RL update's demo term holds at most max_rows rows: more recorded steps than that are thinned
  to evenly spaced rows (every task keeps its share, rows stay whole), never refused or truncated."""
  from ebrl.demos.rows import all_rows  # pylint: disable=g-import-not-at-top
  demos = open_demos(str(write_demos(tmp_path, episodes=8, length=12)))
  full = all_rows(demos, 2, max_rows=1000)
  assert len(full["actions"]) == 96
  thin = all_rows(demos, 2, max_rows=30)
  assert len(thin["actions"]) == 30 == len(thin["mask"]) == len(thin["obs"]["state"])
  # Each thinned row is one whole row of the full set: observation, chunk and mask together.
  index = {row.tobytes(): i for i, row in enumerate(full["obs"]["state"])}
  picked = np.array([index[row.tobytes()] for row in thin["obs"]["state"]])
  np.testing.assert_array_equal(thin["actions"], full["actions"][picked])
  np.testing.assert_array_equal(thin["mask"], full["mask"][picked])
  assert np.all(np.diff(picked) >= 3) and picked[0] == 0 and picked[-1] == 95  # Spread over all of it.
  share = np.bincount(thin["obs"]["task"].argmax(-1), minlength=TASKS) / 30
  np.testing.assert_allclose(share, np.full(TASKS, 1 / TASKS), atol=0.05)


def _episode(rng, task: int, length: int, index: int, w: np.ndarray) -> dict:
  """An expert whose action is a fixed function of the state and task: learnable."""
  state = rng.normal(size=(length + 1, STATE)).astype(np.float32)
  onehot = np.tile(np.eye(TASKS, dtype=np.float32)[task], (length + 1, 1))
  actions = np.tanh(state[:-1] @ w + (0.5 if task else -0.5)).astype(np.float32)
  return dict(obs={"state": state[:-1], "task": onehot[:-1]}, final_obs={"state": state[-1], "task": onehot[-1]},
              actions=actions, expert_actions=actions, rewards=np.zeros(length, np.float32),
              success=np.zeros(length, np.float32), episode_task=task, episode_instruction=task,
              episode_success=True, episode_return=0.0, episode_env=task, episode_index=index)


def write_demos(directory, episodes: int = 8, length: int = 12, state_dim: int = STATE, version=FORMAT_VERSION,
                env="MetaWorld/MT:Reach-v3,Push-v3", pixels: bool = False, edit=None):
  """A demo directory; `edit(rng, episode)` may change each episode record before it is written."""
  rng = np.random.default_rng(0)
  w = rng.normal(0, 0.7, (STATE, A)).astype(np.float32)
  eps = [_episode(rng, i % TASKS, length, i // TASKS, w) for i in range(episodes)]
  if edit is not None:
    for e in eps:
      edit(rng, e)
  if state_dim != STATE:
    for e in eps:
      e["obs"]["state"] = np.zeros((length, state_dim), np.float32)
      e["final_obs"]["state"] = np.zeros(state_dim, np.float32)
  os.makedirs(directory / fmt.SHARD_DIR, exist_ok=True)
  fmt.write_npz(str(directory / fmt.shard_name(0)), fmt.pack_shard(eps))
  by_task = {t: dict(episodes=episodes // 2, successes=episodes // 2, expert_success=1.0, kept=episodes // 2,
                     steps=episodes // 2 * length) for t in ("Reach-v3", "Push-v3")}
  observation = {"state": dict(shape=[state_dim], dtype="float32"), "task": dict(shape=[TASKS], dtype="float32")}
  if pixels:  # As a recording with --from_pixels lists them (only the manifest is read before the check).
    observation = {"pixels": dict(shape=[3, 64, 64], dtype="uint8"), **observation}
  fmt.write_manifest(str(directory), dict(
      format=FORMAT, version=version, env=env, tasks=["Reach-v3", "Push-v3"],
      instructions=["reach the goal", "push the puck"],
      observation=observation,
      action=dict(dim=A, dtype="float32", low=[-1] * A, high=[1] * A), seed=0, envs_per_task=2, by_task=by_task,
      episodes=episodes, steps=episodes * length,
      shards=[dict(file=fmt.shard_name(0), episodes=episodes, steps=episodes * length)]))
  return directory


def test_batches_are_fixed_size_seeded_and_chunked(tmp_path):
  demos = open_demos(str(write_demos(tmp_path)))
  a = [next(it) for it in [data_lib.batches(demos, 2, 20, seed=1)] for _ in range(12)]
  b = [next(it) for it in [data_lib.batches(demos, 2, 20, seed=1)] for _ in range(12)]
  assert all(x["actions"].shape == (20, 2 * A) and x["obs"]["state"].shape == (20, STATE) for x in a)
  np.testing.assert_array_equal(np.concatenate([x["actions"] for x in a]), np.concatenate([x["actions"] for x in b]))
  first = [r for x in a[:4] for r in x["mask"]]  # The first 80 rows are 80 of the 96 steps, drawn once each.
  assert sum(not m[A:].any() for m in first) <= 8  # At most the 8 episodes' last steps are cut chunks.


# ----------------------------------------------------------------------------- std and observation statistics


NOISE = np.array([0.05, 0.4], np.float32)  # The linear expert's per-dim noise std.


def _linear_expert(rng, e):
  """actions = W s + noise of a known per-dim std (W fixed by its seed)."""
  w = np.random.default_rng(7).normal(0, 0.3, (STATE, A)).astype(np.float32)
  e["actions"] = (e["obs"]["state"] @ w + rng.normal(size=e["actions"].shape) * NOISE).astype(np.float32)
  e["expert_actions"] = e["actions"]


@pytest.mark.parametrize("chunk", [1, 2])
def test_closed_form_std_is_the_residual_rms_clipped(tmp_path, chunk):
  demos = open_demos(str(write_demos(tmp_path, episodes=6, length=9, edit=_linear_expert)))
  policy = make("mlp", chunk)
  params = data_lib.fit_normalizer(policy, policy.init(jax.random.key(0)), demos)
  # The mean of a briefly trained net (any fitted mean will do: the std is the ML one given it).
  cfg = SFTConfig(steps=20, batch_size=16, learning_rate=1e-2, log_every=10)
  params, _ = train(policy, params, data_lib.batches(demos, chunk, 16), cfg, jax.random.key(1), progress=False)
  # Independently in NumPy: every row's chunk, the mean from the net's weights, the masked residual RMS.
  sq, n = np.zeros(A * chunk), np.zeros(A * chunk)
  for e in demos.episodes():
    chunks, mask = data_lib.chunk_actions(np.asarray(e.actions, np.float64), chunk)
    x = np_normalize(params["obs_norm"], np.concatenate([e.obs["state"], e.obs["task"]], -1).astype(np.float64))
    mean = np_torso(jax.tree.map(lambda v: np.asarray(v, np.float64), params["net"]["actor"]), x)
    sq += (mask * (chunks - mean) ** 2).sum(0)
    n += mask.sum(0)
  want = np.sqrt(sq / n)
  # Batches of 7 over buffers of 20 rows: padding and several buffers take part.
  fitted_params, std = data_lib.fit_action_std(policy, params, demos, chunk, batch_size=7, buffer_steps=20)
  np.testing.assert_allclose(std, want, rtol=1e-5)
  np.testing.assert_allclose(np.exp(np.asarray(fitted_params["net"]["log_std"], np.float64)), want, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(fitted_params["net"]["actor"]), jax.tree.leaves(params["net"]["actor"])):
    np.testing.assert_array_equal(a, b)  # Only the std moves.
  lo, hi = float(np.sort(want)[0]) * 1.5, float(np.sort(want)[-1]) * 0.9
  _, clipped = data_lib.fit_action_std(policy, params, demos, chunk, min_std=lo, max_std=hi)
  np.testing.assert_allclose(clipped, np.clip(want, lo, hi), rtol=1e-5)
  assert clipped.min() == pytest.approx(lo) and clipped.max() == pytest.approx(hi)


def test_observation_variance_is_clamped_at_obs_min_std(tmp_path):
  def constant_dims(rng, e):
    e["obs"]["state"][:, 0] = 3.0  # Constant in the demos.
    e["obs"]["state"][:, 1] = 1.0 + 1e-4 * rng.normal(size=len(e["actions"]))  # Nearly constant.
  demos = open_demos(str(write_demos(tmp_path, edit=constant_dims)))
  policy = make("mlp")
  state = np.concatenate([e.obs["state"] for e in demos.episodes()]).astype(np.float64)
  stats = data_lib.fit_normalizer(policy, policy.init(jax.random.key(0)), demos, min_std=0.05)["obs_norm"]
  var = np.asarray(stats.var)
  np.testing.assert_allclose(var[:2], [0.05**2, 0.05**2], rtol=1e-6)
  np.testing.assert_allclose(var[2:STATE], state[:, 2:].var(0), rtol=1e-4)
  np.testing.assert_allclose(np.asarray(stats.mean)[:STATE], state.mean(0), atol=1e-5)
  with pytest.raises(ValueError, match="must be positive"):
    data_lib.fit_normalizer(policy, policy.init(jax.random.key(0)), demos, min_std=0.0)


# ----------------------------------------------------------------------------- early stopping


def test_early_stop_keeps_the_best_evaluation_ties_the_later(tmp_path):
  demos = open_demos(str(write_demos(tmp_path)))
  policy = make("mlp")
  params = data_lib.fit_normalizer(policy, policy.init(jax.random.key(0)), demos)
  script, seen = [0.2, 0.5, 0.5, 0.3, 0.9, 0.9], {}

  def evaluate(p):
    step = 5 * (len(seen) + 1)
    seen[step] = jax.tree.map(np.array, p["net"])
    return {"success_rate": script[len(seen) - 1], "episodes": 2}

  cfg = SFTConfig(steps=30, batch_size=16, learning_rate=3e-3, log_every=30, eval_every=5, early_stop=True,
                  patience=2)
  out, history = train(policy, params, data_lib.batches(demos, 1, 16), cfg, jax.random.key(1), evaluate=evaluate,
                       progress=False)
  # 0.5 at step 10; the tie at 15 is kept (the later) but is no improvement, nor is 0.3 at 20: patience 2 ends it.
  assert [e["step"] for e in history["evals"]] == [5, 10, 15, 20]
  assert history["kept_step"] == 15 and history["steps_run"] == 20 and len(history["loss"]) == 20
  assert np.all(history["loss"] > 0)  # Every step's loss was synced, though 20 ends no log interval of 30.
  for a, b in zip(jax.tree.leaves(out["net"]), jax.tree.leaves(seen[15])):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(seen[15]["actor"]["Dense_0"]["kernel"], seen[20]["actor"]["Dense_0"]["kernel"])
  # Held-out success 1.0 stops at once and keeps that evaluation's params.
  seen.clear()
  script[:] = [0.5, 1.0, 0.0]
  out, history = train(policy, params, data_lib.batches(demos, 1, 16), cfg, jax.random.key(1), evaluate=evaluate,
                       progress=False)
  assert history["kept_step"] == 10 == history["steps_run"] and len(history["evals"]) == 2
  # Without early stopping the last params are kept.
  seen.clear()
  script[:] = [0.9, 0.1, 0.1]
  _, history = train(policy, params, data_lib.batches(demos, 1, 16),
                     SFTConfig(steps=15, batch_size=16, learning_rate=3e-3, log_every=5, eval_every=5),
                     jax.random.key(1), evaluate=evaluate, progress=False)
  assert history["kept_step"] == 15 == history["steps_run"]


# ----------------------------------------------------------------------------- the learning-rate schedule


def test_a_cosine_schedule_decays_the_rate_to_zero_and_its_first_step_is_the_constant_rate(tmp_path):
  demos = open_demos(str(write_demos(tmp_path)))
  policy = make("mlp")
  params = data_lib.fit_normalizer(policy, policy.init(jax.random.key(0)), demos)

  def run(steps, schedule, rows=None):
    cfg = SFTConfig(steps=steps, batch_size=16, learning_rate=3e-3, lr_schedule=schedule, log_every=1)
    out, _ = train(policy, params, data_lib.batches(demos, 1, 16, seed=0), cfg, jax.random.key(1),
                   write=None if rows is None else rows.append, progress=False)
    return jax.tree.leaves(out["net"])

  rows = []
  run(8, "cosine", rows)
  # Row `step` reports the rate its last Adam step used: step i (from 0) of n runs at lr (1 + cos(pi i / n)) / 2.
  want = [3e-3 * 0.5 * (1 + np.cos(np.pi * i / 8)) for i in range(8)]
  np.testing.assert_allclose([r["learning_rate"] for r in rows], want, rtol=1e-5)
  assert rows[-1]["learning_rate"] < 0.04 * 3e-3
  for a, b in zip(run(1, "cosine"), run(1, "constant")):  # Step 0: the full rate, the same update.
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(run(3, "cosine"), run(3, "constant")))
  with pytest.raises(ValueError, match="lr_schedule='linear' must be one of: constant, cosine"):
    run(1, "linear")


# ----------------------------------------------------------------------------- the env from the manifest


def test_the_env_comes_from_the_manifest_unless_given(tmp_path):
  from ebrl.sft.run import demo_env
  from launch.configs import default
  d = write_demos(tmp_path / "demos", env="MetaWorld/MT:Reach-v3,Push-v3")
  cfg = demo_env(default.get_config(), str(d), env_given=False)
  assert cfg.env.name == "MetaWorld/MT:Reach-v3,Push-v3" and resolve(cfg).tasks == ("Reach-v3", "Push-v3")
  assert demo_env(default.get_config(), str(d), env_given=True).env.name == "MetaWorld/Reach-v3"


# ----------------------------------------------------------------------------- the loss falls


@pytest.mark.parametrize("name,chunk,decode", [("mlp", 1, "parallel"), ("cnn", 1, "parallel"),
                                               ("vla", 2, "parallel"), ("vla", 2, "autoregressive"),
                                               ("flow", 2, "parallel")])
def test_the_loss_falls_on_a_tiny_dataset(tmp_path, name, chunk, decode):
  policy = make(name, chunk, decode)
  if name == "cnn":  # Pixels: hand-made rows in the batch layout (the demo format's pixels need a render stage).
    def pixel_batches():
      rng = np.random.default_rng(0)
      pix = rng.integers(0, 256, (32, 3, 16, 16)).astype(np.uint8)
      state = rng.normal(size=(32, STATE)).astype(np.float32)
      act = np.tanh(pix[:, 0, :2, 0].astype(np.float32) / 64 - 2)
      while True:
        idx = rng.integers(0, 32, 16)
        yield {"obs": {"pixels": pix[idx], "state": state[idx]}, "actions": act[idx], "mask": np.ones((16, A))}
    data = pixel_batches()
    params = fitted(policy, {"state": np.zeros((1, STATE), np.float32)})
  else:
    demos = open_demos(str(write_demos(tmp_path)))
    params = data_lib.fit_normalizer(policy, policy.init(jax.random.key(0)), demos)
    data = data_lib.batches(demos, chunk, 16, seed=0)
  cfg = SFTConfig(steps=40, batch_size=16, learning_rate=3e-3, log_every=10,
                  frozen=("log_std",) if name in ("mlp", "cnn") else ())
  rows = []
  out, history = train(policy, params, data, cfg, jax.random.key(1), write=rows.append, progress=False)
  loss = history["loss"]
  assert loss.shape == (40,) and np.all(np.isfinite(loss))
  assert loss[-10:].mean() < 0.95 * loss[:10].mean(), loss
  assert [r["step"] for r in rows] == [10, 20, 30, 40]
  if name in ("mlp", "cnn"):
    np.testing.assert_array_equal(out["net"]["log_std"], params["net"]["log_std"])  # Frozen.
  for a, b in zip(jax.tree.leaves(out["obs_norm"]), jax.tree.leaves(params["obs_norm"])):
    np.testing.assert_array_equal(a, b)  # Set from the demos before training, then left alone.


# ----------------------------------------------------------------------------- bad input: one line, exit 2


def _run_sft(args):
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu", "JAX_LOG_COMPILES": "1"}
  return subprocess.run([sys.executable, "-m", "launch.sft", *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=180)


@pytest.mark.parametrize("case,expected", [
    ("empty", "is empty; record one with python -m launch.demos"),
    ("other_version", f"is {FORMAT} version 2; this EBRL reads version {FORMAT_VERSION}"),
    ("shapes", "observe state (7,) float32, task (2,) float32; env 'MetaWorld/MT:Reach-v3,Push-v3' observes "
               "state (39,) float32"),
    ("keys", "observe pixels (3, 64, 64) uint8, state (39,) float32, task (2,) float32; env "
             "'MetaWorld/MT:Reach-v3,Push-v3' observes state (39,) float32, task (2,) float32"),
    ("other_env", "were recorded on 'MetaWorld/MT:Reach-v3,Push-v3'; --config.env.name is 'MetaWorld/Reach-v3'"),
    # No --config.env.name: the demos' env is taken, so the check that fails is the next one.
    ("env_from_manifest", "observe state (7,) float32, task (2,) float32; env 'MetaWorld/MT:Reach-v3,Push-v3' "
                          "observes state (39,) float32"),
])
def test_bad_demos_are_one_line_exit_2_before_a_compile(tmp_path, case, expected):
  d = tmp_path / "demos"
  d.mkdir()
  flags = ["--config.env.name=MetaWorld/MT:Reach-v3,Push-v3", "--config.num_envs=2"]
  if case == "other_version":
    write_demos(d, version=2)
  elif case == "shapes":
    write_demos(d, state_dim=7)
  elif case == "keys":  # Recorded with pixels; the run has none.
    write_demos(d, state_dim=39, pixels=True)
  elif case == "other_env":
    write_demos(d, state_dim=39)
    flags = ["--config.env.name=MetaWorld/Reach-v3"]  # The default's value, but given.
  elif case == "env_from_manifest":
    write_demos(d, state_dim=7)
    flags = []
  proc = _run_sft([f"--demos={d}", f"--out={tmp_path / 'sft'}", "--steps=5", *flags])
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip() and "Compiling" not in l]
  assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], proc.stderr[-3000:]
  assert "Compiling" not in proc.stderr + proc.stdout and "Traceback" not in proc.stderr
  assert not (tmp_path / "sft" / "params").exists()


@pytest.mark.parametrize("args,expected", [
    (["--fit_std=exact"], "--fit_std"),
    (["--obs_min_std=0"], "--obs_min_std=0.0 must be a positive number"),
    (["--eval_every=0", "--early_stop"], "--early_stop=True keeps the best held-out evaluation: it needs --eval_every > 0"),
    (["--patience=0"], "--patience=0 must be positive"),
    (["--train_log_std", "--fit_std=none"], "--train_log_std=True (--fit_std=gradient) contradicts --fit_std=none"),
    (["--lr_schedule=linear"], "--lr_schedule"),
    (["--init=/no/such/dir"], "--init='/no/such/dir' is not a directory"),
])
def test_bad_sft_flags_are_one_line_exit_2(tmp_path, args, expected):
  proc = _run_sft([f"--demos={tmp_path}", f"--out={tmp_path / 'sft'}", *args])
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], proc.stderr[-3000:]


# ----------------------------------------------------------------------------- a recording, SFT, then RL


def tiny_cfg(env: str = "MetaWorld/Reach-v3"):
  from launch.configs import default
  cfg = default.get_config()
  cfg.env.name = env
  cfg.env.max_episode_steps = 25
  cfg.num_envs = 2
  cfg.rollout_length = 8
  cfg.total_env_steps = 16
  cfg.scheduler = "sync"
  cfg.policy.hidden = (16, 16)
  cfg.algorithm.epochs = 1
  cfg.algorithm.num_minibatches = 2
  cfg.checkpoint_every_s = 1e9
  return cfg


@pytest.fixture(scope="module")
def reach_demos(tmp_path_factory):
  """Four short Reach-v3 expert episodes recorded through launch.demos' recorder."""
  from ebrl.demos.recorder import RecordRequest, record
  out = tmp_path_factory.mktemp("reach") / "demos"
  record(RecordRequest(env="MetaWorld/Reach-v3", episodes_per_task=4, out=str(out), envs_per_task=2,
                       max_episode_steps=25, keep_failed=True, num_threads=1), progress=False)
  return out


def test_pretrained_params_warm_start_rl_bit_identically(reach_demos, tmp_path):
  from ebrl.sft import SFTRun, pretrain
  from ebrl.trainer import Trainer

  cfg = tiny_cfg()
  cfg.policy.min_std, cfg.policy.max_std = 0.05, 0.5
  run = SFTRun(demos=str(reach_demos), out=str(tmp_path / "sft"), eval_episodes=2, progress=False,
               train=SFTConfig(steps=30, batch_size=16, learning_rate=3e-3, eval_every=15, log_every=10))
  params, meta = pretrain(resolve(cfg), run)
  assert meta["loss_last"] < meta["loss_first"] and [e["step"] for e in meta["held_out"]] == [15, 30]
  # The std in closed form, within the bounds, is what the params carry and sft.json records.
  std = np.exp(np.asarray(params["net"]["log_std"], np.float64))
  assert meta["fit_std"] == "closed_form" and len(meta["action_std"]) == 4
  np.testing.assert_allclose(meta["action_std"], std, rtol=1e-6)
  assert np.all((std >= 0.05 - 1e-7) & (std <= 0.5 + 1e-7)) and np.any(std != 1.0)
  assert meta["kept_step"] == meta["steps_run"] == 30
  final = meta["held_out_final"]
  assert set(final) == {"mean", "sample"} and all(0.0 <= final[m]["success_rate"] <= 1.0 for m in final)
  assert final["sample"]["success_rate"] == meta["held_out"][-1]["success_rate"] and "success_ci95" in final["mean"]
  saved = json.loads((tmp_path / "sft" / "sft.json").read_text())
  assert saved["held_out_final"] == final and saved["action_std"] == meta["action_std"]
  assert meta["held_out"][-1]["episodes"] == 2 and 0.0 <= meta["final_success_rate"] <= 1.0
  assert float(params["obs_norm"].count) == open_demos(str(reach_demos)).num_steps
  rows = [json.loads(l) for l in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "loss" in r] == [10, 20, 30]
  assert [r["step"] for r in rows if "eval_success_rate" in r] == [15, 30]
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "sft" / "tb"))
  cfg.warm_start = str(tmp_path / "sft")
  trainer = Trainer(cfg, str(tmp_path / "rl"), progress=False)
  try:
    got, want = jax.tree.leaves(trainer.state.params), jax.tree.leaves(params)
    assert jax.tree.structure(trainer.state.params) == jax.tree.structure(params)
    for a, b in zip(got, want):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  finally:
    trainer.envs.close()


def test_init_continues_from_saved_params_keeping_their_observation_statistics(reach_demos, tmp_path):
  """A second run with `init` starts where the first ended (its loss, not a fresh init's) and keeps the
  first run's observation statistics bit for bit, though they are not the ones these demos would give."""
  from ebrl import warm_start
  from ebrl.sft import SFTRun, pretrain

  cfg = tiny_cfg()
  first = SFTRun(demos=str(reach_demos), out=str(tmp_path / "a"), eval_episodes=1, progress=False,
                 train=SFTConfig(steps=40, batch_size=16, learning_rate=3e-3, log_every=10))
  params_a, meta_a = pretrain(resolve(cfg), first)
  shifted = {**params_a, "obs_norm": params_a["obs_norm"].replace(mean=params_a["obs_norm"].mean + 0.25)}
  warm_start.save_params(str(tmp_path / "shifted"), shifted)
  second = SFTRun(demos=str(reach_demos), out=str(tmp_path / "b"), eval_episodes=1, progress=False,
                  init=str(tmp_path / "a"), train=SFTConfig(steps=10, batch_size=16, learning_rate=1e-4,
                                                            lr_schedule="cosine", log_every=5))
  _, meta_b = pretrain(resolve(cfg), second)
  assert meta_b["init"] == str(tmp_path / "a") and meta_b["lr_schedule"] == "cosine"
  assert meta_b["loss_first"] < 0.5 * meta_a["loss_first"] and meta_b["loss_first"] < 1.5 * meta_a["loss_last"]
  third = dataclasses.replace(second, out=str(tmp_path / "c"), init=str(tmp_path / "shifted"))
  params_c, _ = pretrain(resolve(cfg), third)
  for a, b in zip(jax.tree.leaves(params_c["obs_norm"]), jax.tree.leaves(shifted["obs_norm"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_an_init_of_another_policy_is_one_line_exit_2_before_a_compile(reach_demos, tmp_path):
  from ebrl import warm_start
  warm_start.save_params(str(tmp_path / "other"), {"net": {"w": np.zeros((3, 3), np.float32)}})
  proc = _run_sft([f"--demos={reach_demos}", f"--out={tmp_path / 'sft'}", f"--init={tmp_path / 'other'}",
                   "--steps=5", "--config.env.max_episode_steps=25"])
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip() and not l.startswith(("W", "I"))]
  assert len(lines) == 1 and lines[0].startswith("error: --init: warm-start params in"), proc.stderr[-3000:]
  assert "do not match the policy" in lines[0]
  assert "Compiling" not in proc.stderr + proc.stdout and "Traceback" not in proc.stderr
  assert not (tmp_path / "sft" / "params").exists()


@pytest.mark.slow  # The slowest family through the CLI; the loss of each family is checked in-process by default.
def test_cli_pretrains_a_chunked_autoregressive_vla(reach_demos, tmp_path):
  out = tmp_path / "sft"
  proc = _run_sft([f"--demos={reach_demos}", f"--out={out}", "--steps=20", "--batch_size=16", "--eval_every=10",
                   "--eval_episodes=2", "--learning_rate=1e-3", "--config.policy.name=vla",
                   "--config.policy.decode=autoregressive", "--config.policy.chunk_size=2",
                   "--config.policy.width=16", "--config.policy.depth=1", "--config.policy.heads=2",
                   "--config.policy.bins=32", "--config.env.max_episode_steps=25"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Compiling" in proc.stderr  # The no-compile check above would see one.
  meta = json.loads((out / "sft.json").read_text())
  assert meta["loss"] == "token_cross_entropy" and meta["chunk_size"] == 2
  assert [e["step"] for e in meta["held_out"]] == [10, 20]
  assert "held-out success at step 20:" in proc.stdout and (out / "params").is_dir()


def test_the_finetune_recipe_runs_from_sft_to_rl_keeping_the_demo_statistics(reach_demos, tmp_path):
  """launch/configs/finetune.py end to end at tiny sizes: pre-training with its std bounds, then RL from
  it with every knob of the recipe on (frozen statistics, the demonstration term reading the warm
  start's demos, actor and critic optimisers, the warm-up by explained variance, success-aligned
  rewards): the observation statistics leave RL bit-identical, the demonstration term is in the
  update, and summary.json has both evaluation modes before and after."""
  from ebrl.sft import SFTRun, pretrain
  from launch.configs import finetune
  from tiny_configs import run_to_end  # pylint: disable=g-import-not-at-top

  recipe = finetune.get_config()
  cfg = tiny_cfg()
  for section in ("policy", "algorithm"):  # The recipe's fine-tuning knobs over the tiny sizes.
    for key in ("min_std", "max_std", "obs_norm_update", "actor_learning_rate", "critic_learning_rate",
                "critic_warmup_updates", "critic_warmup_ev", "bc_coef", "bc_decay", "clip_eps"):
      if key in recipe[section]:
        cfg[section][key] = recipe[section][key]
  cfg.env.end_on_success, cfg.env.success_bonus = recipe.env.end_on_success, recipe.env.success_bonus
  cfg.algorithm.bc_batch_size = 16
  cfg.algorithm.bc_demos = str(reach_demos)  # launch.sft sets it from --demos; RL reads it from sft.json.
  cfg.eval_episodes = 2
  run = SFTRun(demos=str(reach_demos), out=str(tmp_path / "sft"), eval_episodes=2, progress=False,
               train=SFTConfig(steps=20, batch_size=16, learning_rate=3e-3, log_every=10))
  params, meta = pretrain(resolve(cfg), run)
  assert all(recipe.policy.min_std - 1e-7 <= s <= recipe.policy.max_std + 1e-7 for s in meta["action_std"])
  cfg.algorithm.bc_demos = ""
  cfg.warm_start = str(tmp_path / "sft")
  cfg.total_env_steps = 48
  trainer, summary = run_to_end(cfg, tmp_path / "rl")
  state = trainer.state
  for a, b in zip(jax.tree.leaves(state.params["obs_norm"]), jax.tree.leaves(params["obs_norm"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  rows = [json.loads(l) for l in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
  trained = [r for r in rows if "bc_loss" in r]
  assert trained and all(np.isfinite(r["bc_loss"]) and r["bc_weight"] > 0 for r in trained)
  assert all(r["critic_learning_rate"] == pytest.approx(recipe.algorithm.critic_learning_rate) for r in trained)
  for when in ("success_before", "success_after"):
    assert set(summary[when]) == {"mean", "sample"}
    assert all(0.0 <= summary[when][m]["success_rate"] <= 1.0 for m in ("mean", "sample"))
