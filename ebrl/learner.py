"""The learner: one jitted PPO update over a rollout, data-parallel over a Mesh.

update(train_state, rollout) -> (train_state, metrics) runs `epochs` passes of
`num_minibatches` Adam steps (Brax's PPO layout: one compiled call per update).
The rollout is sharded along its env axis over every device of the mesh and
the params are replicated; XLA inserts the gradient all-reduce, so the update
is the same on 1 or D devices up to the order of float sums.

A minibatch whose loss or gradient is not finite is skipped: params and
optimiser state stay as they were and `skipped_updates` counts it. The
observation normaliser is updated after the epochs, so the ratio at the first
epoch is exactly 1 against the behaviour policy. With `value_norm` the critic
predicts returns standardised by running statistics of its targets
(TrainState.value_norm, updated after the epochs too); with `target_kl` the
rest of an update's minibatch steps are skipped once one measures too large a
KL; the learning rate is set per update from the schedule.

Fine-tuning a pre-trained policy: for the first `critic_warmup_updates` updates
only the critic's leaves (policies.base.critic_mask) get gradients and the
observation statistics stand still, so the acting policy is bit-identical while
the fresh critic learns its values (a random critic's advantages would otherwise
pull the pre-trained actor anywhere); `ref_kl_coef` adds a KL penalty toward the
params the run started from (TrainState.reference), exact over the bins for a policy
of categorical tokens (`evaluate_token_distributions`), estimated from the batch's
actions otherwise.

With `algorithm="grpo"` the on-policy update is critic-free: advantages are
group-relative returns over `group_size` consecutive same-seed envs
(ebrl/algorithms/grpo.py), already normalised per group, and there is no value
loss; clipping, masking and minibatches are PPO's. Segment batches (the async
schedulers) have no aligned groups, so `update_segments` rejects grpo.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ebrl import normalizer
from ebrl.algorithms import imitation
from ebrl.algorithms.gae import gae
from ebrl.algorithms.grpo import group_relative_advantages
from ebrl.algorithms.ppo import PPOConfig, kl_to_reference, masked_mean, ppo_loss, token_kl_to_reference
from ebrl.algorithms.vtrace import vtrace
from ebrl.algorithms.staleness import fresh_mask
from ebrl.step_normalizer import identity_stats
from ebrl.types import Rollout, SegmentBatch, TrainState
from policies.base import Policy, critic_mask


OBS_NORM_UPDATES = ("after", "before", "every_step", "frozen")  # When the observation statistics take a batch.
REF_KL_MODES = ("sample", "mean")  # What the KL penalty toward the reference measures (LearnerConfig).


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  gamma: float = 0.99
  gae_lambda: float = 0.95
  epochs: int = 4
  num_minibatches: int = 4
  learning_rate: float = 3e-4
  lr_schedule: str = "constant"  # or "linear" (to 0 over total_updates)
  total_updates: int = 1
  max_grad_norm: float = 0.5
  # KL early stopping: an update's remaining minibatch steps are skipped once one minibatch
  # measures approx KL (against the policy the update started from) above 1.5 * target_kl, as
  # Stable-Baselines3 does; 0 = every epoch runs.
  target_kl: float = 0.0
  reward_scale: float = 1.0
  # Reward normalisation (ebrl/normalizer.py normalize_rewards): rewards divided by a running std of
  # each env's discounted return, then multiplied by reward_scale. num_envs sizes the per-env returns.
  reward_norm: bool = False
  num_envs: int = 1
  # When the observation normaliser takes an update's batch: "after" its epochs (the update trains
  # on the statistics the batch was acted with), or "before" them: the statistics include the batch,
  # the proximal log-probs are taken again under them, and the behaviour weight (decoupled PPO)
  # corrects the small shift from the statistics the batch was acted with. "before" is how
  # VecNormalize behaves (every observation is counted before it is normalised), so the first
  # update already trains on normalised inputs and the critic it fits is the one the next rollout
  # evaluates with.
  # "every_step" (scheduler=sync, host envs, mlp): the acting loop merges every step's observations as
  # they arrive (ebrl/step_normalizer.py), the rollout holds them normalised as acted on, and the
  # update trains on exactly those with identity statistics; the state's statistics are the acting
  # loop's, set by the scheduler before the update, and the update leaves them as they are.
  # "frozen": never: the statistics a warm start brought (the demos') stay bit-identical, so a pre-trained
  # network keeps seeing the inputs it was trained on.
  obs_norm_update: str = "after"
  # Value normalisation: the critic predicts returns standardised by running statistics of the
  # value targets (TrainState.value_norm), whose history weighs as at most value_norm_count
  # samples so they follow the returns as the policy improves. Off: the identity.
  value_norm: bool = False
  value_norm_count: float = 100_000.0
  max_staleness: int = 0  # Off-policy batches: samples older than this many versions are masked.
  # Off-policy correction of segment batches: "decoupled_ppo" (AReaL) or "vtrace" (IMPALA
  # targets and advantages, PPO ratio against the behaviour policy, as APPO).
  correction: str = "decoupled_ppo"
  vtrace_rho_clip: float = 1.0
  vtrace_c_clip: float = 1.0
  # "ppo" (GAE advantages, value loss) or "grpo": critic-free group-relative advantages over
  # `group_size` consecutive same-seed envs (ebrl/algorithms/grpo.py); on-policy `update` only.
  algorithm: str = "ppo"
  group_size: int = 1
  # Fine-tuning: updates (policy versions 0 .. n-1) that train only the critic, and the weight of
  # the KL penalty toward TrainState.reference (0: no reference is kept).
  critic_warmup_updates: int = 0
  ref_kl_coef: float = 0.0
  # With critic_warmup_ev > 0 the warm-up ends at the first update whose batch the critic explains to
  # at least this fraction of the targets' variance, and critic_warmup_updates is only its cap.
  critic_warmup_ev: float = 0.0
  # "sample": KL(policy || reference) estimated on the batch's actions (every policy); "mean": a
  # Gaussian policy's mean against the reference's, in the reference's std (0.5 sum ((mu - mu_ref) /
  # std_ref)^2), so exploration (the std) may shrink or grow without being pulled back.
  ref_kl_mode: str = "sample"
  # Separate Adam states, gradient-norm clips and rates for the actor and the critic (the leaves
  # policies.base.critic_mask marks) when either is > 0 (0: learning_rate); one Adam when both are 0.
  actor_learning_rate: float = 0.0
  critic_learning_rate: float = 0.0
  # The demonstration term (DAPG): bc_coef * bc_decay**version times the policy family's
  # imitation loss (ebrl/algorithms/imitation.py) on bc_batch_size demo rows drawn per minibatch step.
  bc_coef: float = 0.0
  bc_decay: float = 1.0
  bc_batch_size: int = 256
  # What PPO's ratio is taken over: "decision" (the whole action or chunk) or "token" (each action
  # token of a tokenising policy, the vla: ppo_loss clips each token's ratio; target_kl then
  # bounds the approx KL per token).
  ratio_level: str = "decision"
  ppo: PPOConfig = PPOConfig()

  @classmethod
  def of(cls, a, layout, max_staleness: int) -> "LearnerConfig":
    """A run's learner settings: its `algorithm` settings (ebrl/spec.py), with the per-transition
    discount and the update count from its RunLayout and the async scheduler's staleness bound."""
    return cls(
        gamma=layout.gamma, gae_lambda=a.gae_lambda, epochs=a.epochs, num_minibatches=a.num_minibatches,
        learning_rate=a.learning_rate, lr_schedule=a.lr_schedule, total_updates=layout.total_updates,
        max_grad_norm=a.max_grad_norm, target_kl=a.target_kl, reward_scale=a.reward_scale,
        reward_norm=a.reward_norm, num_envs=layout.run_num_envs, obs_norm_update=a.obs_norm_update,
        value_norm=a.value_norm, value_norm_count=float(a.value_norm_count), max_staleness=max_staleness,
        algorithm=a.name, group_size=a.group_size,
        critic_warmup_updates=a.critic_warmup_updates, ref_kl_coef=float(a.ref_kl_coef), ratio_level=a.ratio_level,
        critic_warmup_ev=float(a.critic_warmup_ev), ref_kl_mode=a.ref_kl_mode,
        actor_learning_rate=float(a.actor_learning_rate), critic_learning_rate=float(a.critic_learning_rate),
        bc_coef=float(a.bc_coef), bc_decay=float(a.bc_decay), bc_batch_size=int(a.bc_batch_size),
        correction=a.correction, vtrace_rho_clip=a.vtrace_rho_clip, vtrace_c_clip=a.vtrace_c_clip,
        ppo=PPOConfig(clip_eps=a.clip_eps, value_clip_eps=a.value_clip_eps, vf_coef=a.vf_coef,
                      ent_coef=a.ent_coef, normalize_advantages=a.normalize_advantages,
                      behaviour_weight_clip=a.behaviour_weight_clip))


