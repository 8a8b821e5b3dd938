"""Per-env episode return, length and success, and the last-100 window.

success_rate is the fraction of the last `window` finished episodes that
succeeded at any step (RLinf's `success_once`); it is NaN while the task has
no success signal or no episode has finished. With a `target`, the tracker
notes the moment a full window first reached it, episode by episode as they
finish: a run's time to success is then when its episodes got there, not when
the next update or metrics row happened to look.

It also counts the run's env steps (`count_steps`, after the step's episodes
were observed), so the env steps at that moment are known to within one step
batch, and every reader (the recorder, the tuners, a benchmark's window) reads
the one count the schedulers keep.

A multi-task env (`tasks`, with each env's task id in `env_tasks`) also keeps
a window per task: `success_rate_by_task` is each task's fraction of its own
last `window` episodes, by the same definition, and None for a task with no
finished episode yet. The mixed window alone would hide a task that never
succeeds behind the others, and the tasks finish episodes at different rates.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Sequence

import numpy as np

from sim_adapters.base import StepBatch


class EpisodeTracker:

  def __init__(self, num_envs: int, has_success: bool, window: int = 100, target: float | None = None,
               tasks: Sequence[str] = (), env_tasks: np.ndarray | None = None):
    self.window = window
    self.has_success = has_success
    self.target = target
    self.first_hit: float | None = None  # time.time() when a full window first reached target.
    self.env_steps = 0  # Env steps (decisions) taken by the run, restored ones included.
    self.env_steps_at_hit: int | None = None  # env_steps when first_hit was noted.
    self.first_step_time: float | None = None  # time.time() of this launch's first counted steps.
    self._ret = np.zeros(num_envs, np.float64)
    self._len = np.zeros(num_envs, np.int64)
    self._succ = np.zeros(num_envs, np.float32)
    self.recent: collections.deque = collections.deque(maxlen=window)  # (return, length, success)
    self.episodes = 0
    self.tasks = tuple(tasks)
    if self.tasks and (env_tasks is None or np.shape(env_tasks) != (num_envs,)):
      raise ValueError(f"tasks need the task id of each of the {num_envs} envs")
    self._env_task = np.asarray(env_tasks, np.int32) if self.tasks else None
    # Per task: the successes (1.0 / 0.0) of its last `window` finished episodes.
    self._by_task = [collections.deque(maxlen=window) for _ in self.tasks]
    self._lock = threading.Lock()  # The sampler observes while the learner thread logs.

  def observe(self, b: StepBatch) -> None:
    with self._lock:
      self._observe(b)

  def _observe(self, b: StepBatch) -> None:
    ids, valid = b.env_ids, ~b.reset_step
    self._ret[ids] += np.where(valid, b.reward, 0.0)
    self._len[ids] += valid
    self._succ[ids] = np.fmax(self._succ[ids], np.where(valid, b.success, 0.0))
    done = b.done
    if done.any():
      fin = ids[done]
      self._add_finished(self._ret[fin], self._len[fin], self._succ[fin],
                         None if self._env_task is None else self._env_task[fin])
      self._ret[fin] = 0.0
      self._len[fin] = 0
      self._succ[fin] = 0.0

  def count_steps(self, n: int) -> None:
    """n env steps taken, whose episodes were observed already."""
    with self._lock:
      if self.first_step_time is None:
        self.first_step_time = time.time()
      self.env_steps += n
      if self.first_hit is not None and self.env_steps_at_hit is None:
        self.env_steps_at_hit = self.env_steps

  def add_finished(self, returns: np.ndarray, lengths: np.ndarray, successes: np.ndarray) -> None:
    """Whole finished episodes measured elsewhere (device simulators keep their own counts)."""
    with self._lock:
      self._add_finished(returns, lengths, successes)

  def _add_finished(self, returns: np.ndarray, lengths: np.ndarray, successes: np.ndarray,
                    task_ids: np.ndarray | None = None) -> None:
    episodes = list(zip(np.asarray(returns).tolist(), np.asarray(lengths).tolist(), np.asarray(successes).tolist()))
    self.episodes += len(episodes)
    if task_ids is not None:
      for k, e in zip(np.asarray(task_ids).tolist(), episodes):
        self._by_task[k].append(e[2])
    if self.first_hit is not None or self.target is None or not self.has_success:
      self.recent.extend(episodes)
      return
    for i, e in enumerate(episodes):  # One at a time: the window may get there mid-batch.
      self.recent.append(e)
      if len(self.recent) == self.window and sum(r[2] for r in self.recent) >= self.target * self.window:
        self.first_hit = time.time()
        self.recent.extend(episodes[i + 1:])
        return

  def _mean(self, i: int) -> float:
    with self._lock:
      if not self.recent:
        return float("nan")
      return float(np.mean([e[i] for e in self.recent]))

  @property
  def success_rate(self) -> float:
    return self._mean(2) if self.has_success else float("nan")

  @property
  def episode_return(self) -> float:
    return self._mean(0)

  @property
  def episode_length(self) -> float:
    return self._mean(1)

  @property
  def success_rate_by_task(self) -> dict[str, float | None] | None:
    """{task: success over its last `window` episodes, None before its first}; None for a
    single-task env."""
    if not self.tasks:
      return None
    with self._lock:
      return {t: float(np.mean(w)) if w and self.has_success else None for t, w in zip(self.tasks, self._by_task)}

  @property
  def window_full(self) -> bool:
    return len(self.recent) == self.window

  def window_sums(self) -> np.ndarray:
    """The window's episodes and their summed return, length and success, then per task its
    window's episodes and successes: what the windows of several processes combine from."""
    with self._lock:
      sums = [len(self.recent), *(float(sum(e[i] for e in self.recent)) for i in range(3))]
      for w in self._by_task:
        sums += [len(w), float(sum(w))]
      return np.array(sums, np.float64)

  def state_dict(self) -> dict:
    with self._lock:
      d = {"recent": [list(e) for e in self.recent], "episodes": self.episodes}
      if self.tasks:
        d["recent_by_task"] = {t: list(w) for t, w in zip(self.tasks, self._by_task)}
      return d

  def load_state_dict(self, d: dict) -> None:
    self.recent.clear()
    self.recent.extend(tuple(e) for e in d.get("recent", []))
    self.episodes = int(d.get("episodes", 0))
    by_task = d.get("recent_by_task", {})
    for t, w in zip(self.tasks, self._by_task):
      w.clear()
      w.extend(float(s) for s in by_task.get(t, []))
