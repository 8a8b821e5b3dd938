"""Reading a demo directory shard by shard: episodes, or fixed-size minibatches of steps.

Why streaming: fifty tasks of a hundred 500-step episodes are millions of steps (gigabytes with
pixels); a pre-training loop needs one minibatch at a time, so only one shard is ever loaded.
Minibatches are shuffled within a shard and across shard order; a shard holds the episodes of
every task that finished together, so a batch mixes tasks as a multi-task dataset should.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterator, Sequence

import numpy as np

from ebrl.demos.format import DemoFormatError, read_manifest


@dataclasses.dataclass(frozen=True)
class Episode:
  """One recorded episode; per-step arrays have the episode's length T first."""

  obs: dict[str, np.ndarray]  # [T, ...] the observation each action was taken on
  final_obs: dict[str, np.ndarray]  # [...] the observation after the last action
  actions: np.ndarray  # [T, action_dim] executed
  expert_actions: np.ndarray  # [T, action_dim] the expert's, before noise
  rewards: np.ndarray  # [T]
  success: np.ndarray  # [T] after each action
  task: int
  instruction: int
  succeeded: bool
  env: int  # The env that ran it (env ids as the recording's adapter numbered them).
  index: int  # Its number within its task, counting every episode recorded.

  @property
  def length(self) -> int:
    return int(self.actions.shape[0])


