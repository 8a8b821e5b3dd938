"""The flow policy's chain log-likelihood is exact, consistent and trainable (tiny shapes)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from policies.flow import FlowPolicy
from sim_adapters.base import EnvSpec, ObsSpec

S_DIM, A, K, STEPS = 5, 2, 2, 3
D = K * A
# A non-unit box so the affine map onto the bounds is exercised: center (0, 0.75), half range (2, 0.25), log-det != 0.
LOW, HIGH = np.tile([-2.0, 0.5], K).astype(np.float32), np.tile([2.0, 1.0], K).astype(np.float32)


def _policy(**kw) -> FlowPolicy:
  spec = EnvSpec("tiny", {"state": ObsSpec((S_DIM,), np.float32), "task": ObsSpec((3,), np.float32)}, D, LOW, HIGH,
                 10, False, num_tasks=3)
  return FlowPolicy(spec, chunk_size=K, steps=STEPS, hidden=(16, 16), critic_hidden=(16, 16), **kw)


def _obs(b: int, seed: int = 0) -> dict[str, jax.Array]:
  rng = np.random.default_rng(seed)
  task = np.eye(3, dtype=np.float32)[rng.integers(0, 3, b)]
  return {"state": jnp.asarray(rng.normal(1.0, 2.0, (b, S_DIM)), jnp.float32), "task": jnp.asarray(task)}


def _params(policy: FlowPolicy, seed: int = 0):
  """Random net, non-trivial obs stats and per-dim noise scales (so no test passes by symmetry)."""
  params = policy.init(jax.random.key(seed))
  params = policy.update_normalizer(params, _obs(64, seed + 1), jnp.ones(64))
  raw = jax.random.normal(jax.random.key(seed + 2), params["net"]["noise_raw"].shape)
  return {**params, "net": {**params["net"], "noise_raw": raw}}


def _center_half():
  return 0.5 * (HIGH + LOW), 0.5 * (HIGH - LOW)


def test_sample_evaluate_consistent_and_jit():
  policy = _policy()
  params, obs = _params(policy), _obs(8)
  action, logp, value, _ = jax.jit(policy.sample)(params, obs, jax.random.key(3))
  assert policy.action_size == (STEPS + 1) * D and action.shape == (8, policy.action_size)
  assert logp.shape == value.shape == (8,)
  logp2, ent, value2 = jax.jit(policy.evaluate)(params, obs, action)
  assert ent.shape == (8,) and np.all(np.isfinite(ent))
  np.testing.assert_allclose(logp2, logp, rtol=1e-5, atol=1e-3)
  np.testing.assert_allclose(value2, value, rtol=1e-6)
  # Eager against jitted: XLA may order the critic's sums differently (a few float32 ulps of the layers'
  # partial sums); a wrong critic or input differs by orders of magnitude more.
  np.testing.assert_allclose(policy.value(params, obs), value, rtol=1e-6, atol=1e-6)


def test_evaluate_takes_a_segment_batchs_leading_axes():
  """The async learner evaluates a [T, S] segment batch whole: the same numbers as the [T * S] rows."""
  policy = _policy()
  params, obs = _params(policy), _obs(12, seed=4)
  action, _, _, _ = jax.jit(policy.sample)(params, obs, jax.random.key(5))
  rows = policy.evaluate(params, obs, action)
  grid = policy.evaluate(params, jax.tree.map(lambda x: x.reshape((3, 4) + x.shape[1:]), obs), action.reshape(3, 4, -1))
  for r, g in zip(rows, grid):
    assert g.shape == (3, 4)
    np.testing.assert_allclose(g.reshape(-1), r, rtol=1e-6, atol=1e-6)


def test_first_entries_are_the_final_chunk():
  """With negligible noise the chunk is the Euler ODE from x_0 (entries D:2D), mapped onto the box."""
  policy = _policy(min_log_std=-14.0, init_log_std=-13.0)
  params = policy.init(jax.random.key(0))
  obs = _obs(4)
  action = np.asarray(policy.sample(params, obs, jax.random.key(1))[0])
  obs_x = policy.normalized_obs(params, obs)
  x = jnp.asarray(action[:, D:2 * D])
  for k in range(STEPS):
    x = x + policy.velocity(params, obs_x, x, jnp.full((4,), k / STEPS)) / STEPS
  center, half = _center_half()
  np.testing.assert_allclose(action[:, :D], center + half * np.asarray(x), atol=1e-4)


def test_logp_matches_numpy_chain_likelihood():
  policy = _policy()
  params, obs = _params(policy, seed=5), _obs(6, seed=7)
  action, logp, _, _ = policy.sample(params, obs, jax.random.key(9))
  a = np.asarray(action, np.float64)
  center, half = _center_half()
  chain = [a[:, D + k * D:D + (k + 1) * D] for k in range(STEPS)] + [(a[:, :D] - center) / half]
  obs_x = policy.normalized_obs(params, obs)
  std = np.exp(np.asarray(policy.noise_log_std(params), np.float64))  # [S, D]

  def log_normal(x, mean, sd):
    return np.sum(-0.5 * ((x - mean) / sd) ** 2 - np.log(sd) - 0.5 * np.log(2 * np.pi), axis=-1)

  expect = log_normal(chain[0], 0.0, 1.0) - np.sum(np.log(half))
  for k in range(STEPS):
    v = np.asarray(policy.velocity(params, obs_x, jnp.asarray(chain[k], jnp.float32), jnp.full((6,), k / STEPS)))
    expect += log_normal(chain[k + 1], chain[k] + v / STEPS, std[k])
  np.testing.assert_allclose(np.asarray(logp), expect, rtol=1e-4, atol=1e-3)


def test_step_logps_are_each_denoising_steps_and_sum_to_the_chains():
  """ratio_level=token (DPPO): evaluate_tokens gives step k's Gaussian log-density (NumPy, float64), step 0
  carrying x_0's density and the box's log-det; they sum to evaluate's and sample's chain log-prob, and a
  [T, S] segment batch gets [T, S, steps]."""
  policy = _policy()
  params, obs = _params(policy, seed=11), _obs(6, seed=12)
  action, logp, _, _ = policy.sample(params, obs, jax.random.key(13))
  steps, _, _ = jax.jit(policy.evaluate_tokens)(params, obs, action)
  assert steps.shape == (6, STEPS)
  a = np.asarray(action, np.float64)
  center, half = _center_half()
  chain = [a[:, D + k * D:D + (k + 1) * D] for k in range(STEPS)] + [(a[:, :D] - center) / half]
  obs_x = policy.normalized_obs(params, obs)
  std = np.exp(np.asarray(policy.noise_log_std(params), np.float64))
  for k in range(STEPS):
    v = np.asarray(policy.velocity(params, obs_x, jnp.asarray(chain[k], jnp.float32), jnp.full((6,), k / STEPS)))
    z = (chain[k + 1] - chain[k] - v / STEPS) / std[k]
    expect = np.sum(-0.5 * z ** 2 - np.log(std[k]) - 0.5 * np.log(2 * np.pi), axis=-1)
    if k == 0:
      expect += np.sum(-0.5 * chain[0] ** 2 - 0.5 * np.log(2 * np.pi), axis=-1) - np.sum(np.log(half))
    np.testing.assert_allclose(np.asarray(steps[:, k]), expect, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(np.asarray(steps).sum(-1), np.asarray(logp), rtol=1e-5, atol=1e-3)
  np.testing.assert_allclose(np.asarray(policy.evaluate(params, obs, action)[0]), np.asarray(steps).sum(-1),
                             rtol=1e-6, atol=1e-4)
  grid, _, _ = policy.evaluate_tokens(params, jax.tree.map(lambda x: x.reshape((2, 3) + x.shape[1:]), obs),
                                      action.reshape(2, 3, -1))
  assert grid.shape == (2, 3, STEPS)
  np.testing.assert_allclose(np.asarray(grid).reshape(6, STEPS), np.asarray(steps), rtol=1e-6, atol=1e-5)


def test_monte_carlo_marginal_and_entropy():
  """Constant field v = c: x_S = x_0 + c + sum_k sigma_k eps_k, so the chunk is Gaussian in closed form."""
  policy = _policy()
  params = _params(policy, seed=11)
  c = np.array([0.5, -1.0, 0.25, 2.0], np.float32)
  vel = params["net"]["vel"]["Dense_2"]
  vel = {"kernel": jnp.zeros_like(vel["kernel"]), "bias": jnp.asarray(c)}
  const = {**params, "net": {**params["net"], "vel": {**params["net"]["vel"], "Dense_2": vel}}}
  n = 8000
  obs = {k: jnp.broadcast_to(v[:1], (n,) + v.shape[1:]) for k, v in _obs(1).items()}
  action, logp, _, _ = jax.jit(policy.sample)(const, obs, jax.random.key(0))
  chunk = np.asarray(action[:, :D], np.float64)
  center, half = _center_half()
  var = half**2 * (1.0 + np.sum(np.exp(2 * np.asarray(policy.noise_log_std(const), np.float64)), axis=0))
  assert np.all(np.abs(chunk.mean(0) - (center + half * c)) < 5 * np.sqrt(var / n)), (chunk.mean(0), center + half * c)
  assert np.all(np.abs(chunk.var(0) / var - 1) < 5 * np.sqrt(2 / n)), (chunk.var(0), var)
  # E[log p] = -H for the exact chain density, whatever v is: check the constant and the random field.
  for p, lp in ((const, logp), (params, jax.jit(policy.sample)(params, obs, jax.random.key(1))[1])):
    lp = np.asarray(lp, np.float64)
    entropy = float(policy.chain_entropy(p))
    assert abs(lp.mean() + entropy) < 5 * lp.std() / np.sqrt(n), (lp.mean(), -entropy)
    assert abs(lp.var() - policy.action_size / 2) < 0.15 * policy.action_size / 2  # Var log N = dims / 2.


def test_logp_gradients_finite_and_nonzero():
  policy = _policy()
  params, obs = _params(policy), _obs(8)
  action = jax.jit(policy.sample)(params, obs, jax.random.key(2))[0]

  def loss(net):
    logp, ent, value = policy.evaluate({**params, "net": net}, obs, action)
    return logp.mean() + ent.mean() + value.mean()

  grads = jax.jit(jax.grad(loss))(params["net"])
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  for part in ("vel", "noise_raw", "critic"):
    assert sum(float(jnp.abs(g).sum()) for g in jax.tree.leaves(grads[part])) > 0, part


def test_flow_matching_bc_loss_decreases():
  policy = _policy()
  params = policy.init(jax.random.key(0))
  obs = _obs(32, seed=3)
  params = policy.update_normalizer(params, obs, jnp.ones(32))
  rng = np.random.default_rng(0)  # Demo chunks depend on the obs, inside the box.
  demo = jnp.asarray(np.tanh(np.asarray(obs["state"])[:, :D] + 0.1 * rng.normal(size=(32, D))) * (HIGH - LOW) / 2
                     + (HIGH + LOW) / 2, jnp.float32).reshape(32, K, A)
  opt = optax.adam(1e-2)
  eval_key = jax.random.key(99)

  @jax.jit
  def step(net, opt_state, key):
    loss, g = jax.value_and_grad(lambda n: policy.flow_matching_loss({**params, "net": n}, obs, demo, key))(net)
    updates, opt_state = opt.update(g, opt_state)
    return optax.apply_updates(net, updates), opt_state, loss

  before = float(policy.flow_matching_loss(params, obs, demo, eval_key))
  net, opt_state = params["net"], opt.init(params["net"])
  for i in range(60):
    net, opt_state, _ = step(net, opt_state, jax.random.key(i))
  after = float(policy.flow_matching_loss({**params, "net": net}, obs, demo, eval_key))
  assert after < 0.7 * before, (before, after)


def test_chunk_size_must_divide_action_dim():
  with pytest.raises(ValueError):
    FlowPolicy(_policy().spec, chunk_size=3)


def test_mt10_instructions_condition_the_expert_as_a_bag_of_words():
  from sim_adapters.multitask import MT10_TASKS
  texts = tuple(MT10_TASKS.values())
  spec = EnvSpec(name="MetaWorld/MT10", obs={"state": ObsSpec((5,), np.dtype(np.float32)),
                                             "task": ObsSpec((10,), np.dtype(np.float32))},
                 action_dim=4, action_low=-np.ones(4, np.float32), action_high=np.ones(4, np.float32),
                 max_episode_steps=10, has_success=True, num_tasks=10, chunk_size=2)
  policy = FlowPolicy(spec, chunk_size=2, steps=2, hidden=(16, 16), critic_hidden=(16,), instructions=texts)
  params = policy.init(jax.random.PRNGKey(0))
  obs = {"state": np.zeros((2, 5), np.float32), "task": np.eye(10, dtype=np.float32)[[3, 5]]}
  cond = np.asarray(policy.normalized_obs(params, obs))
  assert cond.shape == (2, policy.cond_dim) and policy.cond_dim > policy.input_dim
  words = cond[:, policy.input_dim:]
  assert words[0].sum() == len(texts[3].split()) and not np.array_equal(words[0], words[1])  # "open the door" vs ...
  action, logp, value, _ = jax.jit(policy.sample)(params, obs, jax.random.PRNGKey(1))
  logp2, _, value2 = jax.jit(policy.evaluate)(params, obs, action)
  np.testing.assert_allclose(logp, logp2, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(value, value2, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="3 instructions for 10 tasks"):
    FlowPolicy(spec, chunk_size=2, instructions=texts[:3]).init(jax.random.PRNGKey(0))


# ----------------------------------------------------------------------------- mean action, last-K fine-tuning


def test_mean_action_is_the_noiseless_chain_from_zero():
  policy = _policy()
  params, obs = _params(policy, seed=3), _obs(5, seed=2)
  a = np.asarray(jax.jit(policy.mean_action)(params, obs))
  np.testing.assert_array_equal(a, np.asarray(jax.jit(policy.mean_action)(params, obs)))  # Deterministic.
  assert a.shape == (5, policy.action_size)
  obs_x = policy.normalized_obs(params, obs)
  x, chain = jnp.zeros((5, D)), []
  for k in range(STEPS):
    chain.append(np.asarray(x))
    x = x + policy.velocity(params, obs_x, x, jnp.full((5,), k / STEPS)) / STEPS
  center, half = _center_half()
  np.testing.assert_allclose(a[:, :D], center + half * np.asarray(x), atol=1e-5)
  np.testing.assert_allclose(a[:, D:], np.concatenate(chain, axis=1), atol=1e-5)
  assert not a[:, D:2 * D].any()  # x_0 = 0.


def _finetune_params(policy, seed: int = 0):
  """Random params whose frozen copy differs from the net's velocity (so a mix-up shows)."""
  params = _params(policy, seed)
  other = policy.init(jax.random.key(seed + 50))
  return {**params, "base": {"vel": other["net"]["vel"]}}


