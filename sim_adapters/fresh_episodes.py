"""A fresh simulator for every episode, for the EnvPool tasks whose reset corrupts the next episode.

Why: EnvPool's port of two MetaWorld tasks adds the episode's goal to the
previous one at every reset instead of setting it (measured on EnvPool 1.2.5,
BENCHMARKS.md, "Two MetaWorld tasks whose EnvPool reset moves the goal").
Only the first episode of each env is MetaWorld's task:
  Hammer-v3      the goal in the observation walks away (0.74 -> 1.59 -> 2.44 m
                 in y over three resets) while the nail stays put: later episodes
                 hand the policy an input no demonstration ever had;
  ShelfPlace-v3  the goal that success is measured against walks away (y 0.86
                 -> 1.74 -> 2.58 m, beyond the table): the scripted expert
                 succeeds in 10 of 10 first episodes and 0 of 20 later ones.
Evaluation counts first episodes only, so it was right; training, demos
recorded over several episodes per env and every training window of these
tasks were not.

Each env here is its own single-env EnvPool, and an env whose episode ended is
rebuilt with a seed of its own (`episode_seed`) before its next step, so every
episode is a first episode. The reset row comes back like EnvPool's own (a
`reset_step` row, the action sent ignored). What it costs: building a pool
(~0.15 s on this machine) per episode of these two tasks only.
"""

from __future__ import annotations

import numpy as np

from sim_adapters.base import StepBatch, concat_sorted, gather_all
from sim_adapters.envpool_adapter import EnvPoolAdapter

# The MetaWorld tasks (EnvPool names without the prefix) whose reset accumulates the goal.
RESET_DRIFT_TASKS = ("Hammer-v3", "ShelfPlace-v3")


def needs_fresh_episodes(name: str) -> bool:
  """Whether EnvPool task `name` ("MetaWorld/Hammer-v3") must get a fresh env per episode."""
  return name.startswith("MetaWorld/") and name[len("MetaWorld/"):] in RESET_DRIFT_TASKS


def episode_seed(env_seed: int, episode: int) -> int:
  """The seed of an env's `episode`-th episode from its own seed (what a pool seeded `seed` gives
  env i: seed + i): episode 0 keeps it, so first episodes are those of an EnvPool of all the envs;
  later ones hash it with the episode index, so one env's episodes do not repeat, and envs that
  share a seed (same-seed groups) share each episode's initial state."""
  if episode == 0:
    return env_seed
  return int(np.random.SeedSequence([env_seed, episode]).generate_state(1)[0] % (2**31 - 1))


class FreshEpisodeAdapter:
  """`num_envs` single-env EnvPools, each rebuilt for every episode (sync: `recv` returns every env
  sent, in env order)."""

  def __init__(self, name: str, num_envs: int, *, batch_size: int | None = None, num_threads: int = 0,
               thread_affinity_offset: int = -1, seed: int = 0, **env_kwargs):
    del batch_size, num_threads, thread_affinity_offset  # One thread per single-env pool.
    self.name, self.num_envs, self.seed = name, num_envs, seed
    self.batch_size, self.is_async = num_envs, False
    env_seeds = env_kwargs.pop("env_seed", None)  # Same-seed groups: each env's seed, as EnvPool takes it.
    self._env_seeds = [seed + i for i in range(num_envs)] if env_seeds is None else [int(x) for x in env_seeds]
    self._kwargs = env_kwargs
    self._episode = np.zeros(num_envs, np.int64)  # Episodes begun per env (its pool's seed index).
    self._used = np.zeros(num_envs, bool)  # Its pool has begun an episode already.
    self._ended = np.zeros(num_envs, bool)  # Its last row ended an episode (or a reset was asked).
    self._rebuild = np.zeros(num_envs, bool)  # Sent while ended: rebuilt by the next recv.
    self._sent: list[int] = []
    self._envs = [self._build(i) for i in range(num_envs)]
    self.spec = self._envs[0].spec
    self._closed_nan = 0  # nan_resets of pools already replaced.

  def _build(self, i: int) -> EnvPoolAdapter:
    return EnvPoolAdapter(self.name, 1, num_threads=1, seed=episode_seed(self._env_seeds[i], int(self._episode[i])),
                          **self._kwargs)

  def _fresh(self, i: int) -> None:
    """Env i's next episode in a pool of its own (the old one's state is what went wrong)."""
    self._closed_nan += self._envs[i].nan_resets
    self._envs[i].close()
    self._episode[i] += 1
    self._envs[i] = self._build(i)
    self._envs[i].reset()

  @property
  def nan_resets(self) -> int:
    return self._closed_nan + sum(e.nan_resets for e in self._envs)

  def reset(self) -> None:
    for i, env in enumerate(self._envs):
      if self._used[i]:
        self._fresh(i)
      else:
        env.reset()
    self._used[:] = True
    self._ended[:] = False
    self._rebuild[:] = False
    self._sent = list(range(self.num_envs))

  def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
    actions = np.asarray(actions)
    for row, i in enumerate(np.asarray(env_ids, np.int64).tolist()):
      if self._ended[i]:
        # Rebuilt in `recv`, which an async task list calls on its receiver thread, outside the lock
        # its other pools' sends wait on. The new episode's reset row comes back; the action is ignored.
        self._rebuild[i] = True
        self._ended[i] = False
      else:
        self._envs[i].send(actions[row:row + 1], np.zeros(1, np.int32))
      self._sent.append(i)

  def can_recv(self) -> bool:
    return bool(self._sent)

  def recv(self) -> StepBatch:
    if not self._sent:
      raise RuntimeError("recv() called with no envs in flight; send() first")
    sent, self._sent = self._sent, []
    rows = []
    for i in sent:
      if self._rebuild[i]:
        self._rebuild[i] = False
        self._fresh(i)
      b = self._envs[i].recv()
      b.env_ids = np.full(len(b), i, np.int32)
      self._ended[i] = bool(b.done[0])
      rows.append(b)
    return concat_sorted(rows)

  def reset_envs(self, env_ids: np.ndarray) -> None:
    self._ended[np.asarray(env_ids, np.int64)] = True

  def step(self, actions: np.ndarray) -> StepBatch:
    self.send(actions, np.arange(self.num_envs, dtype=np.int32))
    return gather_all(self, self.num_envs)

  def render_frames(self, env_ids: np.ndarray) -> np.ndarray:
    return np.concatenate([self._envs[i].render_frames(np.zeros(1, np.int32)) for i in np.asarray(env_ids)])

  def close(self) -> None:
    for env in self._envs:
      env.close()