class DemoSet:
  """A demo directory (ebrl/demos/__init__.py): its manifest, then its shards on demand."""

  def __init__(self, path: str):
    self.path = path
    self.manifest = read_manifest(path)
    m = self.manifest
    try:
      self.env: str = m["env"]
      self.tasks: list[str] = list(m["tasks"])
      self.instructions: list[str] = list(m["instructions"])
      self.obs_spec: dict[str, tuple[tuple[int, ...], np.dtype]] = {
          k: (tuple(v["shape"]), np.dtype(v["dtype"])) for k, v in m["observation"].items()}
      self.action_dim: int = int(m["action"]["dim"])
      self.num_episodes: int = int(m["episodes"])
      self.num_steps: int = int(m["steps"])
    except (KeyError, TypeError, ValueError) as e:
      raise DemoFormatError(f"the manifest of demo directory '{path}' is incomplete or malformed "
                            f"({type(e).__name__}: {' '.join(str(e).split())})") from None

  def __repr__(self) -> str:
    return (f"DemoSet('{self.path}': {self.env}, {len(self.tasks)} task(s), {self.num_episodes} episodes, "
            f"{self.num_steps} steps, {len(self.manifest['shards'])} shard(s))")

  def expert_success(self) -> dict[str, float]:
    """{task: the expert's success over every episode recorded for it}."""
    return {t: self.manifest["by_task"][t]["expert_success"] for t in self.tasks}

  def check_spec(self, spec) -> None:
    """DemoFormatError (one line) unless these demos observe and act as `spec` (an EnvSpec) does."""
    want = {k: (tuple(v.shape), np.dtype(v.dtype)) for k, v in spec.obs.items()}
    if want != self.obs_spec:
      show = lambda d: ", ".join(f"{k} {s} {t}" for k, (s, t) in d.items())
      raise DemoFormatError(f"demos in '{self.path}' observe {show(self.obs_spec)}; env '{spec.name}' "
                            f"observes {show(want)}")
    if spec.action_dim != self.action_dim:
      raise DemoFormatError(f"demos in '{self.path}' have {self.action_dim}-dim actions; env '{spec.name}' "
                            f"acts with {spec.action_dim}")

  def _task_ids(self, tasks: Sequence[str | int] | None) -> np.ndarray | None:
    if tasks is None:
      return None
    ids = []
    for t in tasks:
      if isinstance(t, str):
        if t not in self.tasks:
          raise DemoFormatError(f"task '{t}' is not in demo directory '{self.path}' (its tasks: "
                                f"{', '.join(self.tasks)})")
        t = self.tasks.index(t)
      ids.append(int(t))
    return np.array(ids, np.int32)

  def _shards(self, order: Sequence[int] | None = None) -> Iterator[dict[str, np.ndarray]]:
    shards = self.manifest["shards"]
    for i in (range(len(shards)) if order is None else order):
      path = os.path.join(self.path, shards[i]["file"])
      try:
        with np.load(path, allow_pickle=False) as data:
          yield {k: data[k] for k in data.files}
      except (OSError, ValueError, KeyError) as e:
        raise DemoFormatError(f"shard {path} is not readable ({' '.join(str(e).split())})") from None

  def episodes(self, tasks: Sequence[str | int] | None = None) -> Iterator[Episode]:
    """Every kept episode (of `tasks`, names or ids, when given), shard by shard in recorded order."""
    want = self._task_ids(tasks)
    for arrays in self._shards():
      obs_keys = [k[len("obs/"):] for k in arrays if k.startswith("obs/")]
      starts = np.concatenate([[0], np.cumsum(arrays["episode_length"])])
      for e in range(len(arrays["episode_length"])):
        if want is not None and arrays["episode_task"][e] not in want:
          continue
        s = slice(int(starts[e]), int(starts[e + 1]))
        yield Episode(obs={k: arrays[f"obs/{k}"][s] for k in obs_keys},
                      final_obs={k: arrays[f"final_obs/{k}"][e] for k in obs_keys},
                      actions=arrays["actions"][s], expert_actions=arrays["expert_actions"][s],
                      rewards=arrays["rewards"][s], success=arrays["success"][s],
                      task=int(arrays["episode_task"][e]), instruction=int(arrays["episode_instruction"][e]),
                      succeeded=bool(arrays["episode_success"][e]), env=int(arrays["episode_env"][e]),
                      index=int(arrays["episode_index"][e]))

  @staticmethod
  def _steps(arrays: dict[str, np.ndarray], want: np.ndarray | None) -> dict[str, np.ndarray]:
    """A shard's per-step rows: obs/<key>, actions, ... and each step's task, instruction and step index."""
    lengths = arrays["episode_length"]
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    rows = {k: v for k, v in arrays.items() if not k.startswith(("final_obs/", "episode_"))}
    rows["task"] = np.repeat(arrays["episode_task"], lengths)
    rows["instruction"] = np.repeat(arrays["episode_instruction"], lengths)
    rows["step"] = (np.arange(int(lengths.sum())) - starts).astype(np.int32)
    if want is not None:
      keep = np.isin(rows["task"], want)
      rows = {k: v[keep] for k, v in rows.items()}
    return rows

  def minibatches(self, batch_size: int, *, seed: int = 0, epochs: int = 1, shuffle: bool = True,
                  drop_last: bool = True, tasks: Sequence[str | int] | None = None) -> Iterator[dict]:
    """Batches of `batch_size` steps: {"obs": {key: [B, ...]}, "actions", "expert_actions", "rewards",
    "success", "task", "instruction", "step"}. Shards are visited in a seeded random order each epoch
    and their steps shuffled; a shard's remainder starts the next shard's first batch. With
    drop_last=False the last, smaller batch of the whole pass is yielded too."""
    if batch_size <= 0:
      raise ValueError(f"batch_size={batch_size} must be positive")
    want = self._task_ids(tasks)
    rng = np.random.default_rng(seed)
    num_shards = len(self.manifest["shards"])
    for _ in range(epochs):
      order = rng.permutation(num_shards) if shuffle else np.arange(num_shards)
      carry: dict[str, np.ndarray] | None = None
      for arrays in self._shards(order):
        rows = self._steps(arrays, want)
        if shuffle:
          perm = rng.permutation(len(rows["actions"]))
          rows = {k: v[perm] for k, v in rows.items()}
        if carry is not None:
          rows = {k: np.concatenate([carry[k], v]) for k, v in rows.items()}
        n = len(rows["actions"])
        full = n - n % batch_size
        for start in range(0, full, batch_size):
          yield _batch({k: v[start:start + batch_size] for k, v in rows.items()})
        carry = {k: v[full:] for k, v in rows.items()}
      if carry is not None and len(carry["actions"]) and not drop_last:
        yield _batch(carry)


def _batch(rows: dict[str, np.ndarray]) -> dict:
  out = {"obs": {k[len("obs/"):]: v for k, v in rows.items() if k.startswith("obs/")}}
  out.update({k: v for k, v in rows.items() if not k.startswith("obs/")})
  return out


def open_demos(path: str) -> DemoSet:
  """The demo set in directory `path`; DemoFormatError (one line) when it is not one this EBRL reads."""
  return DemoSet(path)