def test_finetune_last_k_steps_chain_is_exact_and_only_they_get_gradients():
  policy = _policy(finetune_steps=1)
  f = policy.frozen_steps
  assert f == STEPS - 1 and "base" in policy.init(jax.random.key(0)) and "base" not in _policy().init(jax.random.key(0))
  params, obs = _finetune_params(policy, seed=5), _obs(6, seed=7)
  action, logp, _, _ = jax.jit(policy.sample)(params, obs, jax.random.key(9))
  np.testing.assert_allclose(jax.jit(policy.evaluate)(params, obs, action)[0], logp, rtol=1e-5, atol=1e-3)
  a = np.asarray(action, np.float64)
  center, half = _center_half()
  chain = [a[:, D + k * D:D + (k + 1) * D] for k in range(STEPS)] + [(a[:, :D] - center) / half]
  obs_x = policy.normalized_obs(params, obs)
  std = np.exp(np.asarray(policy.noise_log_std(params), np.float64))

  def log_normal(x, mean, sd):
    return np.sum(-0.5 * ((x - mean) / sd) ** 2 - np.log(sd) - 0.5 * np.log(2 * np.pi), axis=-1)

  expect = log_normal(chain[0], 0.0, 1.0) - np.sum(np.log(half))
  for k in range(STEPS):  # The frozen steps on the base copy, the last on the net.
    vel = policy.base_velocity if k < f else policy.velocity
    v = np.asarray(vel(params, obs_x, jnp.asarray(chain[k], jnp.float32), jnp.full((6,), k / STEPS)))
    expect += log_normal(chain[k + 1], chain[k] + v / STEPS, std[k])
  np.testing.assert_allclose(np.asarray(logp), expect, rtol=1e-4, atol=1e-3)
  # The mean action runs the same split chain.
  m = np.asarray(policy.mean_action(params, obs))
  x = jnp.zeros((6, D))
  for k in range(STEPS):
    vel = policy.base_velocity if k < f else policy.velocity
    x = x + vel(params, obs_x, x, jnp.full((6,), k / STEPS)) / STEPS
  np.testing.assert_allclose(m[:, :D], center + half * np.asarray(x), atol=1e-5)

  # d logp / d net is that of the last K transitions' terms alone.
  xs = jnp.asarray(np.stack(chain, axis=1), jnp.float32)  # [B, S + 1, D]

  def last_k(net):
    p = {**params, "net": net}
    log_std = policy.noise_log_std(p)
    total = 0.0
    for k in range(f, STEPS):
      v = policy.velocity(p, obs_x, xs[:, k], jnp.full((6,), k / STEPS))
      z = (xs[:, k + 1] - xs[:, k] - v / STEPS) * jnp.exp(-log_std[k])
      total = total + jnp.sum(-0.5 * z**2 - log_std[k])
    return total

  got = jax.grad(lambda n: policy.evaluate({**params, "net": n}, obs, action)[0].sum())(params["net"])
  want = jax.grad(last_k)(params["net"])
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
  assert not np.asarray(got["noise_raw"][:f]).any() and np.asarray(got["noise_raw"][f:]).any()
  ent_grad = jax.grad(lambda n: policy.chain_entropy({**params, "net": n}))(params["net"])["noise_raw"]
  assert not np.asarray(ent_grad[:f]).any()


