"""MetaWorld MT10: ten tasks spread over the envs, one EnvPool per task.

Each env carries its task id (a one-hot `task` observation, as the MT10
baselines feed it to the policy) and its task's instruction text
(`adapter.instructions[env_id]`), which language-conditioned policies use.
Env ids are global: task k owns ids [k * per_task, (k + 1) * per_task).
"""

from __future__ import annotations

import numpy as np

from sim_adapters.base import EnvSpec, ObsSpec, StepBatch
from sim_adapters.envpool_adapter import EnvPoolAdapter, gather_all

# The MT10 task list and one instruction per task (MetaWorld's task descriptions).
MT10_TASKS: dict[str, str] = {
    "Reach-v3": "reach the goal position",
    "Push-v3": "push the puck to the goal",
    "PickPlace-v3": "pick up the puck and place it at the goal",
    "DoorOpen-v3": "open the door",
    "DrawerOpen-v3": "open the drawer",
    "DrawerClose-v3": "close the drawer",
    "ButtonPressTopdown-v3": "press the button from the top",
    "PegInsertSide-v3": "insert the peg into the hole from the side",
    "WindowOpen-v3": "slide the window open",
    "WindowClose-v3": "slide the window closed",
}


class MultiTaskAdapter:
  """MetaWorld/MT10 behind the SimAdapter contract."""

  def __init__(self, num_envs: int, *, batch_size: int | None = None, seed: int = 0,
               num_threads: int = 0, thread_affinity_offset: int = -1, **kwargs):
    num_tasks = len(MT10_TASKS)
    if num_envs % num_tasks:
      raise ValueError(f"MetaWorld/MT10 needs num_envs divisible by {num_tasks}, got {num_envs}")
    self.num_envs = num_envs
    self.per_task = num_envs // num_tasks
    per_batch = None
    if batch_size is not None and batch_size < num_envs:
      per_batch = max(1, batch_size // num_tasks)
    # Few threads per pool: ten pools share the machine's cores.
    threads = num_threads if num_threads > 0 else 1
    self._subs = [
        EnvPoolAdapter(f"MetaWorld/{task}", self.per_task, batch_size=per_batch, seed=seed + 1000 * k,
                       num_threads=threads, thread_affinity_offset=thread_affinity_offset, **kwargs)
        for k, task in enumerate(MT10_TASKS)
    ]
    self.task_ids = np.repeat(np.arange(num_tasks, dtype=np.int32), self.per_task)
    self.instructions = [MT10_TASKS[t] for t in MT10_TASKS for _ in range(self.per_task)]
    self._onehot = np.eye(num_tasks, dtype=np.float32)
    base = self._subs[0].spec
    self.spec = EnvSpec(
        name="MetaWorld/MT10",
        obs={**base.obs, "task": ObsSpec((num_tasks,), np.dtype(np.float32))},
        action_dim=base.action_dim, action_low=base.action_low, action_high=base.action_high,
        max_episode_steps=base.max_episode_steps, has_success=True, num_tasks=num_tasks)
    self._outstanding = np.zeros(num_tasks, np.int64)
    self._next = 0

  @property
  def nan_resets(self) -> int:
    return sum(s.nan_resets for s in self._subs)

  def reset(self) -> None:
    for k, sub in enumerate(self._subs):
      sub.reset()
      self._outstanding[k] = self.per_task

  def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
    env_ids = np.asarray(env_ids, np.int32)
    task = env_ids // self.per_task
    for k in np.unique(task):
      rows = task == k
      self._subs[k].send(actions[rows], env_ids[rows] - k * self.per_task)
      self._outstanding[k] += int(rows.sum())

  def recv(self) -> StepBatch:
    # Round robin over the pools that owe results, so no task starves.
    for _ in range(len(self._subs)):
      k = self._next
      self._next = (self._next + 1) % len(self._subs)
      if self._outstanding[k] > 0:
        b = self._subs[k].recv()
        self._outstanding[k] -= len(b)
        b.env_ids = b.env_ids + k * self.per_task
        b.obs["task"] = self._onehot[np.full(len(b), k)]
        return b
    raise RuntimeError("recv() called with no envs in flight; send() first")

  def step(self, actions: np.ndarray) -> StepBatch:
    self.send(actions, np.arange(self.num_envs, dtype=np.int32))
    return gather_all(self, self.num_envs)

  def reset_envs(self, env_ids: np.ndarray) -> None:
    env_ids = np.asarray(env_ids, np.int32)
    for i in env_ids:
      self._subs[i // self.per_task].reset_envs(np.array([i % self.per_task]))

  def close(self) -> None:
    for s in self._subs:
      s.close()
