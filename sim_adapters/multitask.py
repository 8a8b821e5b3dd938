"""MetaWorld multi-task envs (MT10, MT50, a user's list): tasks spread over the envs, one EnvPool per task.

Which tasks an env name stands for is sim_adapters/tasks.py's to say. Each env
carries its task id (a one-hot `task` observation as wide as the task list, as
the MT10 baselines feed it to the policy) and its task's instruction text
(`adapter.instructions[env_id]`), which language-conditioned policies use.
Env ids are global: task k owns ids [offsets[k], offsets[k + 1]); with
num_envs not a multiple of the task count the first tasks get one env more
(`env_task_ids`). Task k's pool is seeded `seed + 1000 * k`.

Two ways of receiving, one per use:
* sync (`batch_size` unset): `step` sends every env and `recv` visits the pools
  that owe results in turn; a barrier step needs every pool anyway.
* async (`batch_size < num_envs`): tasks run independently of each other, the
  envs of one task together. A receiver thread per pool waits on that pool's
  `recv` (EnvPool releases the GIL there) and queues what it gets, so `recv`
  takes whichever pools' results come first. Visiting pools in turn would
  block on one slow task while the others have envs waiting for actions, and
  MetaWorld's tasks differ several-fold in step and reset cost. Like one
  EnvPool's async recv, it returns at least `batch_size` envs (fewer only when
  nothing more is in flight): what a scheduler generates for at once, and so
  what a generation call costs, is the batch it asked for.

  Each task's pool is a sync-mode EnvPool: a step of the envs sent to it
  together, received together. An env sent while its pool is stepping waits
  for that step to be received (a second request to a sync-mode pool before
  its recv would mix up its rows) and goes with the next. So envs a scheduler
  holds back never leave the rest of their pool unable to return, which an
  async pool (its batch a part of its envs) could: with its other envs parked,
  an async pool's last env waits for a whole batch that never comes.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from sim_adapters.base import EnvSpec, ObsSpec, StepBatch, concat_sorted, gather_all
from sim_adapters.envpool_adapter import EnvPoolAdapter
from sim_adapters.fresh_episodes import FreshEpisodeAdapter, needs_fresh_episodes
from sim_adapters.tasks import MT10, METAWORLD_INSTRUCTIONS, PREFIX, multitask_tasks

# The MT10 task list and one instruction per task (MetaWorld's task descriptions).
MT10_TASKS: dict[str, str] = {t: METAWORLD_INSTRUCTIONS[t] for t in MT10}


_ERROR_POLL_S = 0.1  # How often a waiting recv checks for a dead receiver.
_CLOSE_S = 10.0  # Longest close() waits for all receivers together.


def task_shares(num_envs: int, num_tasks: int, name: str = "this multi-task env") -> np.ndarray:
  """Envs per task: as even as possible, the first tasks one more."""
  if num_envs < num_tasks:
    raise ValueError(f"{name} needs at least {num_tasks} envs (one per task), got {num_envs}")
  return np.array([num_envs // num_tasks + (k < num_envs % num_tasks) for k in range(num_tasks)], np.int64)


def env_task_ids(num_envs: int, num_tasks: int) -> np.ndarray:
  """int32 [num_envs]: the task id of each env of one adapter (task k's envs follow task k-1's)."""
  return np.repeat(np.arange(num_tasks, dtype=np.int32), task_shares(num_envs, num_tasks))


class MultiTaskAdapter:
  """A MetaWorld task list (`name`: MetaWorld/MT10, MetaWorld/MT50, MetaWorld/MT:<tasks>) behind the
  SimAdapter contract."""

  def __init__(self, num_envs: int, *, name: str = "MetaWorld/MT10", batch_size: int | None = None, seed: int = 0,
               num_threads: int = 0, thread_affinity_offset: int = -1, **kwargs):
    tasks = multitask_tasks(name)
    if tasks is None:
      raise ValueError(f"'{name}' is not a multi-task MetaWorld env (MetaWorld/MT10, MetaWorld/MT50 or "
                       "MetaWorld/MT:<task>,<task>,...)")
    num_tasks = len(tasks)
    self.tasks = tasks
    self.num_envs = num_envs
    shares = task_shares(num_envs, num_tasks, name)
    self.offsets = np.concatenate([[0], np.cumsum(shares)]).astype(np.int32)
    self.is_async = batch_size is not None and batch_size < num_envs
    self.batch_size = batch_size if self.is_async else num_envs
    # Few threads per pool: the task pools share the machine's cores.
    threads = num_threads if num_threads > 0 else 1
    self._subs = []
    for k, task in enumerate(tasks):
      pool = FreshEpisodeAdapter if needs_fresh_episodes(PREFIX + task) else EnvPoolAdapter
      self._subs.append(pool(PREFIX + task, int(shares[k]), seed=seed + 1000 * k, num_threads=threads,
                        thread_affinity_offset=thread_affinity_offset, **kwargs))
    self.task_ids = env_task_ids(num_envs, num_tasks)
    self.instructions = [METAWORLD_INSTRUCTIONS[tasks[k]] for k in self.task_ids]
    self._onehot = np.eye(num_tasks, dtype=np.float32)
    base = self._subs[0].spec
    self.spec = EnvSpec(
        name=name,
        obs={**base.obs, "task": ObsSpec((num_tasks,), np.dtype(np.float32))},
        action_dim=base.action_dim, action_low=base.action_low, action_high=base.action_high,
        max_episode_steps=base.max_episode_steps, has_success=True, num_tasks=num_tasks)
    self._outstanding = np.zeros(num_tasks, np.int64)  # Envs sent to pool k and not yet received.
    self._deferred: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in tasks]  # (actions, local ids)
    self._next = 0
    # Async mode: receiver threads, started by the first reset.
    self._cond = threading.Condition()  # Guards the counts and the ready queue.
    # One wake-up per pool, sharing that lock: a send wakes only the receivers of the pools it sent to.
    self._pool_ready = [threading.Condition(self._cond) for _ in self._subs]
    self._ready: queue.Queue = queue.Queue()
    self._receivers: list[threading.Thread] = []
    self._closed = False
    self._error: BaseException | None = None  # The first receiver error, raised by recv().

  @property
  def nan_resets(self) -> int:
    return sum(s.nan_resets for s in self._subs)

  def _label(self, k: int, b: StepBatch) -> StepBatch:
    b.env_ids = b.env_ids + self.offsets[k]
    b.obs["task"] = self._onehot[np.full(len(b), k)]
    return b

  def reset(self) -> None:
    with self._cond:
      for k, sub in enumerate(self._subs):
        sub.reset()
        self._outstanding[k] = sub.num_envs
        self._deferred[k] = []
        self._pool_ready[k].notify()
    if self.is_async and not self._receivers:
      self._receivers = [threading.Thread(target=self._receive, args=(k,), name=f"mt-recv{k}", daemon=True)
                         for k in range(len(self._subs))]
      for th in self._receivers:
        th.start()

  def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
    env_ids = np.asarray(env_ids, np.int32)
    task = np.searchsorted(self.offsets, env_ids, side="right") - 1
    with self._cond:
      for k in np.unique(task):
        rows = task == k
        if self.is_async and self._outstanding[k]:  # Stepping: these go with its next step.
          self._deferred[k].append((actions[rows], env_ids[rows] - self.offsets[k]))
          continue
        self._send_pool(k, actions[rows], env_ids[rows] - self.offsets[k])

  def _send_pool(self, k: int, actions: np.ndarray, local_ids: np.ndarray) -> None:
    """One request to pool k (the caller holds the lock)."""
    self._subs[k].send(actions, local_ids)
    self._outstanding[k] += len(local_ids)
    self._pool_ready[k].notify()

  def _receive(self, k: int) -> None:
    """Receiver thread of pool k (async mode): waits for envs in flight, then for their results."""
    sub = self._subs[k]
    try:
      while True:
        with self._cond:
          while self._outstanding[k] == 0 and not self._closed:
            self._pool_ready[k].wait()
          if self._closed:
            return
        b = self._label(k, sub.recv())
        with self._cond:  # Both at once, so `can_recv` never sees the rows in neither place.
          self._outstanding[k] -= len(b)
          self._ready.put(b)
          if not self._outstanding[k] and self._deferred[k] and not self._closed:  # Free: what waited.
            waiting, self._deferred[k] = self._deferred[k], []
            self._send_pool(k, np.concatenate([a for a, _ in waiting]), np.concatenate([i for _, i in waiting]))
    except BaseException as e:  # pylint: disable=broad-except  # Raised by recv() in the caller's thread.
      with self._cond:
        if self._error is None:
          self._error = RuntimeError(f"{self.spec.name} receiver of task {self.tasks[k]} failed: "
                                     f"{type(e).__name__}: {e}")
          self._error.__cause__ = e


  def can_recv(self) -> bool:
    """Whether `recv` can return without more sends: some pool has envs in flight, or (async) a
    result or a receiver's error is queued."""
    with self._cond:
      return self._error is not None or not self._ready.empty() or bool(self._outstanding.any())

  def _more_coming(self) -> bool:
    """Whether results not yet queued will come without another send (some pool is stepping)."""
    with self._cond:
      return bool(self._outstanding.any())

  def recv(self) -> StepBatch:
    if self.is_async:
      # Ready results until batch_size rows, waiting while more can come (noticing a dead receiver
      # meanwhile); then whatever else is ready now.
      batches, rows = [], 0
      while rows < self.batch_size:
        if self._error is not None:
          raise self._error
        try:
          b = self._ready.get(timeout=_ERROR_POLL_S)
        except queue.Empty:
          if rows and not self._more_coming():
            break
          continue
        batches.append(b)
        rows += len(b)
        if self._ready.empty() and not self._more_coming():
          break
      while True:
        try:
          batches.append(self._ready.get_nowait())
        except queue.Empty:
          return concat_sorted(batches) if len(batches) > 1 else batches[0]
    # Sync: round robin over the pools that owe results, so no task starves.
    for _ in range(len(self._subs)):
      k = self._next
      self._next = (self._next + 1) % len(self._subs)
      if self._outstanding[k] > 0:
        b = self._label(k, self._subs[k].recv())
        self._outstanding[k] -= len(b)
        return b
    raise RuntimeError("recv() called with no envs in flight; send() first")

  def step(self, actions: np.ndarray) -> StepBatch:
    self.send(actions, np.arange(self.num_envs, dtype=np.int32))
    return gather_all(self, self.num_envs)

  def reset_envs(self, env_ids: np.ndarray) -> None:
    env_ids = np.asarray(env_ids, np.int32)
    task = np.searchsorted(self.offsets, env_ids, side="right") - 1
    for i, k in zip(env_ids, task):
      self._subs[k].reset_envs(np.array([i - self.offsets[k]]))

  def close(self) -> None:
    with self._cond:
      self._closed = True
      for k in range(len(self._subs)):
        self._pool_ready[k].notify()
    # A receiver in recv waits for its pool's step in flight, which returns within a step.
    deadline = time.monotonic() + _CLOSE_S
    for th in self._receivers:
      th.join(timeout=max(0.0, deadline - time.monotonic()))
    for s in self._subs:
      s.close()