def learning_rate_schedule(cfg: LearnerConfig) -> optax.Schedule:
  """The rate of update u (the policy version it starts from), the same for every Adam step of
  that update: "linear" decays to 0 over the run's total_updates updates, so the last update has
  learning_rate / total_updates. Counting updates, not Adam steps, keeps the schedule true when
  KL early stopping skips some of an update's steps."""
  if cfg.lr_schedule == "linear":
    # Time-limited runs (benchmarks) pay for more updates than an int32 counts: nearly constant.
    return optax.linear_schedule(cfg.learning_rate, 0.0, max(1, min(cfg.total_updates, 2**31 - 1)))
  return optax.constant_schedule(cfg.learning_rate)


def separate_optimizers(cfg: LearnerConfig) -> bool:
  """Whether actor and critic have Adam states (and rates) of their own."""
  return cfg.actor_learning_rate > 0 or cfg.critic_learning_rate > 0


def group_rates(cfg: LearnerConfig) -> dict[str, float]:
  """The base rate of each optimiser group: "actor" and "critic", or "all"."""
  if not separate_optimizers(cfg):
    return {"all": cfg.learning_rate}
  return {"actor": cfg.actor_learning_rate or cfg.learning_rate,
          "critic": cfg.critic_learning_rate or cfg.learning_rate}


