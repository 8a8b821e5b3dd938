"""A small VLA-style transformer policy: discrete action tokens, action chunks.

Why this shape (OpenVLA / OpenVLA-OFT, scaled down for RL from scratch):
* Each action dimension is discretised into `bins` uniform bins
  (policies/tokenizer.py), so the policy is a product of categoricals whose
  log-probs and entropies are exact, and the float action the sampler stores
  maps back to the same tokens in `evaluate`.
* One sequence holds a pooled [CLS] token (value head), proprio/state tokens,
  instruction word tokens (multi-task envs: looked up from the task one-hot), image patch
  tokens, and then K*A action query tokens (K = chunk_size actions of A dims).
  Context tokens never attend to action tokens, so the value and the context
  do not depend on the actions.
* decode="parallel" (OFT): action queries attend to the context and to each
  other bidirectionally and all logits come out of one pass; the tokens of a
  chunk are then conditionally independent given the observation.
  decode="autoregressive": action query i also receives the embedding of
  token i-1 and attends causally over the action queries, so sampling is
  sequential (a scan over K*A tokens) and `evaluate` uses teacher forcing.
* `mean_action` decodes greedily: the most likely token of each dimension (parallel), or of
  each step in turn (autoregressive), mapped back to bin centres by the action tokenizer.
* detach_critic=True: the value head reads the [CLS] feature through a stop_gradient, so
  the value loss trains the value head only and never moves the trunk the actor shares
  (the RLinf / piRL recipe for fine-tuning a pre-trained VLA).
* critic_hidden=(h, ...): the value is a tanh MLP of its own (module "critic") over the [CLS]
  feature, the normalised state and the task one-hot, instead of a linear head on [CLS]: features
  trained to predict expert actions hold little of a multi-task return linearly, and a critic that
  cannot fit the returns gives PPO advantages that are mostly noise.
Observation statistics for "state" live in params["obs_norm"] (ebrl/normalizer.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ebrl import normalizer
from policies.base import Obs, Params, check_chunk, check_compatible, check_instructions
from policies.tokenizer import ActionTokenizer, InstructionTokenizer, split_words
from sim_adapters.base import EnvSpec

DECODE_MODES = ("parallel", "autoregressive")
LEVELS = ("token", "action", "chunk")
_EMBED_INIT = nn.initializers.normal(0.02)


def _centred_bias(temperature: float):
  """Initial logit bias: a wide discretised Gaussian over the bins (std sqrt(T) in [-1, 1] units).

  Why: a fresh policy should spread its actions over the whole range (as a
  uniform categorical would) while slightly preferring the centre, as the
  Gaussian MLP policy's zero-mean start does.
  """

  def init(key, shape, dtype=jnp.float32):
    del key
    z = (jnp.arange(shape[-1], dtype=jnp.float32) + 0.5) / shape[-1] * 2.0 - 1.0
    return (-0.5 * jnp.square(z) / temperature).astype(dtype)

  return init


class _Block(nn.Module):
  """Pre-LayerNorm transformer block."""

  width: int
  heads: int

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
    h = nn.MultiHeadDotProductAttention(num_heads=self.heads, qkv_features=self.width,
                                        out_features=self.width)(nn.LayerNorm()(x), mask=mask)
    x = x + h
    h = nn.Dense(self.width)(nn.gelu(nn.Dense(4 * self.width)(nn.LayerNorm()(x))))
    return x + h


class _VLANet(nn.Module):
  """Tokens -> transformer -> per-action-token logits [B, N, bins] and value [B]."""

  width: int
  depth: int
  heads: int
  bins: int
  num_tokens: int  # N = K * A action tokens.
  state_tokens: int
  vocab_size: int  # 0: no instruction tokens.
  patch: int
  autoregressive: bool
  init_temperature: float
  detach_critic: bool = False
  critic_hidden: tuple[int, ...] = ()

  @nn.compact
  def __call__(self, state, instr, pixels, prev_tokens, critic_x=None):
    """state [B, state_tokens, c] | None, instr [B, L] int | None, pixels [B, C, H, W] | None, prev_tokens [B, N],
    critic_x [B, D] | None: what a critic MLP reads besides the [CLS] feature (critic_hidden)."""
    b, w = prev_tokens.shape[0], self.width
    parts = [jnp.broadcast_to(self.param("cls", _EMBED_INIT, (1, 1, w)), (b, 1, w))]
    valid = [jnp.ones((b, 1), bool)]
    if state is not None:  # One projection per chunk of the state vector.
      kernel = self.param("state_kernel", nn.initializers.lecun_normal(batch_axis=(0,)),
                          (self.state_tokens, state.shape[-1], w))
      bias = self.param("state_bias", nn.initializers.zeros, (self.state_tokens, w))
      parts.append(jnp.einsum("bnc,ncw->bnw", state, kernel) + bias)
      valid.append(jnp.ones(state.shape[:2], bool))
    if instr is not None:
      parts.append(nn.Embed(self.vocab_size, w, embedding_init=_EMBED_INIT, name="instr_embed")(instr))
      valid.append(instr != 0)  # <pad> keys are masked out.
    if pixels is not None:
      c, h, wd = pixels.shape[1:]
      p = self.patch
      x = pixels[:, :, : h // p * p, : wd // p * p].astype(jnp.float32) / 255.0
      x = x.reshape(b, c, h // p, p, wd // p, p).transpose(0, 2, 4, 1, 3, 5).reshape(b, -1, c * p * p)
      parts.append(nn.Dense(w, name="patch_embed")(x))
      valid.append(jnp.ones(x.shape[:2], bool))
    ctx = sum(x.shape[1] for x in parts)
    queries = jnp.broadcast_to(self.param("action_queries", _EMBED_INIT, (1, self.num_tokens, w)),
                               (b, self.num_tokens, w))
    if self.autoregressive:  # Query i sees token i-1 (a learned <bos> = `bins` for i = 0).
      prev = jnp.concatenate([jnp.full((b, 1), self.bins, jnp.int32), prev_tokens[:, :-1]], axis=1)
      queries = queries + nn.Embed(self.bins + 1, w, embedding_init=_EMBED_INIT, name="token_embed")(prev)
    parts.append(queries)
    valid.append(jnp.ones((b, self.num_tokens), bool))
    x = jnp.concatenate(parts, axis=1)
    total = x.shape[1]
    x = x + self.param("pos_embed", _EMBED_INIT, (1, total, w))

    q, k = np.arange(total)[:, None], np.arange(total)[None, :]
    among_actions = (k <= q) if self.autoregressive else np.ones((total, total), bool)
    allowed = (k < ctx) | ((q >= ctx) & (k >= ctx) & among_actions)  # Context never sees actions.
    mask = jnp.asarray(allowed)[None, None] & jnp.concatenate(valid, axis=1)[:, None, None, :]

    for i in range(self.depth):
      x = _Block(w, self.heads, name=f"block{i}")(x, mask)
    x = nn.LayerNorm(name="final_norm")(x)
    logits = nn.Dense(self.bins, name="action_head",
                      kernel_init=nn.initializers.variance_scaling(0.01, "fan_in", "truncated_normal"),
                      bias_init=_centred_bias(self.init_temperature))(x[:, ctx:])
    cls = jax.lax.stop_gradient(x[:, 0]) if self.detach_critic else x[:, 0]  # The value loss stays off the trunk.
    if not self.critic_hidden:
      value = nn.Dense(1, name="value_head", kernel_init=nn.initializers.orthogonal(1.0))(cls)[:, 0]
      return logits, value
    v = cls if critic_x is None else jnp.concatenate([cls, critic_x], axis=-1)
    return logits, _Critic(self.critic_hidden, name="critic")(v)


class _Critic(nn.Module):
  """A tanh MLP value function (critic_hidden): a linear map of the [CLS] feature, trained for
  actions, explains little of a multi-task return, and with detach_critic it cannot reshape it."""

  hidden: tuple[int, ...]

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    for h in self.hidden:
      x = nn.tanh(nn.Dense(h, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
    return nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))(x)[:, 0]


@dataclasses.dataclass(frozen=True)
class VLAPolicy:
  """Transformer policy over discrete action tokens; see the module docstring.

  `instructions`: one instruction per task id (a multi-task env: `policies.instructions_for(spec)`),
  used with the "task" one-hot; a single instruction is used for every env when
  the env has no "task" key. With "task" and no instructions, the task id gets a
  learned embedding token instead.
  """

  spec: EnvSpec
  chunk_size: int = 1
  bins: int = 256
  width: int = 64
  depth: int = 2
  heads: int = 4
  decode: str = "parallel"
  instructions: Sequence[str] | None = None
  init_temperature: float = 1.0
  detach_critic: bool = False  # The value head reads stop_gradient of the trunk's [CLS] feature.
  # () : the value is a linear head on the [CLS] feature; layer sizes: a critic MLP of its own over the
  # [CLS] feature, the normalised state and the task one-hot.
  critic_hidden: tuple[int, ...] = ()
  state_chunk: int = 8  # State dims per proprio token.
  patch_size: int = 8  # Image patch side, pixels.
  name: str = "vla"

  def __post_init__(self):
    if "pixels" not in self.spec.obs:
      check_compatible(self.name, ("state",), self.spec)
    if self.decode not in DECODE_MODES:
      raise ValueError(f"decode must be one of {DECODE_MODES}, got '{self.decode}'")
    check_chunk(self.spec, self.chunk_size)
    if self.width % self.heads:
      raise ValueError(f"width {self.width} is not a multiple of heads {self.heads}")
    if not self.init_temperature > 0:
      raise ValueError(f"init_temperature must be > 0, got {self.init_temperature}")
    object.__setattr__(self, "critic_hidden", tuple(int(h) for h in self.critic_hidden))
    if any(h <= 0 for h in self.critic_hidden):
      raise ValueError(f"critic_hidden must be positive layer sizes, got {self.critic_hidden}")
    if self.instructions is not None:
      object.__setattr__(self, "instructions", tuple(self.instructions))
      check_instructions(self.name, self.spec, self.instructions)
    self.action_tokenizer  # Validates the action bounds now rather than at the first trace.

  # -- sizes -------------------------------------------------------------------

  @property
  def action_size(self) -> int:
    """Width of the raw action: K * A (= spec.action_dim)."""
    return self.spec.action_dim

  @property
  def action_dim(self) -> int:
    """A: dims of one action of the chunk."""
    return self.spec.action_dim // self.chunk_size

  @property
  def num_tokens(self) -> int:
    return self.spec.action_dim

  @property
  def input_keys(self) -> tuple[str, ...]:
    keys = [k for k in ("state", "pixels") if k in self.spec.obs]
    if "task" in self.spec.obs and self._instruction_table is not None:
      keys.append("task")
    return tuple(keys)

  @property
  def state_dim(self) -> int:
    return self.spec.obs["state"].shape[0] if "state" in self.spec.obs else 0

  @property
  def _state_tokens(self) -> int:
    return math.ceil(self.state_dim / self.state_chunk)

  @property
  def _patch(self) -> int:
    if "pixels" not in self.spec.obs:
      return self.patch_size
    return min(self.patch_size, *self.spec.obs["pixels"].shape[1:])

  @functools.cached_property
  def action_tokenizer(self) -> ActionTokenizer:
    return ActionTokenizer(self.spec.action_low, self.spec.action_high, self.bins)

  @functools.cached_property
  def instruction_tokenizer(self) -> InstructionTokenizer | None:
    return InstructionTokenizer.from_texts(self.instructions) if self.instructions is not None else None

  @functools.cached_property
  def _instruction_table(self) -> np.ndarray | None:
    """int32 [num_tasks, L] word ids per task id; None when there are no instruction tokens."""
    if self.instructions is not None:
      length = max(1, max(len(split_words(t)) for t in self.instructions))
      return self.instruction_tokenizer.encode_batch(list(self.instructions), length)
    if "task" in self.spec.obs:  # No text: one learned token per task id (ids 2.., past <pad>/<unk>).
      return np.arange(2, 2 + self.spec.obs["task"].shape[0], dtype=np.int32)[:, None]
    return None

  @property
  def _net(self) -> _VLANet:
    table = self._instruction_table
    vocab = 0 if table is None else (self.instruction_tokenizer.vocab_size if self.instructions is not None
                                     else int(table.max()) + 1)
    return _VLANet(self.width, self.depth, self.heads, self.bins, self.num_tokens, self._state_tokens, vocab,
                   self._patch, self.decode == "autoregressive", float(self.init_temperature),
                   bool(self.detach_critic), self.critic_hidden)

  # -- inputs ------------------------------------------------------------------

  def _flatten(self, obs: Obs) -> tuple[tuple[int, ...], Obs]:
    """Folds any leading axes ([B] or [T, B]) into one batch axis."""
    key = self.input_keys[0]
    lead = obs[key].shape[: obs[key].ndim - len(self.spec.obs[key].shape)]
    flat = {k: obs[k].reshape((-1,) + tuple(self.spec.obs[k].shape)) for k in self.input_keys}
    return tuple(lead), flat

  def _net_inputs(self, params: Params, flat: Obs):
    """(state tokens, instruction ids, pixels) for the trunk; None where absent."""
    state = instr = pixels = None
    if "state" in flat:
      x = self._normalized_state(params, flat)
      x = jnp.pad(x, ((0, 0), (0, self._state_tokens * self.state_chunk - self.state_dim)))
      state = x.reshape(x.shape[0], self._state_tokens, self.state_chunk)
    table = self._instruction_table
    if table is not None:
      task = jnp.argmax(flat["task"], axis=-1) if "task" in flat else jnp.zeros(self._batch(flat), jnp.int32)
      instr = jnp.asarray(table)[task]
    if "pixels" in flat:
      pixels = flat["pixels"]
    return state, instr, pixels

  def _normalized_state(self, params: Params, flat: Obs) -> jax.Array:
    return normalizer.normalize(params["obs_norm"], flat["state"].astype(jnp.float32))

  def _critic_inputs(self, params: Params, flat: Obs) -> jax.Array | None:
    """What a critic MLP (critic_hidden) reads besides [CLS]: the normalised state and the task one-hot."""
    if not self.critic_hidden:
      return None
    parts = [self._normalized_state(params, flat)] if "state" in flat else []
    if "task" in flat:
      parts.append(flat["task"].astype(jnp.float32))
    return jnp.concatenate(parts, axis=-1) if parts else None

  def _batch(self, flat: Obs) -> int:
    return flat[self.input_keys[0]].shape[0]

  def _log_softmax(self, params: Params, flat: Obs, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-token log-probs over bins [B, N, bins] given (teacher-forced) tokens [B, N], and value [B]."""
    b = self._batch(flat)
    chex.assert_shape(tokens, (b, self.num_tokens))
    logits, value = self._net.apply({"params": params["net"]}, *self._net_inputs(params, flat),
                                    tokens.astype(jnp.int32), self._critic_inputs(params, flat))
    chex.assert_shape(logits, (b, self.num_tokens, self.bins))
    chex.assert_shape(value, (b,))
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), value

  # -- Policy contract -----------------------------------------------------------

  def init(self, key: jax.Array) -> Params:
    obs = {k: jnp.zeros((1,) + tuple(self.spec.obs[k].shape), self.spec.obs[k].dtype) for k in self.input_keys}
    stats = {"obs_norm": normalizer.init_stats(self.state_dim)}
    net = self._net.init(key, *self._net_inputs(stats, obs), jnp.zeros((1, self.num_tokens), jnp.int32),
                         self._critic_inputs(stats, obs))["params"]
    return {"net": net, **stats}

  def token_logits(self, params: Params, obs: Obs, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Log-softmaxed logits [..., N, bins] and value [...] given tokens [..., N] (teacher forcing)."""
    lead, flat = self._flatten(obs)
    logp, value = self._log_softmax(params, flat, tokens.reshape(-1, self.num_tokens))
    return logp.reshape(lead + logp.shape[1:]), value.reshape(lead)

  def sample(self, params: Params, obs: Obs, key: jax.Array):
    """Returns (action [..., K*A] bin centres, logp of the chunk, value, {"tokens": int32 [..., K*A]})."""
    lead, flat = self._flatten(obs)
    b, n = self._batch(flat), self.num_tokens
    if self.decode == "parallel":
      logp_all, value = self._log_softmax(params, flat, jnp.zeros((b, n), jnp.int32))
      tokens = jax.random.categorical(key, logp_all, axis=-1).astype(jnp.int32)
      token_logp = jnp.take_along_axis(logp_all, tokens[..., None], axis=-1)[..., 0]
    else:
      # One full pass per token; the causal mask makes token i's logits independent of tokens >= i.
      def step(tokens, xs):
        i, k = xs
        logp_all, value = self._log_softmax(params, flat, tokens)
        logp_i = jax.lax.dynamic_index_in_dim(logp_all, i, axis=1, keepdims=False)
        tok = jax.random.categorical(k, logp_i, axis=-1).astype(jnp.int32)
        tokens = jax.lax.dynamic_update_index_in_dim(tokens, tok, i, axis=1)
        return tokens, (jnp.take_along_axis(logp_i, tok[:, None], axis=-1)[:, 0], value)

      tokens, (token_logp, values) = jax.lax.scan(
          step, jnp.zeros((b, n), jnp.int32), (jnp.arange(n), jax.random.split(key, n)))
      token_logp, value = token_logp.T, values[0]
    chex.assert_shape([tokens, token_logp], (b, n))
    action = self.action_tokenizer.to_values(tokens)
    re = lambda x: x.reshape(lead + x.shape[1:])
    return re(action), re(token_logp.sum(-1)), re(value), {"tokens": re(tokens)}

  def mean_action(self, params: Params, obs: Obs) -> jax.Array:
    """The most likely action [..., K*A]: each token's argmax (parallel), or greedy decoding token by
    token (autoregressive), as bin centres."""
    return self.action_tokenizer.to_values(self.greedy_tokens(params, obs))

  def greedy_tokens(self, params: Params, obs: Obs) -> jax.Array:
    """int32 [..., K*A]: the argmax token of each dimension; autoregressive decoding picks each
    step's argmax given the tokens picked before it."""
    lead, flat = self._flatten(obs)
    b, n = self._batch(flat), self.num_tokens
    if self.decode == "parallel":
      logp_all, _ = self._log_softmax(params, flat, jnp.zeros((b, n), jnp.int32))
      tokens = jnp.argmax(logp_all, axis=-1).astype(jnp.int32)
    else:
      def step(tokens, i):
        logp_all, _ = self._log_softmax(params, flat, tokens)
        tok = jnp.argmax(jax.lax.dynamic_index_in_dim(logp_all, i, axis=1, keepdims=False), axis=-1)
        return jax.lax.dynamic_update_index_in_dim(tokens, tok.astype(jnp.int32), i, axis=1), None

      tokens, _ = jax.lax.scan(step, jnp.zeros((b, n), jnp.int32), jnp.arange(n))
    chex.assert_shape(tokens, (b, n))
    return tokens.reshape(lead + tokens.shape[1:])

  def log_probs(self, params: Params, obs: Obs, action: jax.Array, level: str = "chunk") -> jax.Array:
    """Log-prob of `action` [..., K*A] per token [..., K*A], per action [..., K] or per chunk [...]."""
    if level not in LEVELS:
      raise ValueError(f"level must be one of {LEVELS}, got '{level}'")
    tokens = self.action_tokenizer.to_tokens(action)
    logp_all, _ = self.token_logits(params, obs, tokens)
    token_logp = jnp.take_along_axis(logp_all, tokens[..., None], axis=-1)[..., 0]
    if level == "token":
      return token_logp
    if level == "action":
      return token_logp.reshape(token_logp.shape[:-1] + (self.chunk_size, self.action_dim)).sum(-1)
    return token_logp.sum(-1)

  def evaluate(self, params: Params, obs: Obs, action: jax.Array):
    """(logp of the chunk, sum of per-token categorical entropies, value); tokens come from the float action."""
    token_logp, entropy, value = self.evaluate_tokens(params, obs, action)
    return token_logp.sum(-1), entropy, value

  def evaluate_tokens(self, params: Params, obs: Obs, action: jax.Array):
    """`evaluate` with the log-prob of each action token [..., K*A] instead of their sum: PPO with
    algorithm.ratio_level="token" clips each token's ratio, as LLM and VLA PPO recipes do."""
    token_logp, entropy, value, _ = self.evaluate_token_distributions(params, obs, action)
    return token_logp, entropy, value

  def evaluate_token_distributions(self, params: Params, obs: Obs, action: jax.Array):
    """`evaluate_tokens` plus every token's whole distribution, log-softmaxed [..., K*A, bins]: the
    KL penalty toward a reference is then exact (a sum over the bins) instead of estimated from the
    one token each sample drew."""
    tokens = self.action_tokenizer.to_tokens(action)
    logp_all, value = self.token_logits(params, obs, tokens)
    token_logp = jnp.take_along_axis(logp_all, tokens[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=(-2, -1))
    return token_logp, entropy, value, logp_all

  def update_normalizer(self, params: Params, obs: Obs, weight: jax.Array) -> Params:
    if "state" not in self.spec.obs:
      return params
    stats = normalizer.update_stats(params["obs_norm"], obs["state"], weight)
    return {**params, "obs_norm": stats}
