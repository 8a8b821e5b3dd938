"""Admission: which segments may start now, one object for the host and device async schedulers.

The TrajectoryQueue keeps the capacity rule and the deadlines
(ebrl/trajectories/queue.py). Around it both schedulers need the same three
things, which `Admission` holds in one place:

* a grant: up to n segment starts, with their start version (`grant`), or
  one start numbered in grant order, waiting briefly for room (`reserve`: a
  device group has nothing else to do, and its batches reach the learner in
  that order);
* parked envs: host envs whose next segment would start beyond capacity wait
  here with their observations (`park`) and are released oldest first once
  the learner makes room (`release_parked`), while envs in the middle of a
  segment go on;
* the deadlock breaker: async EnvPool returns whole batches, so a group with
  too many envs parked cannot return the envs it still has in flight. If the
  learner waits for segments and every group is starved that way, nothing can
  move: `release_parked` then starts one parked env beyond capacity (the only
  kind of segment the learner can still find too stale and mask).

Publishing a version (`published`) raises the queue's version and wakes
whoever waits for room.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from ebrl.trajectories.queue import TrajectoryQueue


@dataclasses.dataclass(frozen=True)
class Release:
  """Parked envs of one group granted a start: their local ids, observations and start version."""

  group: int
  ids: np.ndarray
  obs: dict[str, np.ndarray]
  start_version: int
  forced: bool = False  # Started beyond capacity by the deadlock breaker.


class Admission:

  def __init__(self, queue: TrajectoryQueue, num_groups: int):
    self.queue = queue
    self._room = threading.Condition()  # Notified when the learner publishes or the run stops.
    self._tickets = 0  # Starts granted through `reserve`, in order.
    self._parked: list[tuple[int, np.ndarray, dict[str, np.ndarray]]] = []  # (group, local ids, obs), oldest first.
    # Set by a group that cannot recv (too few envs in flight for a whole batch) and got no parked
    # actions for a while; cleared when it can recv or sends again.
    self.starved = [threading.Event() for _ in range(num_groups)]

  # -- grants ------------------------------------------------------------------

  def set_admission(self, versions: int) -> None:
    """Admits segments up to `versions` ahead (0: a barrier); the bound stays max_staleness."""
    self.queue.set_admission(versions)

  def grant(self, n: int) -> tuple[int, int]:
    """Up to n segment starts now: (how many were granted, their start version)."""
    return self.queue.try_start(n)

  def reserve(self, timeout: float) -> tuple[int, int] | None:
    """One start, numbered in grant order: (ticket, start version), or None after waiting up to
    `timeout` for room."""
    with self._room:
      granted, start_version = self.queue.try_start(1)
      if not granted:
        self._room.wait(timeout)
        return None
      ticket = self._tickets
      self._tickets += 1
      return ticket, start_version

  def published(self, version: int) -> None:
    """The learner published `version`: more segments may start."""
    with self._room:
      self.queue.set_version(version)
      self._room.notify_all()

  def resume_at(self, version: int) -> None:
    self.queue.resume_at(version)

  def close(self) -> None:
    """The run stops: the learner and everyone waiting for room wake."""
    self.queue.close()
    with self._room:
      self._room.notify_all()

  # -- parked envs and the deadlock breaker -------------------------------------

  def park(self, group: int, ids: np.ndarray, obs: dict[str, np.ndarray]) -> None:
    self._parked.append((group, ids, obs))

  def deadlocked(self) -> bool:
    """The learner waits for segments and no group can return an env."""
    return self.queue.learner_waiting and all(s.is_set() for s in self.starved)

  def release_parked(self) -> list[Release]:
    """Parked envs granted a start now, oldest first; when deadlocked and nothing was granted, one
    env beyond capacity (as few as will do). The rest stay parked. One thread calls this."""
    if not self._parked:
      return []
    force = self.deadlocked()
    out, keep = [], []
    for g, ids, obs in self._parked:
      granted, start_version = self.queue.try_start(len(ids))
      if granted:
        force = False  # Room came back since the check: the envs granted now end the wait.
        out.append(Release(g, ids[:granted], {k: v[:granted] for k, v in obs.items()}, start_version))
      if force and granted < len(ids):
        one = slice(granted, granted + 1)
        out.append(Release(g, ids[one], {k: v[one] for k, v in obs.items()}, self.queue.force_start(1), forced=True))
        granted, force = granted + 1, False
      if granted < len(ids):
        rest = slice(granted, None)
        keep.append((g, ids[rest], {k: v[rest] for k, v in obs.items()}))
    self._parked = keep
    return out