def _adam(cfg: LearnerConfig, rate: float) -> optax.GradientTransformation:
  # inject_hyperparams keeps the rate in the optimiser state, where each update sets it from the
  # schedule and the metrics read it (`learning_rate`).
  adam = optax.inject_hyperparams(optax.adam)(learning_rate=rate, eps=1e-5)
  return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adam)


def make_optimizer(cfg: LearnerConfig, net=None) -> optax.GradientTransformation:
  """One Adam over the whole net, or (separate_optimizers) one for the actor's leaves and one for the
  critic's, each with its own gradient-norm clip: a critic whose value loss pulls hard (a fresh
  critic under a pre-trained actor) then neither spends the actor's clip nor moves at its rate."""
  if not separate_optimizers(cfg):
    return _adam(cfg, cfg.learning_rate)
  rates = group_rates(cfg)
  labels = lambda net: jax.tree.map(lambda c: "critic" if c else "actor", critic_mask(net))
  return optax.multi_transform({g: _adam(cfg, r) for g, r in rates.items()}, labels)


def _inner_states(opt_state) -> dict:
  """{group: chain state} of an optimiser from `make_optimizer`."""
  if isinstance(opt_state, optax.MultiTransformState):
    return dict(opt_state.inner_states)
  return {"all": opt_state}


def _chain_rate(chain_state) -> jax.Array:
  return chain_state[1].hyperparams["learning_rate"]


def _with_chain_rate(chain_state, rate):
  hyper = {**chain_state[1].hyperparams, "learning_rate": jnp.asarray(rate, jnp.float32)}
  return (chain_state[0], chain_state[1]._replace(hyperparams=hyper)) + tuple(chain_state[2:])


def learning_rates(opt_state) -> dict[str, jax.Array]:
  """The rate of the latest update per optimiser group."""
  out = {}
  for group, inner in _inner_states(opt_state).items():
    inner = getattr(inner, "inner_state", inner)  # multi_transform wraps each group's state.
    out[group] = _chain_rate(inner)
  return out


def learning_rate(opt_state) -> jax.Array:
  """The rate of the latest update (the actor's where actor and critic have their own)."""
  rates = learning_rates(opt_state)
  return rates.get("all", rates.get("actor"))


def with_learning_rate(opt_state, scale: jax.Array, cfg: LearnerConfig | None = None):
  """The optimiser state with the rates every step of the next update uses: `scale` is the rate
  itself for one optimiser, or the schedule's factor (rate / learning_rate) that multiplies each
  group's base rate."""
  if not isinstance(opt_state, optax.MultiTransformState):
    return _with_chain_rate(opt_state, scale)
  factor = scale / cfg.learning_rate
  inner = {}
  for group, state in opt_state.inner_states.items():
    wrapped = getattr(state, "inner_state", None)
    rate = group_rates(cfg)[group] * factor
    inner[group] = (state._replace(inner_state=_with_chain_rate(wrapped, rate)) if wrapped is not None
                    else _with_chain_rate(state, rate))
  return opt_state._replace(inner_states=inner)


def make_mesh(devices=None) -> Mesh:
  devices = np.asarray(devices if devices is not None else jax.local_devices())
  return Mesh(devices.reshape(-1), ("data",))


def spans_processes(mesh: Mesh) -> bool:
  """Whether `mesh` holds devices of other processes (a learner over several hosts' devices)."""
  return any(d.process_index != jax.process_index() for d in mesh.devices.flat)


def process_local(tree):
  """This process's copy of each array of `tree` that spans processes (a replicated train state of a
  learner over several processes), for what acts on local devices: the sampler, checkpoints, metrics.
  Arrays held whole by this process are returned as they are."""
  return jax.tree.map(lambda x: x.addressable_data(0) if isinstance(x, jax.Array) and not x.is_fully_addressable
                      else x, tree)


def init_train_state(policy: Policy, cfg: LearnerConfig, key: jax.Array) -> TrainState:
  init_key, key = jax.random.split(key)
  params = policy.init(init_key)
  return TrainState(params=params, opt_state=make_optimizer(cfg).init(params["net"]), key=key,
                    version=jnp.zeros((), jnp.int32), skipped_updates=jnp.zeros((), jnp.int32),
                    value_norm=normalizer.init_stats(1), reward_norm=normalizer.init_return_norm(cfg.num_envs),
                    reference=params if cfg.ref_kl_coef > 0 else None,
                    critic_ready=jnp.zeros((), bool) if cfg.critic_warmup_ev > 0 else None)


def with_reference(state: TrainState, params) -> TrainState:
  """The state with `params` and, where it keeps a reference (ref_kl_coef > 0), a copy of them as the
  reference: what a warm start sets. The copies are buffers of their own, so donating the state to
  an update never hands one array to XLA twice."""
  state = state.replace(params=params)
  if state.reference is None:
    return state
  return state.replace(reference=jax.tree.map(lambda x: jnp.array(x, copy=True), params))


