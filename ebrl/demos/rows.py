"""Demonstrations as training rows: each step's observation and the chunk of expert actions that
starts there, with the mask of the actions the env would execute.

Why here: supervised pre-training (ebrl/sft/data.py) streams these rows in shuffled batches, and the
RL update's demonstration term (ebrl/learner.py, bc_coef) holds all of them on the learner's devices
and draws from them at every minibatch step: both must see the same chunks of the same demos.

Why chunks are masked: a chunk of K actions is the K executed actions from a step on, within one
episode; the env (sim_adapters/chunks.py) drops what is left of a chunk when its episode ends, so the
missing tail is padded (the last action repeated) and masked out of every loss rather than taught.
With K = 1 a chunk is the step's own action and the mask all ones.
"""

from __future__ import annotations

import jax
import numpy as np

from ebrl.demos.reader import DemoSet

# The most demo rows the RL update holds on its devices: about 100 MB of MT50 state observations and
# actions. More recorded rows are thinned evenly (all_rows) rather than refused: pre-training wants
# every demo, the update's regulariser only a representative draw of them.
MAX_RL_DEMO_ROWS = 500_000


def chunk_actions(actions: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """actions [T, A] of one episode -> (chunks [T, K*A], mask [T, K*A]): row t holds actions t..t+K-1,
  padded past the episode's end with its last action, whose entries the mask zeroes."""
  t, a = actions.shape
  idx = np.arange(t)[:, None] + np.arange(k)[None, :]  # [T, K]
  valid = idx < t
  chunks = actions[np.minimum(idx, t - 1)].reshape(t, k * a)
  mask = np.repeat(valid, a, axis=1).astype(np.float32)
  return chunks.astype(np.float32), mask


def all_rows(demos: DemoSet, k: int, max_rows: int = MAX_RL_DEMO_ROWS) -> dict:
  """The kept steps of `demos` as one batch {"obs": {key: [N, ...]}, "actions": [N, K*A],
  "mask": [N, K*A]}, in recorded order: all of them, or past `max_rows` every step at `max_rows`
  evenly spaced positions, so each task and each phase of an episode keeps its share."""
  keys = tuple(demos.obs_spec)
  obs, actions, masks = {key: [] for key in keys}, [], []
  for e in demos.episodes():
    chunks, mask = chunk_actions(np.asarray(e.actions, np.float32), k)
    for key in keys:
      obs[key].append(np.asarray(e.obs[key]))
    actions.append(chunks)
    masks.append(mask)
  rows = {"obs": {key: np.concatenate(v) for key, v in obs.items()}, "actions": np.concatenate(actions),
          "mask": np.concatenate(masks)}
  n = len(rows["actions"])
  if n <= max_rows:
    return rows
  keep = np.linspace(0, n - 1, max_rows).round().astype(np.int64)
  return jax.tree.map(lambda x: x[keep], rows)
