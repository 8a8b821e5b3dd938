"""VLA policy: tokenizers, the log-prob contract in both decode modes, masks, multi-task inputs (MT10, MT50, lists)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from launch.configs.default import get_config
from policies import instructions_for, make_policy
from policies.tokenizer import ActionTokenizer, InstructionTokenizer
from policies.vla import VLAPolicy
from sim_adapters.base import EnvSpec, ObsSpec
from sim_adapters.tasks import METAWORLD_INSTRUCTIONS, multitask_tasks

A, K, BINS, S = 2, 3, 16, 7
INSTRUCTIONS = ["reach the goal position", "push the puck to the goal", "open the door"]


def make_spec(state_dim=S, num_tasks=0, pixels=None) -> EnvSpec:
  low, high = np.array([-1.0, -2.0], np.float32), np.array([1.0, 0.5], np.float32)
  obs = {"state": ObsSpec((state_dim,), np.dtype(np.float32))}
  if num_tasks:
    obs["task"] = ObsSpec((num_tasks,), np.dtype(np.float32))
  if pixels is not None:
    obs["pixels"] = ObsSpec(pixels, np.dtype(np.uint8))
  return EnvSpec(name="toy", obs=obs, action_dim=K * A, action_low=np.tile(low, K), action_high=np.tile(high, K),
                 max_episode_steps=10, has_success=False, num_tasks=max(num_tasks, 1))


def make_obs(spec: EnvSpec, b: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  obs = {"state": jnp.asarray(rng.normal(size=(b,) + spec.obs["state"].shape).astype(np.float32))}
  if "task" in spec.obs:
    n = spec.obs["task"].shape[0]
    obs["task"] = jnp.asarray(np.eye(n, dtype=np.float32)[np.arange(b) % n])
  if "pixels" in spec.obs:
    obs["pixels"] = jnp.asarray(rng.integers(0, 256, (b,) + spec.obs["pixels"].shape).astype(np.uint8))
  return obs


def tiny(spec, decode, **kw) -> VLAPolicy:
  return VLAPolicy(spec, chunk_size=K, bins=BINS, width=16, depth=1, heads=2, decode=decode, **kw)


def jitted(policy):
  """Jitted entry points: whole-function compiles persist in the compilation cache, eager ops do not."""
  return dict(sample=jax.jit(policy.sample), evaluate=jax.jit(policy.evaluate),
              token_logits=jax.jit(policy.token_logits),
              log_probs=jax.jit(policy.log_probs, static_argnames="level"))


@pytest.fixture(scope="module", params=["parallel", "autoregressive"])
def setup(request):
  spec = make_spec()
  policy = tiny(spec, request.param)
  params = jax.jit(policy.init)(jax.random.PRNGKey(0))
  obs = make_obs(spec, 5)
  fns = jitted(policy)
  return policy, fns, params, obs, fns["sample"](params, obs, jax.random.PRNGKey(1))


# -- tokenizers ----------------------------------------------------------------


def test_action_tokenizer_round_trip_and_clipping():
  low, high = np.array([-1.0, 0.0, -3.0], np.float32), np.array([1.0, 5.0, -2.5], np.float32)
  tok = ActionTokenizer(low, high, bins=256)
  half = (high - low) / 256 / 2
  v = np.random.default_rng(0).uniform(low, high, (4, 100, 3)).astype(np.float32)
  for xp in (np, jnp):
    t = tok.to_tokens(xp.asarray(v))
    assert t.dtype == np.int32 and t.shape == v.shape
    back = np.asarray(tok.to_values(t))
    assert np.all(np.abs(back - v) <= half * (1 + 1e-4))
  bins = np.tile(np.arange(256, dtype=np.int32)[:, None], (1, 3))
  assert np.array_equal(tok.to_tokens(tok.to_values(bins)), bins)
  assert np.array_equal(np.asarray(jax.jit(lambda x: tok.to_tokens(tok.to_values(x)))(bins)), bins)
  out = tok.to_tokens(np.array([[-9.0, 99.0, -2.5], [1.0, -1.0, 0.0]], np.float32))
  assert out.tolist() == [[0, 255, 255], [255, 0, 255]]
  with pytest.raises(ValueError):
    ActionTokenizer(np.array([0.0]), np.array([np.inf]))


def test_instruction_tokenizer():
  tok = InstructionTokenizer.from_texts(INSTRUCTIONS)
  again = InstructionTokenizer.from_texts(list(reversed(INSTRUCTIONS)))
  assert tok.vocab == again.vocab and tok.vocab[:2] == ("<pad>", "<unk>")
  ids = tok.encode("Push the PUCK-to the goal!", 8)
  assert ids.dtype == np.int32 and ids.shape == (8,)
  assert np.array_equal(ids, again.encode("push the puck to the goal", 8))
  assert ids[6:].tolist() == [0, 0] and np.all(ids[:6] > 1)
  assert tok.decode(ids) == "push the puck to the goal"
  assert tok.encode("open the banana", 4).tolist()[2:] == [1, 0]  # <unk>, <pad>
  assert tok.encode("push the puck to the goal", 3).shape == (3,)  # Truncated.
  batch = tok.encode_batch(INSTRUCTIONS, 6)
  assert batch.shape == (3, 6) and np.array_equal(batch[1], tok.encode(INSTRUCTIONS[1], 6))


# -- policy --------------------------------------------------------------------


def test_sample_shapes_and_spread(setup):
  policy, fns, params, obs, (action, logp, value, extras) = setup
  assert policy.action_size == K * A and policy.action_dim == A and policy.num_tokens == K * A
  assert action.shape == (5, K * A) and logp.shape == value.shape == (5,)
  assert np.all(action >= policy.spec.action_low) and np.all(action <= policy.spec.action_high)
  assert np.array_equal(policy.action_tokenizer.to_tokens(np.asarray(action)), np.asarray(extras["tokens"]))
  keys = jax.random.split(jax.random.PRNGKey(7), 12)
  many = np.concatenate([np.asarray(fns["sample"](params, obs, k)[3]["tokens"]) for k in keys])
  assert len(np.unique(many[:, 0])) >= BINS // 2  # A fresh policy spreads its actions.


def test_evaluate_matches_sample_and_levels(setup):
  policy, fns, params, obs, (action, logp, value, _) = setup
  logp2, entropy, value2 = fns["evaluate"](params, obs, action)
  np.testing.assert_allclose(logp2, logp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(value2, value, rtol=1e-5, atol=1e-5)
  assert np.all(entropy > 0) and np.all(entropy <= K * A * np.log(BINS) + 1e-4)
  tok, act, chunk = (fns["log_probs"](params, obs, action, level=lv) for lv in ("token", "action", "chunk"))
  assert tok.shape == (5, K * A) and act.shape == (5, K) and chunk.shape == (5,)
  np.testing.assert_allclose(chunk, tok.sum(-1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(chunk, act.sum(-1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(act, tok.reshape(5, K, A).sum(-1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(chunk, logp2, rtol=1e-5, atol=1e-5)
  # Leading [T, B] axes, as the learner passes them.
  lead = jax.tree.map(lambda x: jnp.stack([x, x]), obs)
  logp3, entropy3, value3 = jax.jit(policy.evaluate)(params, lead, jnp.stack([action, action]))
  assert logp3.shape == entropy3.shape == value3.shape == (2, 5)
  np.testing.assert_allclose(logp3[1], logp2, rtol=1e-5, atol=1e-5)


def test_independent_log_prob(setup):
  policy, fns, params, obs, (action, _, _, _) = setup
  a, low, high = np.asarray(action), policy.spec.action_low, policy.spec.action_high
  tokens = np.clip(np.floor((a - low) / ((high - low) / BINS)), 0, BINS - 1).astype(np.int32)
  raw, _ = jax.jit(lambda p, o, t: policy._net.apply({"params": p["net"]}, *policy._net_inputs(p, o), t))(
      params, obs, jnp.asarray(tokens))
  raw = np.asarray(raw, np.float64)
  logsm = raw - raw.max(-1, keepdims=True)
  logsm = logsm - np.log(np.exp(logsm).sum(-1, keepdims=True))
  want = np.take_along_axis(logsm, tokens[..., None], -1)[..., 0].sum(-1)
  np.testing.assert_allclose(fns["evaluate"](params, obs, action)[0], want, rtol=1e-4, atol=1e-4)
  # Out-of-range actions clip to the edge bins.
  np.testing.assert_allclose(fns["evaluate"](params, obs, action + 100.0)[0],
                             fns["evaluate"](params, obs, jnp.tile(high, (5, 1)))[0], rtol=1e-6)


def test_first_token_influence(setup):
  policy, fns, params, obs, (_, _, _, extras) = setup
  tokens = np.asarray(extras["tokens"])
  other = tokens.copy()
  other[:, 0] = (other[:, 0] + BINS // 2) % BINS
  l1, v1 = fns["token_logits"](params, obs, jnp.asarray(tokens))
  l2, v2 = fns["token_logits"](params, obs, jnp.asarray(other))
  np.testing.assert_array_equal(l1[:, 0], l2[:, 0])  # Token 0 never sees itself.
  np.testing.assert_array_equal(v1, v2)  # Nor does the value.
  if policy.decode == "autoregressive":
    assert np.abs(np.asarray(l1[:, 1:] - l2[:, 1:])).max() > 1e-6
  else:
    np.testing.assert_array_equal(l1, l2)


@pytest.mark.parametrize("decode", ["parallel", "autoregressive"])
def test_mt10_like_instructions(decode):
  spec = make_spec(num_tasks=3)
  policy = tiny(spec, decode, instructions=INSTRUCTIONS)
  fns = jitted(policy)
  params = jax.jit(policy.init)(jax.random.PRNGKey(0))
  obs = make_obs(spec, 6)
  params = jax.jit(policy.update_normalizer)(params, obs, jnp.ones(6))
  assert float(params["obs_norm"].count) == 6
  action, logp, _, _ = fns["sample"](params, obs, jax.random.PRNGKey(2))
  np.testing.assert_allclose(fns["evaluate"](params, obs, action)[0], logp, rtol=1e-5, atol=1e-5)
  zeros = jnp.zeros((6, K * A), jnp.int32)
  l1 = fns["token_logits"](params, obs, zeros)[0]
  flipped = jax.tree.map(lambda x: x[::-1], obs)  # Rows keep their own task: same logits, reversed.
  np.testing.assert_allclose(l1, fns["token_logits"](params, flipped, zeros)[0][::-1], rtol=1e-5, atol=1e-5)
  other_task = {**obs, "task": obs["task"][jnp.array([1, 2, 0, 4, 5, 3])]}  # Same state, other instruction.
  assert np.abs(np.asarray(l1 - fns["token_logits"](params, other_task, zeros)[0])).max() > 1e-7
  with pytest.raises(ValueError):
    tiny(spec, decode, instructions=INSTRUCTIONS[:2])


def test_task_without_instructions_and_pixels():
  spec = make_spec(num_tasks=3, pixels=(3, 16, 12))
  policy = tiny(spec, "parallel")
  fns = jitted(policy)
  params = jax.jit(policy.init)(jax.random.PRNGKey(0))
  assert "patch_embed" in params["net"] and "instr_embed" in params["net"]
  obs = make_obs(spec, 4)
  action, logp, _, _ = fns["sample"](params, obs, jax.random.PRNGKey(2))
  np.testing.assert_allclose(fns["evaluate"](params, obs, action)[0], logp, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,num_tasks", [("MetaWorld/MT50", 50), ("MetaWorld/MT:DialTurn-v3,Reach-v3", 2)])
def test_any_task_list_gets_its_instructions(name, num_tasks):
  """MT50 or a user's list: one instruction per task id, every word in the vocabulary."""
  spec = dataclasses.replace(make_spec(num_tasks=num_tasks), name=name)
  texts = instructions_for(spec)
  assert texts == [METAWORLD_INSTRUCTIONS[t] for t in multitask_tasks(name)] and len(texts) == num_tasks
  cfg = get_config().policy
  cfg.update(width=16, depth=1, heads=2, bins=BINS, chunk_size=K)
  policy = make_policy("vla", spec, cfg)
  table = policy._instruction_table  # pylint: disable=protected-access
  assert table.shape[0] == num_tasks and (table != 1).all()  # No <unk> word.
  assert len({tuple(r) for r in table}) == num_tasks
  params = jax.jit(policy.init)(jax.random.PRNGKey(0))
  obs = make_obs(spec, 4)
  action, logp, _, _ = jax.jit(policy.sample)(params, obs, jax.random.PRNGKey(1))
  np.testing.assert_allclose(jax.jit(policy.evaluate)(params, obs, action)[0], logp, rtol=1e-5, atol=1e-5)
  flow = make_policy("flow", spec, cfg)
  words = flow._task_words  # pylint: disable=protected-access
  assert words.shape[0] == num_tasks and len({tuple(r) for r in words}) == num_tasks


def test_a_single_metaworld_task_has_its_own_instruction():
  assert instructions_for(dataclasses.replace(make_spec(), name="MetaWorld/Reach-v3")) == ["reach the goal position"]
  assert instructions_for(dataclasses.replace(make_spec(), name="MetaWorld/Soccer-v3")) == ["kick the ball into the goal"]
  assert instructions_for(dataclasses.replace(make_spec(), name="CartpoleBalance-v1")) is None
