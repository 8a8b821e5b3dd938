"""Demonstrations as supervised examples: each step's observation and the chunk of expert actions
that starts there, streamed from a demo directory in shuffled fixed-size minibatches.

Chunks and their masks are ebrl/demos/rows.py's, which the RL update's demonstration term uses too.

Why the std is fitted in closed form (`fit_action_std`): RL fine-tuning explores with the
Gaussian's std, and the init's std (1 on actions in [-1, 1]) drowns a pre-trained mean (measured:
MetaWorld success ~0.05 at std 1 against ~0.8 at std 0.1 with the same mean), while a gradient at
the mean's learning rate barely moves it; given the fitted mean the maximum-likelihood std is the
demos' residual RMS per dim, one pass over them.

Why a bounded buffer: fifty tasks of a hundred 500-step episodes are millions of rows, so episodes
are read in recorded order into a buffer of at most `buffer_steps` rows that is shuffled and cut
into batches (a buffer's remainder starts the next one); a recording that fits is read once.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from ebrl.demos import DemoFormatError, DemoSet
from ebrl.demos.rows import chunk_actions
from ebrl.errors import UserError

Batch = dict  # {"obs": {key: [B, ...]}, "actions": [B, K*A], "mask": [B, K*A], "task": [B]}


def check_demos(demos: DemoSet, spec, env_name: str) -> None:
  """UserError (one line) unless the demos were recorded on `env_name` and observe and act as the
  run's env `spec` does (its chunks are K of the demos' actions)."""
  if demos.env != env_name:
    raise UserError(f"demos in '{demos.path}' were recorded on '{demos.env}'; --config.env.name is "
                    f"'{env_name}' (pre-train on the env RL will run)")
  one_step = dataclasses.replace(spec, action_dim=spec.action_dim // max(1, spec.chunk_size))
  demos.check_spec(one_step)
  if demos.num_steps < 1:
    raise DemoFormatError(f"demos in '{demos.path}' hold no steps (every episode failed and none was kept); "
                          "record again, or with --keep_failed")


def _rows(demos: DemoSet, k: int, keys: tuple[str, ...]) -> Iterator[dict[str, np.ndarray]]:
  """Every kept episode's rows: obs/<key>, actions (chunks), mask, task."""
  for e in demos.episodes():
    chunks, mask = chunk_actions(np.asarray(e.actions, np.float32), k)
    rows = {f"obs/{key}": e.obs[key] for key in keys}
    rows.update(actions=chunks, mask=mask, task=np.full(e.length, e.task, np.int32))
    yield rows


def _buffers(demos: DemoSet, k: int, keys: tuple[str, ...], buffer_steps: int) -> Iterator[dict]:
  """One pass over the demos in buffers of about buffer_steps rows."""
  pending, size = [], 0
  for rows in _rows(demos, k, keys):
    pending.append(rows)
    size += len(rows["actions"])
    if size >= buffer_steps:
      yield {key: np.concatenate([r[key] for r in pending]) for key in pending[0]}
      pending, size = [], 0
  if pending:
    yield {key: np.concatenate([r[key] for r in pending]) for key in pending[0]}


def _batch(rows: dict[str, np.ndarray]) -> Batch:
  out = {"obs": {k[len("obs/"):]: v for k, v in rows.items() if k.startswith("obs/")}}
  out.update({k: v for k, v in rows.items() if not k.startswith("obs/")})
  return out


def batches(demos: DemoSet, k: int, batch_size: int, seed: int = 0,
            buffer_steps: int = 1 << 18) -> Iterator[Batch]:
  """Endless shuffled batches of exactly `batch_size` rows (epoch after epoch), the same for a seed."""
  if batch_size <= 0:
    raise ValueError(f"batch_size={batch_size} must be positive")
  keys = tuple(demos.obs_spec)
  rng = np.random.default_rng(seed)
  whole = None if demos.num_steps > buffer_steps else next(_buffers(demos, k, keys, buffer_steps))
  carry = None
  while True:
    for rows in ([whole] if whole is not None else _buffers(demos, k, keys, buffer_steps)):
      perm = rng.permutation(len(rows["actions"]))
      rows = {key: v[perm] for key, v in rows.items()}
      if carry is not None:
        rows = {key: np.concatenate([carry[key], v]) for key, v in rows.items()}
      full = len(rows["actions"]) - len(rows["actions"]) % batch_size
      for start in range(0, full, batch_size):
        yield _batch({key: v[start:start + batch_size] for key, v in rows.items()})
      carry = {key: v[full:] for key, v in rows.items()}


