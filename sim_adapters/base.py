"""The SimAdapter contract every host-side simulator is driven through.

Why one interface: the schedulers (sync, pipelined, ebrl) must not know which
simulator they drive. EnvPool's asynchronous API is the model: `send` hands
actions to some envs, `recv` returns whichever envs are ready. A synchronous
`step` is the special case in which every env comes back.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Protocol

import numpy as np

Obs = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class ObsSpec:
  """Shape and dtype of one observation key, per env (no batch axis)."""

  shape: tuple[int, ...]
  dtype: np.dtype


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """What a policy needs to know about an env before it is built."""

  name: str
  obs: Mapping[str, ObsSpec]
  action_dim: int
  action_low: np.ndarray
  action_high: np.ndarray
  max_episode_steps: int
  has_success: bool
  num_tasks: int = 1
  chunk_size: int = 1  # Actions per decision: action_dim = chunk_size x one step's dims.


@dataclasses.dataclass
class StepBatch:
  """What `recv` returns: one row per ready env, in `env_ids` order.

  `reset_step` marks rows produced by an automatic reset: the env ignored the
  action it was sent, `obs` is the first observation of a new episode and the
  transition that led here is not a real one (learners mask it out). `success`
  is NaN for tasks that define no success. `discount`, when set, is each row's
  discount to its next observation where it is not the learner's one gamma: an
  action chunk of reward_type="action" cut short after j actions is gamma^j
  away from its next decision, not gamma^K (sim_adapters/chunks.py).
  """

  obs: Obs
  reward: np.ndarray  # float32 [B]
  terminated: np.ndarray  # bool [B]
  truncated: np.ndarray  # bool [B]
  success: np.ndarray  # float32 [B], NaN when the task has no success signal
  env_ids: np.ndarray  # int32 [B]
  reset_step: np.ndarray  # bool [B]
  discount: np.ndarray | None = None  # float32 [B], or None: the learner's gamma

  @property
  def done(self) -> np.ndarray:
    return self.terminated | self.truncated

  def __len__(self) -> int:
    return int(self.env_ids.shape[0])

  def take(self, idx: np.ndarray) -> "StepBatch":
    """Rows `idx`, every field indexed alike so each row stays whole."""
    return StepBatch(obs={k: v[idx] for k, v in self.obs.items()}, reward=self.reward[idx],
                     terminated=self.terminated[idx], truncated=self.truncated[idx], success=self.success[idx],
                     env_ids=self.env_ids[idx], reset_step=self.reset_step[idx],
                     discount=None if self.discount is None else self.discount[idx])


def concat_step_batches(batches: list[StepBatch]) -> StepBatch:
  """The rows of several batches, in order (one batch is returned as it is)."""
  if len(batches) == 1:
    return batches[0]
  cat = lambda name: np.concatenate([getattr(b, name) for b in batches])
  return StepBatch(obs={k: np.concatenate([b.obs[k] for b in batches]) for k in batches[0].obs},
                   reward=cat("reward"), terminated=cat("terminated"), truncated=cat("truncated"),
                   success=cat("success"), env_ids=cat("env_ids"), reset_step=cat("reset_step"),
                   discount=None if batches[0].discount is None else cat("discount"))


def gather_all(adapter, num_envs: int) -> StepBatch:
  """Receives until every env has reported once; rows ordered by env id."""
  batches = [adapter.recv()]
  count = len(batches[0])
  while count < num_envs:
    batches.append(adapter.recv())
    count += len(batches[-1])
  return concat_sorted(batches)


def concat_sorted(batches: list[StepBatch]) -> StepBatch:
  """Concatenates batches and orders rows by env id (no copy when already sorted)."""
  b = concat_step_batches(batches)
  if np.all(b.env_ids[1:] > b.env_ids[:-1]):
    return b
  return b.take(np.argsort(b.env_ids, kind="stable"))


class SimAdapter(Protocol):
  """Host-side batched simulator (docs/ARCHITECTURE.md, Contracts)."""

  spec: EnvSpec
  num_envs: int

  def reset(self) -> None:
    """Reset every env; their first observations come from the next `recv`."""

  def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
    """Start a step for `env_ids` with `actions` [len(env_ids), action_dim]."""

  def recv(self) -> StepBatch:
    """Return the envs that are ready (at least one)."""

  def can_recv(self) -> bool:
    """Whether `recv` can return without more sends (async EnvPool needs a whole batch in flight)."""

  def step(self, actions: np.ndarray) -> StepBatch:
    """Step every env and return all of them, ordered by env id."""

  def reset_envs(self, env_ids: np.ndarray) -> None:
    """Reset `env_ids` in place of their next step (their next row is a reset)."""

  def close(self) -> None:
    """Release the simulator's threads."""


class Wrapper:
  """What an adapter that wraps `self.inner` and changes only send / recv shares: readiness,
  resets and closing pass through, and `step` is send-all + receive-all through this wrapper's own
  send and recv (so the wrapper's changes apply to it too)."""

  inner: SimAdapter
  num_envs: int

  def can_recv(self) -> bool:
    return self.inner.can_recv()

  def step(self, actions: np.ndarray) -> StepBatch:
    """Every env takes its action; returns when all are back, rows ordered by env id."""
    self.send(actions, np.arange(self.num_envs, dtype=np.int32))  # type: ignore[attr-defined]
    return gather_all(self, self.num_envs)

  def reset_envs(self, env_ids: np.ndarray) -> None:
    self.inner.reset_envs(env_ids)

  def close(self) -> None:
    self.inner.close()