def rollout_sharding(mesh: Mesh, rollout: Rollout) -> Rollout:
  """Shards every [T, N, ...] leaf along N (axis 1) over the mesh's data axis, and a [N] leaf (a
  segment batch's env ids) along its only axis."""
  return jax.tree.map(lambda x: NamedSharding(mesh, P(None, "data") if np.ndim(x) > 1 else P("data")), rollout)


class Learner:
  """Owns the jitted update; `update` takes host or device rollouts."""

  def __init__(self, policy: Policy, cfg: LearnerConfig, mesh: Mesh | None = None,
               demos: dict | None = None):
    """demos: the demonstration rows of the bc term ({"obs": {key: [N, ...]}, "actions": [N, K*A],
    "mask": [N, K*A]}, numpy), needed when cfg.bc_coef > 0; held on the learner's devices, replicated."""
    if cfg.algorithm not in ("ppo", "grpo"):
      raise ValueError(f"unknown learner algorithm '{cfg.algorithm}'; valid: ppo, grpo")
    if cfg.obs_norm_update not in OBS_NORM_UPDATES:
      raise ValueError(f"unknown obs_norm_update '{cfg.obs_norm_update}'; valid: {', '.join(OBS_NORM_UPDATES)}")
    if cfg.algorithm == "grpo" and cfg.group_size < 2:
      raise ValueError(f"grpo needs group_size >= 2 (got {cfg.group_size}): a group of one env has no baseline")
    if cfg.ref_kl_coef > 0 and cfg.obs_norm_update == "every_step":
      raise ValueError("ref_kl_coef > 0 needs raw observations in the batch (the reference normalises them with "
                       "its own statistics); obs_norm_update='every_step' stores them normalised")
    if cfg.ref_kl_mode not in REF_KL_MODES:
      raise ValueError(f"unknown ref_kl_mode '{cfg.ref_kl_mode}'; valid: {', '.join(REF_KL_MODES)}")
    if cfg.ref_kl_coef > 0 and cfg.ref_kl_mode == "mean" and not hasattr(policy, "_forward"):
      raise ValueError(f"ref_kl_mode='mean' needs a Gaussian policy (mlp, cnn), not '{policy.name}'")
    if cfg.bc_coef > 0 and not demos:
      raise ValueError("bc_coef > 0 needs the demonstration rows (demos=...)")
    self.policy = policy
    self.cfg = cfg
    self.mesh = mesh or make_mesh()
    self._optimizer = make_optimizer(cfg)
    self.replicated = NamedSharding(self.mesh, P())  # Where a train state lives.
    self._demos = jax.device_put(demos, self.replicated) if cfg.bc_coef > 0 else None
    self._spans_processes = spans_processes(self.mesh)
    self._update: Callable = jax.jit(self._rollout_fn, donate_argnums=(0,))
    self._update_segments: Callable = jax.jit(self._segments_fn, donate_argnums=(0,))

  def init(self, key: jax.Array) -> TrainState:
    # One compiled call: run eagerly, Flax's initialisers (orthogonal: a QR per layer) dispatch
    # dozens of op-by-op compiles, about 2 s of every launch's start-up on a CPU.
    init = jax.jit(functools.partial(init_train_state, self.policy, self.cfg), out_shardings=self.replicated)
    state = init(key)
    return with_reference(state, state.params)  # The reference's own buffers (see with_reference).

  def check_alive(self) -> None:
    """In this process the learner cannot die apart from the run (ebrl/learner_process.py's can)."""

  def close(self) -> None:
    """Nothing to release in this process (a learner process is stopped here)."""

  def place(self, rollout: Rollout) -> Rollout:
    """The batch on the learner's mesh, split along its env axis. Over several processes each gives
    its own envs' columns, in process order: the global batch is every process's batch side by side."""
    shardings = rollout_sharding(self.mesh, rollout)
    if not self._spans_processes:
      return jax.device_put(rollout, shardings)
    return jax.tree.map(lambda s, x: jax.make_array_from_process_local_data(s, np.asarray(x)), shardings, rollout)

  def update(self, state: TrainState, rollout: Rollout) -> tuple[TrainState, dict]:
    return self._update(state, self.place(rollout), self._demos)

  def update_segments(self, state: TrainState, batch: SegmentBatch) -> tuple[TrainState, dict]:
    """Off-policy update (decoupled PPO or V-trace) from segments produced by older versions."""
    if self.cfg.algorithm == "grpo":
      raise ValueError("grpo compares the envs of a group at the same time index, which segments from "
                       "independent envs do not have; use the on-policy `update` (scheduler=sync)")
    if self.cfg.obs_norm_update == "every_step":
      raise ValueError("obs_norm_update='every_step' needs the sync acting loop's step-by-step statistics; "
                       "segments carry raw observations (use 'after' or 'before')")
    return self._update_segments(state, self.place(batch), self._demos)

  def _segments_fn(self, state: TrainState, sb: SegmentBatch, demos=None) -> tuple[TrainState, dict]:
    horizon = sb.actions.shape[0]
    shift = {}
    if self.cfg.obs_norm_update == "before":
      state, shift = self._normalise_first(state, jax.tree.map(lambda x: x[:horizon], sb.obs), sb.valid)
    # Values and proximal log-probs come from the params the update starts from (per token with
    # ratio_level="token", so that the update does not evaluate them again).
    actions = jnp.concatenate([sb.actions, jnp.zeros_like(sb.actions[:1])])
    prox_logp, _, values = self._proximal(state.params, sb.obs, actions)
    prox_logp, values = jax.lax.stop_gradient(prox_logp[:horizon]), jax.lax.stop_gradient(values)
    values_raw = normalizer.unstandardize(state.value_norm, values)  # Targets are in return units.
    fresh = fresh_mask(state.version, sb.version, self.cfg.max_staleness)
    valid = sb.valid & fresh
    obs = jax.tree.map(lambda x: x[:horizon], sb.obs)
    # Every transition that happened counts for the reward statistics, too stale or not.
    rewards, reward_norm = self._rewards(state, sb.rewards, sb.done, sb.valid, _gamma(self.cfg, sb), sb.env_ids,
                                         sb.bootstrap)
    ro = Rollout(obs=obs, actions=sb.actions, logp=prox_logp, values=values, rewards=rewards,
                 terminated=sb.terminated, done=sb.done, valid=valid, version=sb.version, discount=sb.discount)
    if self.cfg.correction == "vtrace":
      cfg = self.cfg
      targets = vtrace(rewards, values_raw, sb.terminated, _cut(sb.done, valid), prox_logp - sb.logp,
                       _gamma(cfg, sb), cfg.gae_lambda, cfg.vtrace_rho_clip, cfg.vtrace_c_clip)
      new_state, metrics = self._update_fn(state, ro.replace(logp=sb.logp), targets=targets,
                                           scaled=(rewards, reward_norm), demos=demos)
    else:
      new_state, metrics = self._update_fn(state, ro, behaviour_logp=sb.logp, scaled=(rewards, reward_norm),
                                           demos=demos)
    # Staleness of every sample that reached the learner, before any masking: the bound is
    # checked on what the admission path let through, not on what survived the mask.
    metrics.update(_staleness(state.version, sb.version, sb.valid))
    metrics["stale_dropped"] = jnp.sum(sb.valid & ~fresh)
    metrics.update(shift)
    return new_state, metrics

  def _rollout_fn(self, state: TrainState, ro: Rollout, demos=None) -> tuple[TrainState, dict]:
    """The on-policy update; with obs_norm_update="before" the normaliser takes the rollout first
    and the rollout's log-probs under the updated statistics are the proximal ones, weighed against
    the acting ones (equal while the statistics stand still); with "every_step" the rollout's
    observations are normalised already, by the statistics of their step."""
    if self.cfg.obs_norm_update in ("after", "frozen"):
      return self._update_fn(state, ro, demos=demos)
    if self.cfg.obs_norm_update == "every_step":
      stats = state.params["obs_norm"]
      as_acted = state.replace(params={**state.params, "obs_norm": identity_stats(stats.mean.shape[-1])})
      new_state, metrics = self._update_fn(as_acted, ro, demos=demos)
      return new_state.replace(params={**new_state.params, "obs_norm": stats}), metrics
    state, shift = self._normalise_first(state, ro.obs, ro.valid)
    prox_logp, _, _ = self._proximal(state.params, ro.obs, ro.actions)
    new_state, metrics = self._update_fn(state, ro.replace(logp=jax.lax.stop_gradient(prox_logp)),
                                         behaviour_logp=ro.logp, demos=demos)
    metrics.update(shift)
    return new_state, metrics

  def _proximal(self, params, obs, actions):
    """(log-probs, entropy, values) under `params`: the log-probs per action token with
    ratio_level="token" ([..., N]), per decision otherwise."""
    return (self.policy.evaluate_tokens if self.cfg.ratio_level == "token" else self.policy.evaluate)(
        params, obs, actions)

  def _normalise_first(self, state: TrainState, obs, valid: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
    """obs_norm_update="before": the state with the batch merged into the observation statistics
    before the epochs (rollouts and segments alike), and how far that moved them."""
    params = _unless_warming_up(self.cfg, warmup_of(self.cfg, state),
                                self.policy.update_normalizer(state.params, obs, valid), state.params)
    return state.replace(params=params), _normalizer_shift(state.params, params)

  def _rewards(self, state: TrainState, rewards: jax.Array, done: jax.Array, valid: jax.Array, gamma,
               env_ids: jax.Array | None, bootstrap: jax.Array | None) -> tuple[jax.Array, normalizer.ReturnNorm]:
    """The rewards an update learns from: normalised by the running std of the discounted return
    (algorithm.reward_norm), times reward_scale, plus a device simulator's truncation bootstrap
    (already in the critic's units); and the reward normalisation state after them.

    Segments of one env twice in a batch (possible under eta >= 1) both start from that env's
    return before the batch; only the statistics see the difference."""
    cfg, rn = self.cfg, state.reward_norm
    if cfg.reward_norm:
      ids = jnp.arange(rewards.shape[1], dtype=jnp.int32) if env_ids is None else env_ids
      rewards, rn = normalizer.normalize_rewards(rn, rewards, done, valid, gamma, ids)
    rewards = rewards * cfg.reward_scale
    return (rewards if bootstrap is None else rewards + bootstrap), rn

  # The whole algorithm, in one screen.
  def _update_fn(self, state: TrainState, ro: Rollout, behaviour_logp: jax.Array | None = None,
                 targets: tuple[jax.Array, jax.Array] | None = None,
                 scaled: tuple[jax.Array, normalizer.ReturnNorm] | None = None,
                 demos: dict | None = None) -> tuple[TrainState, dict]:
    cfg, policy = self.cfg, self.policy
    ppo_cfg = cfg.ppo
    # The rewards as learned from (`scaled`: computed by the caller, segments) and the reward
    # normalisation state after them.
    rewards, reward_norm = scaled or self._rewards(state, ro.rewards, ro.done, ro.valid, _gamma(cfg, ro), None,
                                                   ro.bootstrap)
    # ro.values are the critic's outputs, in value-normalised units; advantages and targets are
    # computed in return units and the targets standardised again for the value loss.
    values = normalizer.unstandardize(state.value_norm, ro.values)
    if targets is None and cfg.algorithm == "grpo":
      # Critic-free: the group mean is the baseline and the advantages are already normalised
      # per group; the value head gets no loss (its targets are its own old predictions).
      adv = group_relative_advantages(rewards, _cut(ro.done, ro.valid), ro.valid, cfg.group_size, _gamma(cfg, ro))
      returns = values[:-1]
      ppo_cfg = dataclasses.replace(cfg.ppo, vf_coef=0.0, normalize_advantages=False)
    elif targets is None:
      adv, returns = gae(rewards, values, ro.terminated, _cut(ro.done, ro.valid), _gamma(cfg, ro),
                         cfg.gae_lambda)
    else:
      adv, returns = targets
    flat = lambda x: x.reshape((-1,) + x.shape[2:])
    data = dict(obs=jax.tree.map(flat, ro.obs), actions=flat(ro.actions), logp=flat(ro.logp),
                values=flat(ro.values[:-1]), adv=flat(adv),
                returns=flat(normalizer.standardize(state.value_norm, returns)),
                mask=flat(ro.valid).astype(jnp.float32))
    if behaviour_logp is not None:
      data["behaviour_logp"] = flat(behaviour_logp)
    per_token = cfg.ratio_level == "token"
    exact_kl = cfg.ref_kl_coef > 0 and hasattr(policy, "evaluate_token_distributions")
    mean_kl = cfg.ref_kl_coef > 0 and cfg.ref_kl_mode == "mean"
    if mean_kl:  # The reference's Gaussian (mean, log std) on the batch, once per update.
      ref_mean, ref_log_std, _ = policy._forward(state.reference, ro.obs)  # pylint: disable=protected-access
      data["ref_mean"] = flat(jax.lax.stop_gradient(ref_mean))
      data["ref_inv_std"] = flat(jax.lax.stop_gradient(jnp.broadcast_to(jnp.exp(-ref_log_std), ref_mean.shape)))
    elif exact_kl:  # The reference's token distributions [B, N, bins], once per update.
      data["ref_dist"] = flat(jax.lax.stop_gradient(policy.evaluate_token_distributions(
          state.reference, ro.obs, ro.actions)[3]))
    elif cfg.ref_kl_coef > 0:  # The reference's log-probs of the batch's actions, once per update.
      ref_logp, _, _ = policy.evaluate(state.reference, ro.obs, ro.actions)
      data["ref_logp"] = flat(jax.lax.stop_gradient(ref_logp))
    if per_token and ro.logp.ndim == ro.valid.ndim:
      # The acting log-probs are per decision: the proximal policy (the params the update starts
      # from) per action token, once. (The segment and "before" paths pass them per token already.)
      prox_tokens, _, _ = self._proximal(state.params, ro.obs, ro.actions)
      data["logp"] = flat(jax.lax.stop_gradient(prox_tokens))
    is_critic = critic_mask(state.params["net"])
    num = data["adv"].shape[0]
    mb = num // cfg.num_minibatches
    scale = _target_scale(flat(values[:-1]), data["adv"], flat(returns), data["mask"])
    scale.update(_out_of_bounds(getattr(policy, "spec", None), data["actions"], data["mask"]))
    # The critic warm-up: a fixed count of updates, or (critic_warmup_ev) until the critic explains
    # the batch's targets well enough, at most that count.
    warming_up = warmup_of(cfg, state)
    if cfg.critic_warmup_ev > 0:
      warming_up = warming_up & (scale["explained_variance"] < cfg.critic_warmup_ev)
    bc_loss_fn = imitation.loss_for(policy) if cfg.bc_coef > 0 else None
    bc_weight = cfg.bc_coef * jnp.power(jnp.float32(cfg.bc_decay), state.version.astype(jnp.float32))

    def loss_fn(net, params, b):
      p = {**params, "net": net}
      if exact_kl:
        logp, entropy, value, dist = policy.evaluate_token_distributions(p, b["obs"], b["actions"])
        logp = logp if per_token else logp.sum(-1)
      else:
        logp, entropy, value = self._proximal(p, b["obs"], b["actions"])
      loss, metrics = ppo_loss(ppo_cfg, logp, entropy, value, b["logp"], b["values"], b["adv"], b["returns"],
                               b["mask"], b.get("behaviour_logp"))
      if mean_kl:
        mean, _, _ = policy._forward(p, b["obs"])  # pylint: disable=protected-access
        z = (mean - b["ref_mean"]) * b["ref_inv_std"]
        metrics["ref_kl"] = masked_mean(0.5 * jnp.sum(jnp.square(z), axis=-1), b["mask"])
      elif exact_kl:
        metrics["ref_kl"] = token_kl_to_reference(dist, b["ref_dist"], b["mask"])
      elif "ref_logp" in b:
        metrics["ref_kl"] = kl_to_reference(logp.sum(-1) if per_token else logp, b["ref_logp"], b["mask"])
      if "ref_kl" in metrics:
        loss = loss + cfg.ref_kl_coef * metrics["ref_kl"]
      if bc_loss_fn is not None:  # The demonstrations stay in the update (DAPG's decaying weight).
        d = b["demo"]
        metrics["bc_loss"] = bc_loss_fn(p, d["obs"], d["actions"], d["mask"], b["bc_key"])
        loss = loss + bc_weight * metrics["bc_loss"]
      return loss, metrics

    def minibatch_step(carry, b):
      params, opt_state, skipped, stopped = carry
      (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params["net"], params, b)
      if cfg.critic_warmup_updates > 0:  # Zero gradients give Adam exactly zero steps: the actor stays.
        grads = jax.tree.map(lambda g, c: g if c else jnp.where(warming_up, jnp.zeros_like(g), g), grads, is_critic)
      updates, new_opt = self._optimizer.update(grads, opt_state, params["net"])
      new_net = optax.apply_updates(params["net"], updates)
      grad_norm = optax.global_norm(grads)  # Before clipping: how hard the loss pulls.
      finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
      if cfg.target_kl > 0:  # Once the policy has moved this far, this update is done.
        stopped = stopped | (metrics["approx_kl"] > 1.5 * cfg.target_kl)
      apply = finite & ~stopped
      keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(apply, n, o), new, old)
      params = {**params, "net": keep(new_net, params["net"])}
      carry = (params, keep(new_opt, opt_state), skipped + (~finite).astype(jnp.int32), stopped)
      return carry, {**metrics, "loss": loss, "grad_norm": grad_norm, "steps_applied": apply.astype(jnp.float32)}

    def epoch(carry, key):
      perm_key, demo_key, bc_key = jax.random.split(key, 3)
      perm = jax.random.permutation(perm_key, num)
      batches = jax.tree.map(lambda x: x[perm].reshape((cfg.num_minibatches, mb) + x.shape[1:]), data)
      if bc_loss_fn is not None:  # bc_batch_size demo rows per minibatch step, as `demo_draws` picks them.
        idx = demo_draws(demo_key, demos["actions"].shape[0], cfg.num_minibatches, cfg.bc_batch_size)
        batches["demo"] = jax.tree.map(lambda x: x[idx], demos)
        batches["bc_key"] = jax.random.split(bc_key, cfg.num_minibatches)
      return jax.lax.scan(minibatch_step, carry, batches)

    key, epoch_key = jax.random.split(state.key)
    opt_state = with_learning_rate(state.opt_state, learning_rate_schedule(cfg)(state.version), cfg)
    carry = (state.params, opt_state, state.skipped_updates, jnp.zeros((), bool))
    (params, opt_state, skipped, _), metrics = jax.lax.scan(
        epoch, carry, jax.random.split(epoch_key, cfg.epochs))
    metrics = jax.tree.map(jnp.mean, metrics)
    metrics.update(scale)
    if cfg.obs_norm_update == "after":  # "before": the caller has; "frozen": never.
      new_params = _unless_warming_up(cfg, warming_up, policy.update_normalizer(params, ro.obs, ro.valid), params)
      metrics.update(_normalizer_shift(params, new_params))
      params = new_params
    value_norm = state.value_norm
    critic_free = targets is None and cfg.algorithm == "grpo"  # Nothing is fitted to returns.
    if cfg.value_norm and not critic_free:  # After the epochs, like the obs normaliser: one scale per update.
      value_norm = normalizer.update_stats(value_norm, returns[..., None], ro.valid, max_count=cfg.value_norm_count)
    metrics["skipped_updates"] = skipped
    metrics.update(_staleness(state.version, ro.version, ro.valid))
    metrics["learning_rate"] = learning_rate(opt_state)
    if separate_optimizers(cfg):
      metrics["critic_learning_rate"] = learning_rates(opt_state)["critic"]
    if bc_loss_fn is not None:
      metrics["bc_weight"] = bc_weight
    if cfg.reward_norm:
      metrics["reward_norm_std"] = jnp.sqrt(reward_norm.stats.var[0] + 1e-8)
    if cfg.critic_warmup_updates > 0:
      metrics["critic_warmup"] = warming_up.astype(jnp.float32)
    critic_ready = None if state.critic_ready is None else state.critic_ready | ~warming_up
    new_state = TrainState(params=params, opt_state=opt_state, key=key, version=state.version + 1,
                           skipped_updates=skipped, value_norm=value_norm, reward_norm=reward_norm,
                           reference=state.reference, critic_ready=critic_ready)
    return new_state, metrics


