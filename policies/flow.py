"""Flow-matching action-chunk policy with a tractable log-likelihood (ReinFlow / flow-noise).

Why: a flow policy models multi-modal action chunks (pi0-style) and can be
pretrained by conditional flow matching on demonstrations, but a deterministic
ODE sample has no log-prob for policy-gradient RL. Following ReinFlow, each of
the `steps` Euler steps of the velocity field v(x, t | obs) gets learned
Gaussian noise, x_{k+1} = x_k + v(x_k, t_k) dt + sigma_k * eps_k, x_0 ~ N(0, I),
so the denoising chain is a Markov chain of Gaussian transitions and

  log p(chain) = log N(x_0; 0, I) + sum_k log N(x_{k+1}; x_k + v(x_k, t_k) dt, sigma_k^2).

The policy's "action" is the whole chain, because `evaluate` sees only the
action: raw layout [a (the env chunk, D = K*A), x_0, x_1, ..., x_{S-1}], with
a = center + half_range * x_S a fixed affine map of the last chain state onto the
env's box (identity for MetaWorld's [-1, 1]; identity when a bound is infinite).
The chain itself is unsquashed: the sampler clips a to the bounds, as for the
Gaussian MLP. Log-probs are densities of the raw vector (the affine map adds a
constant -sum(log half_range)), so PPO ratios are unaffected by it.

Entropy: the chain's transitions have state-independent covariances, so its
joint entropy is exact and independent of v: H(N(0, I)) + sum_k H(N(0, sigma_k^2))
+ sum(log half_range). It is an upper bound on the entropy of the final chunk
alone, and its gradient only pushes up the noise scales: a sensible bonus.

sigma_k is per step and per dim, log sigma = lo + (hi - lo) * sigmoid(raw): bounded
without the dead gradients of a hard clip (lo, `policy.flow_min_log_std`, is the noise floor
fine-tuning keeps).

`mean_action` runs the same chain from x_0 = 0 with no noise: the deterministic chunk, in the raw
layout of `sample`.

Fine-tuning only the last K denoising steps (DPPO; `policy.flow_finetune_steps` = K, 0 = all):
the first S - K steps use a frozen copy of the velocity net, params["base"]["vel"] (outside
params["net"], which is all an optimiser trains), and their noise scales are held by
stop_gradient; the last K use params["net"]. `sample`, `mean_action` and `evaluate` split the
chain the same way, so log-probs stay exact and only the last K steps get gradients.
params["base"] holds copies of params["net"] subtrees under the same keys: a warm start whose
params have no "base" (a launch.sft run) gets it copied from the loaded net (ebrl/warm_start.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ebrl import normalizer
from policies.base import FlatInputs, Obs, Params, check_chunk, check_compatible, check_instructions, vector_inputs
from policies.mlp import gaussian_logp
from policies.tokenizer import InstructionTokenizer
from sim_adapters.base import EnvSpec

_HALF_LOG_2PI = 0.5 * float(np.log(2 * np.pi))
_HALF_LOG_2PIE = 0.5 * float(np.log(2 * np.pi * np.e))  # Entropy of N(0, 1).


class _MLP(nn.Module):
  hidden: Sequence[int]
  out: int
  out_scale: float
  act: str = "tanh"

  @nn.compact
  def __call__(self, x):
    act = nn.tanh if self.act == "tanh" else nn.silu
    for h in self.hidden:
      x = act(nn.Dense(h, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
    return nn.Dense(self.out, kernel_init=nn.initializers.orthogonal(self.out_scale))(x)


def time_embedding(t: jax.Array, dim: int) -> jax.Array:
  """Sinusoidal features of t in [0, 1] -> [..., dim] (t itself plus sin/cos pairs)."""
  freqs = np.pi * 2.0 ** np.arange((dim - 1) // 2, dtype=np.float32)
  ang = t[..., None] * freqs
  return jnp.concatenate([t[..., None], jnp.sin(ang), jnp.cos(ang)], axis=-1)


class _FlowNet(nn.Module):
  chunk_dim: int
  steps: int
  hidden: Sequence[int]
  critic_hidden: Sequence[int]
  time_dim: int
  raw_init: float

  def setup(self):
    self.vel = _MLP(self.hidden, self.chunk_dim, 0.01, act="silu")
    self.critic = _MLP(self.critic_hidden, 1, 1.0)
    self.noise_raw = self.param("noise_raw", nn.initializers.constant(self.raw_init), (self.steps, self.chunk_dim))

  def velocity(self, obs_x, x, t):
    return self.vel(jnp.concatenate([obs_x, x, time_embedding(t, self.time_dim)], axis=-1))

  def value(self, obs_x):
    return self.critic(obs_x)[..., 0]

  def raw_noise(self):
    return self.noise_raw

  def __call__(self, obs_x, x, t):  # Only for init: touches every parameter.
    return self.velocity(obs_x, x, t), self.value(obs_x), self.noise_raw


@dataclasses.dataclass(frozen=True)
class FlowPolicy(FlatInputs):
  """Noisy-Euler flow policy over chunks of `chunk_size` actions (env action_dim = K * A)."""

  spec: EnvSpec
  chunk_size: int | None = None  # None: spec.chunk_size when the spec has one, else 1.
  steps: int = 4
  hidden: tuple[int, ...] = (128, 128)
  critic_hidden: tuple[int, ...] = (64, 64)
  time_dim: int = 16
  init_log_std: float = -1.0
  min_log_std: float = -4.0
  max_log_std: float = 0.0
  # K: only the last K of the `steps` denoising steps use (and train) params["net"]'s velocity; the
  # first steps - K use the frozen params["base"] copy. 0 (or `steps`): every step is trained.
  finetune_steps: int = 0
  # One instruction per task id (a multi-task env): the expert is conditioned on its words as a bag of
  # words beside the state, so the first layer learns a word embedding per vocabulary entry.
  instructions: tuple[str, ...] = ()
  name: str = "flow"

  def __post_init__(self):
    check_compatible(self.name, ("state",), self.spec)
    if self.chunk_size is None:
      object.__setattr__(self, "chunk_size", self.spec.chunk_size)
    check_chunk(self.spec, self.chunk_size)
    if self.instructions and "task" in self.spec.obs:
      check_instructions(self.name, self.spec, self.instructions)
    if self.steps < 1:
      raise ValueError(f"steps must be >= 1, got {self.steps}")
    if not self.min_log_std < self.init_log_std < self.max_log_std:
      raise ValueError("need min_log_std < init_log_std < max_log_std")
    if not 0 <= self.finetune_steps <= self.steps:
      raise ValueError(f"finetune_steps={self.finetune_steps} must be in [0, steps={self.steps}]")

  # --- shapes -----------------------------------------------------------------


  @property
  def chunk_dim(self) -> int:
    """D = K * A, what the env executes per decision (= spec.action_dim)."""
    return self.spec.action_dim

  @property
  def step_action_dim(self) -> int:
    """A, the dims of one action in the chunk."""
    return self.spec.action_dim // self.chunk_size

  @property
  def frozen_steps(self) -> int:
    """The first denoising steps that use the frozen params["base"] velocity (0: none, no "base")."""
    k = self.finetune_steps
    return self.steps - k if 0 < k < self.steps else 0

  @property
  def action_size(self) -> int:
    """Width of the raw action: the chunk plus the S chain states before it."""
    return (self.steps + 1) * self.chunk_dim

  @property
  def _affine(self) -> tuple[np.ndarray, np.ndarray]:
    """(center, half_range) of the env box; (0, 1) on dims with an infinite bound."""
    lo, hi = np.asarray(self.spec.action_low, np.float64), np.asarray(self.spec.action_high, np.float64)
    ok = np.isfinite(lo) & np.isfinite(hi) & (hi > lo)
    center = np.where(ok, 0.5 * (hi + lo), 0.0).astype(np.float32)
    half = np.where(ok, 0.5 * (hi - lo), 1.0).astype(np.float32)
    return np.broadcast_to(center, (self.chunk_dim,)), np.broadcast_to(half, (self.chunk_dim,))

  @property
  def _net(self) -> _FlowNet:
    frac = (self.init_log_std - self.min_log_std) / (self.max_log_std - self.min_log_std)
    return _FlowNet(self.chunk_dim, self.steps, tuple(self.hidden), tuple(self.critic_hidden), self.time_dim,
                    float(np.log(frac / (1 - frac))))

  # --- pieces (public so tests and tools can recompute the chain) --------------
  def _inputs(self, obs: Obs) -> jax.Array:
    return vector_inputs(obs, self.input_keys)

  @functools.cached_property
  def _task_words(self) -> np.ndarray | None:
    """[tasks, vocab] word counts of each task's instruction, or None without instructions."""
    if not self.instructions or "task" not in self.spec.obs:
      return None
    return InstructionTokenizer.from_texts(self.instructions).word_counts(self.instructions)

  @property
  def cond_dim(self) -> int:
    """Width of what the velocity field and critic are conditioned on: the state, then the words."""
    words = self._task_words
    return self.input_dim + (0 if words is None else words.shape[1])

  def normalized_obs(self, params: Params, obs: Obs) -> jax.Array:
    x = normalizer.normalize(params["obs_norm"], self._inputs(obs))
    words = self._task_words
    if words is None:
      return x
    return jnp.concatenate([x, jnp.asarray(words)[jnp.argmax(obs["task"], axis=-1)]], axis=-1)

  def velocity(self, params: Params, obs_x: jax.Array, x: jax.Array, t: jax.Array) -> jax.Array:
    """v(x, t | obs) of params["net"] for normalised obs_x [B, I], chain states x [B, D], times t [B]."""
    return self._net.apply({"params": params["net"]}, obs_x, x, t, method=_FlowNet.velocity)

  def _velocity_of(self, vel: Params, obs_x: jax.Array, x: jax.Array, t: jax.Array) -> jax.Array:
    """v(x, t | obs) of velocity-net params `vel` (params["net"]["vel"] or params["base"]["vel"])."""
    net = _MLP(tuple(self.hidden), self.chunk_dim, 0.01, act="silu")  # _FlowNet.vel, applied alone.
    return net.apply({"params": vel}, jnp.concatenate([obs_x, x, time_embedding(t, self.time_dim)], axis=-1))

  def base_velocity(self, params: Params, obs_x: jax.Array, x: jax.Array, t: jax.Array) -> jax.Array:
    """v(x, t | obs) of the frozen copy the first `frozen_steps` steps use."""
    return self._velocity_of(params["base"]["vel"], obs_x, x, t)

  def sync_base(self, params: Params) -> Params:
    """params whose frozen copy is (a copy of) params["net"]'s velocity net; as they are without one."""
    if not self.frozen_steps:
      return params
    return {**params, "base": {"vel": jax.tree.map(jnp.array, params["net"]["vel"])}}

  def noise_log_std(self, params: Params) -> jax.Array:
    """log sigma_k per step and dim, [S, D], bounded to [min_log_std, max_log_std]; the frozen steps'
    rows carry no gradient."""
    raw = params["net"]["noise_raw"]
    log_std = self.min_log_std + (self.max_log_std - self.min_log_std) * jax.nn.sigmoid(raw)
    f = self.frozen_steps
    if f:
      log_std = jnp.concatenate([jax.lax.stop_gradient(log_std[:f]), log_std[f:]], axis=0)
    return log_std

  def value(self, params: Params, obs: Obs) -> jax.Array:
    """Critic alone: what a bootstrap needs without a chain to evaluate."""
    return self._net.apply({"params": params["net"]}, self.normalized_obs(params, obs), method=_FlowNet.value)

  def _log_det(self) -> float:
    return float(np.sum(np.log(self._affine[1])))

  # --- Policy contract ------------------------------------------------------------
  def init(self, key: jax.Array) -> Params:
    d = self.chunk_dim
    net = self._net.init(key, jnp.zeros((1, self.cond_dim)), jnp.zeros((1, d)), jnp.zeros((1,)))["params"]
    return self.sync_base({"net": net, "obs_norm": normalizer.init_stats(self.input_dim)})

  def _chain(self, params: Params, obs_x: jax.Array, x0: jax.Array, eps: jax.Array) -> jax.Array:
    """The raw action [B, action_size] of the chain from x0 [B, D] with standard noise eps [S, B, D]:
    the frozen steps on params["base"]'s velocity, the rest on params["net"]'s."""
    b, d, s, f = x0.shape[0], self.chunk_dim, self.steps, self.frozen_steps
    log_std = self.noise_log_std(params)

    def segment(x, vel, first, last):
      def step(x, inp):
        k, e = inp
        t = jnp.full((b,), k / s, jnp.float32)
        return x + self._velocity_of(vel, obs_x, x, t) / s + jnp.exp(log_std[k]) * e, x
      return jax.lax.scan(step, x, (jnp.arange(first, last), eps[first:last]))

    parts = []
    x = x0
    if f:
      x, xs = segment(x, params["base"]["vel"], 0, f)
      parts.append(xs)
    x, xs = segment(x, params["net"]["vel"], f, s)
    xs = jnp.concatenate(parts + [xs], axis=0)  # [S, B, D] = x_0..x_{S-1}
    center, half = self._affine
    chunk = center + half * x
    action = jnp.concatenate([chunk, jnp.moveaxis(xs, 0, 1).reshape(b, s * d)], axis=-1)
    chex.assert_shape(action, (b, self.action_size))
    return action

  def mean_action(self, params: Params, obs: Obs) -> jax.Array:
    """The deterministic chain: from x_0 = 0, no noise injected; raw layout as `sample`'s [B, action_size]."""
    obs_x = self.normalized_obs(params, obs)
    b, d = obs_x.shape[0], self.chunk_dim
    return self._chain(params, obs_x, jnp.zeros((b, d)), jnp.zeros((self.steps, b, d)))

  def sample(self, params: Params, obs: Obs, key: jax.Array):
    obs_x = self.normalized_obs(params, obs)
    b, d, s = obs_x.shape[0], self.chunk_dim, self.steps
    log_std = self.noise_log_std(params)
    k0, kn = jax.random.split(key)
    x0 = jax.random.normal(k0, (b, d))
    eps = jax.random.normal(kn, (s, b, d))
    action = self._chain(params, obs_x, x0, eps)
    logp = (_std_normal_logp(x0) + jnp.sum(-0.5 * jnp.square(eps) - log_std[:, None] - _HALF_LOG_2PI, (0, 2))
            - self._log_det())
    value = self._net.apply({"params": params["net"]}, obs_x, method=_FlowNet.value)
    chex.assert_shape(action, (b, self.action_size))
    chex.assert_shape([logp, value], (b,))
    return action, logp, value, {}

  def evaluate_tokens(self, params: Params, obs: Obs, action: jax.Array):
    """`evaluate` with the log-prob of each denoising step [..., S] instead of their sum: PPO with
    algorithm.ratio_level="token" clips each step's ratio on its own (DPPO's denoising MDP). The
    chain's density is sharp (S x D Gaussian dims at a small sigma), so one optimiser step already
    moves a whole chain's ratio outside the clip range for most samples; per step, each ratio is
    bounded by what its own step moved."""
    lead = action.shape[:-1]
    if len(lead) != 1:
      flat = lambda x: x.reshape((-1,) + x.shape[len(lead):])
      logp, entropy, value = self.evaluate_tokens(params, jax.tree.map(flat, obs), flat(action))
      return logp.reshape(lead + logp.shape[-1:]), entropy.reshape(lead), value.reshape(lead)
    obs_x = self.normalized_obs(params, obs)
    b, d, s = obs_x.shape[0], self.chunk_dim, self.steps
    chex.assert_shape(action, (b, self.action_size))
    center, half = self._affine
    x_final = (action[:, :d] - center) / half
    xs = action[:, d:].reshape(b, s, d)  # x_0..x_{S-1}
    targets = jnp.concatenate([xs[:, 1:], x_final[:, None]], axis=1)  # x_1..x_S
    t = jnp.broadcast_to(jnp.arange(s, dtype=jnp.float32) / s, (b, s))
    obs_rep = jnp.broadcast_to(obs_x[:, None], (b, s, obs_x.shape[-1]))

    def vel(vel_params, lo, hi):  # The steps lo..hi-1 of every row, on one velocity net.
      n = hi - lo
      return self._velocity_of(vel_params, obs_rep[:, lo:hi].reshape(b * n, -1), xs[:, lo:hi].reshape(b * n, d),
                               t[:, lo:hi].reshape(b * n)).reshape(b, n, d)

    f = self.frozen_steps
    v = vel(params["net"]["vel"], f, s)
    if f:
      v = jnp.concatenate([vel(params["base"]["vel"], 0, f), v], axis=1)
    log_std = self.noise_log_std(params)
    step_logp = gaussian_logp(targets, xs + v / s, jnp.broadcast_to(log_std, (b, s, d)))  # [B, S]
    # The terms no parameter moves (x_0's density, the affine map's log-det) ride on step 0, so the
    # steps' log-probs sum to the chain's.
    step_logp = step_logp.at[:, 0].add(_std_normal_logp(xs[:, 0]) - self._log_det())
    value = self._net.apply({"params": params["net"]}, obs_x, method=_FlowNet.value)
    entropy = jnp.broadcast_to(self.chain_entropy(params), (b,))
    chex.assert_shape(step_logp, (b, s))
    chex.assert_shape([entropy, value], (b,))
    return step_logp, entropy, value

  def evaluate(self, params: Params, obs: Obs, action: jax.Array):
    """(logp of the chain, its entropy, value) for actions with any leading axes: a minibatch's [B]
    or a segment batch's [T, S], which the async learner evaluates whole."""
    step_logp, entropy, value = self.evaluate_tokens(params, obs, action)
    return step_logp.sum(-1), entropy, value

  def chain_entropy(self, params: Params) -> jax.Array:
    """Exact joint entropy of the raw action (the chain), a scalar; see the module doc."""
    return (self.action_size * _HALF_LOG_2PIE + jnp.sum(self.noise_log_std(params)) + self._log_det())

  def update_normalizer(self, params: Params, obs: Obs, weight: jax.Array) -> Params:
    stats = normalizer.update_stats(params["obs_norm"], self._inputs(obs), weight)
    return {**params, "obs_norm": stats}

  # --- behaviour cloning ----------------------------------------------------------
  def flow_matching_loss(self, params: Params, obs: Obs, actions_chunk: jax.Array, key: jax.Array) -> jax.Array:
    """Conditional flow-matching loss (scalar) on demo chunks [B, D] or [B, K, A] in env units.

    x_1 = the demo mapped into chain units, x_0 ~ N(0, I), t ~ U(0, 1),
    x_t = (1 - t) x_0 + t x_1, loss = mean ||v(x_t, t) - (x_1 - x_0)||^2 (per dim).
    Trains params["net"] velocity only (not the noise scales or the critic);
    update obs_norm from the demo observations first so RL sees the same inputs.
    """
    obs_x = self.normalized_obs(params, obs)
    b, d = obs_x.shape[0], self.chunk_dim
    center, half = self._affine
    x1 = (actions_chunk.reshape(b, d).astype(jnp.float32) - center) / half
    k0, kt = jax.random.split(key)
    x0 = jax.random.normal(k0, (b, d))
    t = jax.random.uniform(kt, (b,))
    xt = (1 - t[:, None]) * x0 + t[:, None] * x1
    v = self.velocity(params, obs_x, xt, t)
    chex.assert_shape(v, (b, d))
    return jnp.mean(jnp.square(v - (x1 - x0)))



def _std_normal_logp(x: jax.Array) -> jax.Array:
  return jnp.sum(-0.5 * jnp.square(x) - _HALF_LOG_2PI, axis=-1)
