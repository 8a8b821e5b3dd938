"""Demonstrations as supervised examples: each step's observation and the chunk of expert actions
that starts there, streamed from a demo directory in shuffled fixed-size minibatches.

Why chunks are formed here and not by the reader: a chunk of K actions is the K executed actions
from a step on, within one episode; the env (sim_adapters/chunks.py) drops what is left of a chunk
when its episode ends, so the missing tail is padded (the last action repeated) and masked out of
every loss rather than taught. With K = 1 a chunk is the step's own action and the mask all ones.

Why a bounded buffer: fifty tasks of a hundred 500-step episodes are millions of rows, so episodes
are read in recorded order into a buffer of at most `buffer_steps` rows that is shuffled and cut
into batches (a buffer's remainder starts the next one); a recording that fits is read once.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import jax.numpy as jnp
import numpy as np

from ebrl.demos import DemoFormatError, DemoSet
from ebrl.errors import UserError

Batch = dict  # {"obs": {key: [B, ...]}, "actions": [B, K*A], "mask": [B, K*A], "task": [B]}


def chunk_actions(actions: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """actions [T, A] of one episode -> (chunks [T, K*A], mask [T, K*A]): row t holds actions t..t+K-1,
  padded past the episode's end with its last action, whose entries the mask zeroes."""
  t, a = actions.shape
  idx = np.arange(t)[:, None] + np.arange(k)[None, :]  # [T, K]
  valid = idx < t
  chunks = actions[np.minimum(idx, t - 1)].reshape(t, k * a)
  mask = np.repeat(valid, a, axis=1).astype(np.float32)
  return chunks.astype(np.float32), mask


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


def fit_normalizer(policy, params, demos: DemoSet, buffer_steps: int = 1 << 16):
  """params with obs_norm statistics of every demo observation, so RL after the warm start normalises
  its inputs as pre-training did (the policy chooses which keys it normalises)."""
  keys = tuple(demos.obs_spec)
  for rows in _buffers(demos, 1, keys, buffer_steps):
    obs = {key: jnp.asarray(rows[f"obs/{key}"]) for key in keys}
    params = policy.update_normalizer(params, obs, jnp.ones((len(rows["actions"]),), jnp.float32))
  return params