def demo_draws(key: jax.Array, num_rows: int, num_minibatches: int, batch_size: int) -> jax.Array:
  """[num_minibatches, batch_size] demo row indices for one epoch: one shuffle of the rows, read in
  order and wrapping around, so an epoch sees every row before any row twice (with batch_size equal
  to the rows and one minibatch, every row exactly once)."""
  perm = jax.random.permutation(key, num_rows)
  return perm[jnp.arange(num_minibatches * batch_size) % num_rows].reshape(num_minibatches, batch_size)


def warmup_of(cfg: LearnerConfig, state: TrainState) -> jax.Array:
  """Whether the update `state` starts may still be part of the critic warm-up: below its count (the
  cap with critic_warmup_ev) and, with critic_warmup_ev, not ended by an earlier update."""
  warming_up = state.version < cfg.critic_warmup_updates
  if state.critic_ready is not None:
    warming_up = warming_up & ~state.critic_ready
  return warming_up


def _unless_warming_up(cfg: LearnerConfig, warming_up: jax.Array, new_params, old_params):
  """`new_params` (the observation statistics after a batch), or `old_params` during a critic
  warm-up: the statistics are part of what the actor computes, so they stand still with it."""
  if cfg.critic_warmup_updates <= 0:
    return new_params
  return jax.tree.map(lambda n, o: jnp.where(warming_up, o, n), new_params, old_params)