def fit_normalizer(policy, params, demos: DemoSet, min_std: float = 0.01, buffer_steps: int = 1 << 16):
  """params with obs_norm statistics of every demo observation, so RL after the warm start normalises
  its inputs as pre-training did (the policy chooses which keys it normalises). Each dim's variance
  is at least min_std ** 2 (raw units): a dim (nearly) constant in the demos would otherwise be
  divided by ~0, and any change of it in RL's states would saturate the normalised input."""
  if not min_std > 0:
    raise ValueError(f"min_std={min_std} must be positive")
  keys = tuple(demos.obs_spec)
  for rows in _buffers(demos, 1, keys, buffer_steps):
    obs = {key: jnp.asarray(rows[f"obs/{key}"]) for key in keys}
    params = policy.update_normalizer(params, obs, jnp.ones((len(rows["actions"]),), jnp.float32))
  stats = params["obs_norm"]
  return {**params, "obs_norm": stats.replace(var=jnp.maximum(stats.var, jnp.float32(min_std) ** 2))}


STD_FLOOR = 1e-6  # Closed-form std of an exactly fitted dim without policy.min_std: a finite log.


def _residual_sums(policy):
  """jitted (params, obs, actions, mask) -> (sum mask (a - mean(s))^2 [D], sum mask [D])."""
  def sums(params, obs, actions, mask):
    mean = policy._forward(params, obs)[0]  # pylint: disable=protected-access
    return jnp.sum(mask * jnp.square(actions - mean), axis=0), jnp.sum(mask, axis=0)
  return jax.jit(sums)


def fit_action_std(policy, params, demos: DemoSet, k: int, min_std: float = 0.0, max_std: float = 0.0,
                   batch_size: int = 4096, buffer_steps: int = 1 << 16):
  """(params with log_std at its maximum-likelihood value given the fitted mean, that std [D]).

  For a Gaussian with a state-independent std, the likelihood of the demos (chunks of k actions,
  padding masked) is maximised per dim by std_i^2 = sum mask (a_i - mean_i(s))^2 / sum mask: one
  pass over the demos in fixed-size batches (the last padded with mask 0: one compile). The std is
  then clipped to [min_std, max_std] (0: no bound; below STD_FLOOR never); a dim without a valid
  row keeps its std."""
  keys = tuple(demos.obs_spec)
  sums_fn = _residual_sums(policy)
  sse = np.zeros(policy.spec.action_dim, np.float64)
  count = np.zeros(policy.spec.action_dim, np.float64)
  for rows in _buffers(demos, k, keys, buffer_steps):
    n = len(rows["actions"])
    for start in range(0, n, batch_size):
      part = {key: v[start:start + batch_size] for key, v in rows.items()}
      pad = batch_size - len(part["actions"])
      if pad:  # Repeated rows whose mask is 0: the batch keeps its shape.
        part = {key: np.concatenate([v, np.repeat(v[-1:], pad, axis=0)]) for key, v in part.items()}
        part["mask"][-pad:] = 0.0
      b = _batch(part)
      obs, actions, mask = ({key: jnp.asarray(v) for key, v in b["obs"].items()}, jnp.asarray(b["actions"]),
                            jnp.asarray(b["mask"]))
      e, c = jax.device_get(sums_fn(params, obs, actions, mask))
      sse += np.asarray(e, np.float64)
      count += np.asarray(c, np.float64)
  old = np.exp(np.asarray(params["net"]["log_std"], np.float64))
  std = np.where(count > 0, np.sqrt(sse / np.maximum(count, 1.0)), old)
  std = np.clip(std, max(min_std, STD_FLOOR), max_std if max_std > 0 else np.inf)
  log_std = jnp.asarray(np.log(std), params["net"]["log_std"].dtype)
  return {**params, "net": {**params["net"], "log_std": log_std}}, std