def test_an_optimiser_step_leaves_the_frozen_steps_bit_identical():
  policy = _policy(finetune_steps=2)
  params, obs = _finetune_params(policy, seed=1), _obs(8, seed=4)
  action = jax.jit(policy.sample)(params, obs, jax.random.key(2))[0]
  opt = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(1e-2))  # As the learner: params["net"] only.

  def loss(net):
    logp, ent, value = policy.evaluate({**params, "net": net}, obs, action)
    return -(logp.mean() + 0.01 * ent.mean()) + jnp.square(value).mean()

  net = params["net"]
  updates, _ = opt.update(jax.grad(loss)(net), opt.init(net), net)
  new = {**params, "net": optax.apply_updates(net, updates)}
  f = policy.frozen_steps
  for a, b in zip(jax.tree.leaves(new["base"]), jax.tree.leaves(params["base"])):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(new["net"]["noise_raw"][:f], params["net"]["noise_raw"][:f])
  assert not np.array_equal(new["net"]["noise_raw"][f:], params["net"]["noise_raw"][f:])
  assert not np.array_equal(new["net"]["vel"]["Dense_0"]["kernel"], params["net"]["vel"]["Dense_0"]["kernel"])


def test_a_warm_start_without_base_copies_the_net_into_it(tmp_path):
  from ebrl import warm_start
  pre = _policy()  # Pre-trained on every step (launch.sft): no "base".
  saved = _params(pre, seed=8)
  warm_start.save_params(str(tmp_path / "sft"), saved)
  policy = _policy(finetune_steps=1)
  loaded = warm_start.load_params(str(tmp_path / "sft"), policy.init(jax.random.key(1)))
  assert set(loaded) == {"net", "obs_norm", "base"}
  for a, b in zip(jax.tree.leaves(loaded["base"]["vel"]), jax.tree.leaves(saved["net"]["vel"])):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(loaded["net"]), jax.tree.leaves(saved["net"])):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match=r"finetune_steps=4 must be in \[0, steps=3\]"):
    _policy(finetune_steps=4)
  synced = policy.sync_base(_finetune_params(policy, seed=2))  # What launch.sft saves: base = the trained net.
  for a, b in zip(jax.tree.leaves(synced["base"]["vel"]), jax.tree.leaves(synced["net"]["vel"])):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("key,value,expected", [
    ("flow_min_log_std", 0.0, "policy.flow_min_log_std=0.0 must be a finite number below 0"),
    ("flow_min_log_std", -0.5, "policy.flow_init_log_std=-1.0 must be in (-0.5, 0)"),
    ("flow_hidden", (256, 0), "policy.flow_hidden=(256, 0) must be positive integer layer sizes"),
    ("flow_hidden", (), "policy.flow_hidden=() must be positive integer layer sizes"),
    ("flow_finetune_steps", 5, "policy.flow_finetune_steps=5 must be an integer in [0, policy.flow_steps=4]"),
    ("flow_finetune_steps", -1, "policy.flow_finetune_steps=-1 must be an integer in [0, policy.flow_steps=4]"),
])
def test_bad_flow_keys_are_one_line_errors(key, value, expected):
  from ebrl.defaults import get_config
  from ebrl.errors import UserError
  from ebrl.validation import resolve
  cfg = get_config()
  cfg.policy.name = "flow"
  cfg.policy[key] = value
  with pytest.raises(UserError) as e:
    resolve(cfg)
  assert expected in str(e.value) and "\n" not in str(e.value)


def test_make_policy_reads_the_flow_keys():
  from ebrl.defaults import get_config
  from policies import make_policy
  cfg = get_config().policy
  cfg.update(flow_hidden=(32, 16), flow_min_log_std=-3.0, flow_finetune_steps=1, flow_steps=3)
  policy = make_policy("flow", _policy().spec, cfg)
  assert (policy.hidden, policy.min_log_std, policy.finetune_steps, policy.frozen_steps) == ((32, 16), -3.0, 1, 2)
  assert get_config().policy.flow_hidden == (256, 256) and get_config().policy.flow_finetune_steps == 0
