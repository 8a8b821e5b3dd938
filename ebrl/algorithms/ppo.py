"""Clipped PPO loss over a minibatch, with masking of invalid samples.

The mask drops transitions that never happened (an env's automatic-reset step).
Value clipping and the entropy bonus are configurable; advantages are
normalised over the valid samples of the minibatch.

Decoupled PPO (for stale samples, as in AReaL): the ratio is taken against the
*proximal* policy (the params at the start of the update), and the objective is
weighted by the behaviour importance weight prox / behaviour, capped at
`behaviour_weight_clip`. When the samples are on-policy the proximal and
behaviour log-probs are the same, the weight is 1 and this is plain PPO.

Fine-tuning a pre-trained policy can add `kl_to_reference`, a penalty on the
policy's divergence from the one it started from (as RLHF and VLA PPO recipes do);
`token_kl_to_reference` is its exact form for policies of categorical tokens.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class PPOConfig:
  clip_eps: float = 0.2
  value_clip_eps: float = 0.0  # 0 disables value clipping.
  vf_coef: float = 0.5
  ent_coef: float = 0.0
  normalize_advantages: bool = True
  behaviour_weight_clip: float = 2.0


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean over mask > 0; a masked value never reaches the sum (inf * 0 would be NaN)."""
  return jnp.sum(jnp.where(mask > 0, x, 0.0)) / jnp.maximum(jnp.sum(mask), 1.0)


def ppo_loss(cfg: PPOConfig, logp: jax.Array, entropy: jax.Array, value: jax.Array,
             old_logp: jax.Array, old_value: jax.Array, advantages: jax.Array,
             returns: jax.Array, mask: jax.Array,
             behaviour_logp: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """All inputs are [B] but logp and old_logp, which may be [B, N]; returns (loss, metrics).

  old_logp is the proximal policy's log-prob; behaviour_logp (default: the same)
  is the log-prob of the policy that acted, per sample.

  With [B, N] log-probs (a decision's N action tokens) each token has its own ratio,
  clipped on its own and weighed by its decision's advantage; a sample's surrogate is
  the mean over its tokens, and approx_kl and clip_fraction are per token. A
  decision's ratio is the product of its tokens' ratios, so with many tokens it
  leaves [1 - eps, 1 + eps] after tiny per-token moves and the clip stops nearly
  every sample; per-token ratios bound each token's move instead.
  """
  per_token = logp.ndim == 2
  tokens = (lambda x: x[:, None]) if per_token else (lambda x: x)
  over_tokens = (lambda x: jnp.mean(x, axis=-1)) if per_token else (lambda x: x)
  mask = mask.astype(jnp.float32)
  # Masked samples (resets, too stale) are zeroed before any arithmetic, not after: a stale
  # sample's ratio against its behaviour policy can overflow float32, and inf * 0 = NaN would
  # cost the whole minibatch. Zeroing the inputs also keeps their gradients exactly 0.
  keep = mask > 0
  zero = lambda x: jnp.where(keep, x, 0.0)
  advantages, returns = zero(advantages), zero(returns)
  if cfg.normalize_advantages:
    mean = masked_mean(advantages, mask)
    std = jnp.sqrt(masked_mean(jnp.square(advantages - mean), mask))
    advantages = (advantages - mean) / (std + 1e-8)
  log_ratio = jnp.where(tokens(keep), logp - old_logp, 0.0)
  ratio = jnp.exp(log_ratio)
  adv = tokens(advantages)
  pg = over_tokens(-jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv))
  if behaviour_logp is not None:
    prox = old_logp.sum(-1) if per_token else old_logp  # A decision's log-prob, as the behaviour's is.
    weight = jnp.minimum(jnp.exp(zero(prox - behaviour_logp)), cfg.behaviour_weight_clip)
    pg = jax.lax.stop_gradient(weight) * pg
  value, old_value = zero(value), zero(old_value)
  v_err = jnp.square(value - returns)
  if cfg.value_clip_eps > 0:
    clipped = old_value + jnp.clip(value - old_value, -cfg.value_clip_eps, cfg.value_clip_eps)
    v_err = jnp.maximum(v_err, jnp.square(clipped - returns))
  pg_loss = masked_mean(pg, mask)
  v_loss = 0.5 * masked_mean(v_err, mask)
  ent = masked_mean(entropy, mask)
  loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * ent
  metrics = {
      "policy_loss": pg_loss,
      "value_loss": v_loss,
      "entropy": ent,
      "approx_kl": masked_mean(over_tokens((ratio - 1.0) - log_ratio), mask),
      "clip_fraction": masked_mean(over_tokens((jnp.abs(ratio - 1.0) > cfg.clip_eps).astype(jnp.float32)), mask),
  }
  return loss, metrics


# Bound on the log ratio inside kl_to_reference's exp: a sample the reference finds far likelier than
# the policy would overflow float32 and take the minibatch with it.
MAX_REFERENCE_LOG_RATIO = 20.0


def kl_to_reference(logp: jax.Array, ref_logp: jax.Array, mask: jax.Array) -> jax.Array:
  """KL(policy || reference) estimated on the batch's actions, all inputs [B]: the mean over valid
  samples of exp(d) - d - 1 with d = ref_logp - logp (Schulman's "k3": never negative per sample,
  unbiased for actions drawn from the policy, and of low variance). Sample-based, so it serves every
  policy whose `evaluate` gives log-probs (a Gaussian, vla's tokens, flow's chain) alike; its
  gradient is zero where the two agree, so a policy at its reference trains as without it."""
  keep = mask > 0
  d = jnp.where(keep, jnp.clip(ref_logp - logp, -MAX_REFERENCE_LOG_RATIO, MAX_REFERENCE_LOG_RATIO), 0.0)
  return masked_mean(jnp.exp(d) - d - 1.0, mask.astype(jnp.float32))


def token_kl_to_reference(logp_all: jax.Array, ref_logp_all: jax.Array, mask: jax.Array) -> jax.Array:
  """KL(policy || reference) of a decision made of N categorical tokens, exactly: the log-softmaxed
  distributions are [B, N, bins], mask [B]; per sample the sum over tokens of
  sum_v p(v) (log p(v) - log r(v)), then the mean over valid samples. Where a policy exposes its token
  distributions (the vla) this replaces `kl_to_reference`'s one-draw estimate, whose exp(r/p) term
  explodes on a drawn token the policy has since made unlikely (off-policy samples, stale or
  clipped) while the true KL stays small."""
  keep = mask > 0
  per_token = jnp.sum(jnp.exp(logp_all) * (logp_all - ref_logp_all), axis=-1)
  return masked_mean(jnp.where(keep, per_token.sum(-1), 0.0), mask.astype(jnp.float32))
