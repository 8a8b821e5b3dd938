"""The data that moves between stages, as explicit pytrees."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax


@flax.struct.dataclass
class Rollout:
  """T steps of N envs, as the learner consumes them.

  Row t of every [T, N] field is the transition taken from obs[t]. values has
  T + 1 rows (the last bootstraps). `valid` is False for transitions that did
  not happen (automatic-reset steps); `version` is the policy version that
  produced each action, and `logp`/`values` are that behaviour policy's.
  """

  obs: dict[str, jax.Array]  # [T, N, ...]
  actions: jax.Array  # [T, N, A]
  logp: jax.Array  # [T, N]
  values: jax.Array  # [T + 1, N]
  rewards: jax.Array  # [T, N]
  terminated: jax.Array  # [T, N] bool
  done: jax.Array  # [T, N] bool
  valid: jax.Array  # [T, N] bool
  version: jax.Array  # [T, N] int32
  discount: jax.Array | None = None  # [T, N] float32 per-row discount (chunks cut short), else gamma
  # [T, N] float32 added to a row's reward after the learner scales it: gamma * V(final obs) where a
  # device simulator truncated an episode and reset in the same step (in the critic's units).
  bootstrap: jax.Array | None = None


@flax.struct.dataclass
class TrainState:
  """Everything the learner owns; checkpointed whole."""

  params: Any
  opt_state: Any
  key: jax.Array
  version: jax.Array  # int32: number of updates applied (the policy version)
  skipped_updates: jax.Array  # int32: minibatch steps skipped for a non-finite loss
  # Running statistics of the value targets (ebrl/normalizer.py): the critic predicts returns in
  # these units. Mean 0 / variance 1 (the identity) while value normalisation is off.
  value_norm: Any = None
  # Reward normalisation (ebrl/normalizer.py ReturnNorm): each env's discounted return so far and
  # running statistics of it; rewards are divided by their std while algorithm.reward_norm is on.
  reward_norm: Any = None
  # Fine-tuning with algorithm.ref_kl_coef > 0: the params the run started from (its warm start),
  # frozen; the update's KL penalty is taken against them. None otherwise.
  reference: Any = None
  # Fine-tuning with algorithm.critic_warmup_ev > 0: whether the critic's warm-up has ended (bool
  # scalar; it never starts again). None otherwise.
  critic_ready: Any = None


@flax.struct.dataclass
class SegmentBatch:
  """B env segments of T steps each, as the asynchronous learner consumes them.

  Unlike a Rollout it carries no values: the learner evaluates values and
  proximal log-probs with its current params (T + 1 observations per segment;
  obs[T] bootstraps). `logp` and `version` are the behaviour policy's.
  """

  obs: dict[str, jax.Array]  # [T + 1, B, ...]
  actions: jax.Array  # [T, B, A]
  logp: jax.Array  # [T, B]
  rewards: jax.Array  # [T, B]
  terminated: jax.Array  # [T, B] bool
  done: jax.Array  # [T, B] bool
  valid: jax.Array  # [T, B] bool
  version: jax.Array  # [T, B] int32
  discount: jax.Array | None = None  # [T, B] float32 per-row discount (chunks cut short), else gamma
  env_ids: jax.Array | None = None  # [B] int32: the env of each segment (reward normalisation follows
  # each env's return across segments); None = column b is env b.
  bootstrap: jax.Array | None = None  # [T, B] as Rollout.bootstrap.
