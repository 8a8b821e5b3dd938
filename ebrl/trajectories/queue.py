"""Segments from the sampler to the learner, with the staleness bound enforced.

A segment has a *start version*: the learner version at which its start was
granted. Every sample in it was generated with params at least that new, so a
segment started at version s stays within the bound `max_staleness` (eta) if
an update at a version <= s + eta consumes it: its deadline.

Admission (AReaL's capacity rule): a segment may start only while fewer than
(eta + 1) * segments_per_update regular segments are started and not yet
consumed (eta * segments_per_update while an update runs: a segment started
then can only go to the updates after it). Consumption: each update takes `segments_per_update` finished
segments, earliest deadline first, so the learner takes whichever envs
finished and does not wait for a straggler, except when skipping it would
make some segment miss its deadline. That is an EDF schedulability check: after
the update at version u, for every deadline D the segments still owed with a
deadline <= D must fit the (D - u) updates before it. Admission adds only
deadlines u + eta, and keeps their count within (eta + 1) updates, so the check
always passes once the segments it waits for finish. The bound then holds for
every regular segment by construction; nothing is masked.

Admission may be held below the bound (`set_admission(k)`, k <= eta: k = 0 is a
barrier, no segment starting while an update runs): deadlines stay at s + eta,
so a stricter admission only leaves the EDF check more room. The resource
manager uses it to choose between overlap and a barrier (ebrl/resources/overlap.py).

Force-started segments (the scheduler's deadlock breaker, `force_start`) sit
outside this accounting: they fill a batch only when too few regular segments
are ready, never delay one, and are the only samples the learner can still
mask as too stale.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
from typing import Any


@dataclasses.dataclass(order=True)
class _Ready:
  start_version: int
  arrival: int
  forced: bool = dataclasses.field(compare=False)
  item: Any = dataclasses.field(compare=False)


class TrajectoryQueue:

  def __init__(self, segments_per_update: int, max_staleness: int):
    self.segments_per_update = segments_per_update
    self.max_staleness = max_staleness
    self.admission = max_staleness  # Versions ahead a segment may start (<= max_staleness).
    self._cv = threading.Condition()
    self._regular: list[_Ready] = []  # Finished regular segments, unsorted.
    self._forced: collections.deque[_Ready] = collections.deque()  # Finished force-started ones, oldest first.
    self._in_flight: collections.Counter[int] = collections.Counter()  # start version -> regular segments running
    self._arrivals = itertools.count()
    self.unconsumed = 0  # Regular segments started and not yet taken by an update (running or finished).
    # An update is running on a batch it took and has not yet published the next version: a
    # segment started now has the old start version but can only go to the updates after it.
    self._updating = False
    self.forced = 0  # Segments force-started so far (the only ones that can come back too stale).
    self.version = 0
    self.closed = False
    self.learner_waiting = False  # The learner is blocked in get_batch for lack of a batch.

  def capacity(self) -> int:
    with self._cv:
      return self._capacity()

  def _capacity(self) -> int:
    """Starts that fit before their deadline: the updates from the next one to take a batch up to
    version + eta have (eta + 1) batches of room, less one while an update runs, less what is owed."""
    updates = self.admission + 1 - self._updating
    return max(0, updates * self.segments_per_update - self.unconsumed)

  def set_admission(self, versions: int) -> None:
    """Admits segments up to `versions` (0..max_staleness) ahead from now on; the bound stays."""
    if not 0 <= versions <= self.max_staleness:
      raise ValueError(f"admission {versions} must be in [0, max_staleness={self.max_staleness}]")
    with self._cv:
      self.admission = versions
      self._cv.notify_all()

  def try_start(self, n: int) -> tuple[int, int]:
    """Reserves up to n segment starts; returns (how many were granted, their start version)."""
    with self._cv:
      k = min(n, self._capacity())
      self.unconsumed += k
      if k:
        self._in_flight[self.version] += k
      return k, self.version

  def force_start(self, n: int) -> int:
    """Starts n segments beyond capacity (deadlock breaker); returns their start version."""
    with self._cv:
      self.forced += n
      return self.version

  def resume_at(self, version: int) -> None:
    """Continues a run at `version` with nothing started (a resumed run's envs start afresh)."""
    with self._cv:
      self.version = version
      self.unconsumed = 0
      self._updating = False
      self._in_flight.clear()
      self._regular.clear()
      self._forced.clear()
      self._cv.notify_all()

  def put(self, item: Any, start_version: int, forced: bool = False) -> None:
    """A finished segment (any object: the learner's assemble function stacks them)."""
    with self._cv:
      entry = _Ready(start_version, next(self._arrivals), forced, item)
      if forced:
        self._forced.append(entry)
      else:
        self._in_flight[start_version] -= 1
        if not self._in_flight[start_version]:
          del self._in_flight[start_version]
        self._regular.append(entry)
      self._cv.notify_all()

  def _select(self) -> list[_Ready] | None:
    """The next batch at the current version, or None if it must wait (see the module docstring)."""
    b, eta, u = self.segments_per_update, self.max_staleness, self.version
    if len(self._regular) + len(self._forced) < b:
      return None
    self._regular.sort()
    regular = self._regular[:b]
    forced = list(itertools.islice(self._forced, b - len(regular)))
    # What stays owed after this update, counted by start version.
    owed = collections.Counter(self._in_flight)
    for e in self._regular[len(regular):]:
      owed[e.start_version] += 1
    for s in range(u - eta, u + 1):  # Deadline s + eta; updates u + 1 .. s + eta remain before it.
      if sum(n for v, n in owed.items() if v <= s) > (s + eta - u) * b:
        return None
    return regular + forced

  def get_batch(self, timeout: float) -> list[Any] | None:
    """The next `segments_per_update` segments, or None on timeout or close."""
    with self._cv:
      batch = None if self.closed else self._select()
      if batch is None and not self.closed:
        self.learner_waiting = True
        try:
          self._cv.wait_for(lambda: self.closed or self._select() is not None, timeout)
        finally:
          self.learner_waiting = False
        batch = None if self.closed else self._select()
      if batch is None:
        return None
      regular = sum(not e.forced for e in batch)
      del self._regular[:regular]
      for _ in range(len(batch) - regular):
        self._forced.popleft()
      self.unconsumed -= regular
      self._updating = True
      return [e.item for e in batch]

  def set_version(self, version: int) -> None:
    """The learner published `version`; more segments may start."""
    with self._cv:
      self.version = version
      self._updating = False
      self._cv.notify_all()

  def close(self) -> None:
    with self._cv:
      self.closed = True
      self._cv.notify_all()

  def __len__(self) -> int:
    with self._cv:
      return len(self._regular) + len(self._forced)