def _target_scale(values: jax.Array, adv: jax.Array, returns: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
  """The scale of what the update fits, over the valid samples: value targets, raw advantages and
  how much of the targets' variance the critic explains (1 = all, <= 0 = none)."""
  mean = lambda x: masked_mean(x, mask)
  var = lambda x: mean(jnp.square(x - mean(x)))
  return {"return_mean": mean(returns), "return_std": jnp.sqrt(var(returns)),
          "advantage_std": jnp.sqrt(var(adv)), "value_mean": mean(values),
          "explained_variance": 1.0 - var(returns - values) / jnp.maximum(var(returns), 1e-8)}


def _out_of_bounds(spec, actions: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
  """The fraction of sampled action components outside the env's bounds (the env clips them, so
  they carry no signal for the Gaussian's mean there); only where actions are env actions."""
  if spec is None or actions.shape[-1] != spec.action_dim:
    return {}
  low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)
  out = jnp.mean(((actions < low) | (actions > high)).astype(jnp.float32), axis=-1)
  return {"action_out_of_bounds": masked_mean(out, mask)}


def _normalizer_shift(old: dict, new: dict) -> dict[str, jax.Array]:
  """Drift of the observation normaliser in one update: its mean's move in old standard deviations
  (largest over the inputs). Big values mean the inputs the policy sees are still changing."""
  if "obs_norm" not in old:
    return {}
  o, n = old["obs_norm"], new["obs_norm"]
  return {"obs_norm_shift": jnp.max(jnp.abs(n.mean - o.mean) / jnp.sqrt(o.var + 1e-8))}


def _gamma(cfg: LearnerConfig, batch) -> float | jax.Array:
  """The discount of every row: the batch's own where it carries one (chunks cut short)."""
  return cfg.gamma if batch.discount is None else batch.discount


def _staleness(version: jax.Array, sample_version: jax.Array, valid: jax.Array) -> dict[str, jax.Array]:
  """Mean and max policy-version lag of the valid samples."""
  lag = version - sample_version
  return {"staleness": jnp.sum(lag * valid) / jnp.maximum(valid.sum(), 1),
          "staleness_max": jnp.max(jnp.where(valid, lag, 0))}


def _cut(done: jax.Array, valid: jax.Array) -> jax.Array:
  """Where advantages must not flow back: an episode end, or an invalid next sample.

  An invalid next sample (a reset forced after non-finite physics, or a sample
  dropped as too stale) must not feed its advantage back; automatic resets
  already follow a `done` step.
  """
  next_valid = jnp.concatenate([valid[1:], jnp.ones_like(valid[:1])])
  return done | ~next_valid
