"""Segments from the sampler to the learner, with the staleness bound enforced.

The sampler may only *start* a new segment while
    started < (max_staleness + version + 1) * segments_per_update
(AReaL's capacity rule), where `version` is the learner's current policy
version. Segments are consumed first-completed first, `segments_per_update` at
a time, so the learner never waits for a straggler: whichever envs finished
their segments feed the next update. Samples that still end up more than
`max_staleness` versions old (a straggler overtaken by many updates) are masked
by the learner and counted, so the bound holds for every sample used.
"""

from __future__ import annotations

import collections
import threading

from ebrl.assembler import Segment


def fresh_mask(learner_version, sample_version, max_staleness: int):
  """Samples an update at `learner_version` may use: at most max_staleness versions old.

  Works on NumPy and JAX arrays alike (the learner calls it inside its jit).
  """
  return (learner_version - sample_version) <= max_staleness


class TrajectoryQueue:

  def __init__(self, segments_per_update: int, max_staleness: int):
    self.segments_per_update = segments_per_update
    self.max_staleness = max_staleness
    self._cv = threading.Condition()
    self._segments: collections.deque[Segment] = collections.deque()
    self.started = 0
    self.forced = 0  # Segments started beyond capacity (see force_start): the only source of stale samples.
    self.version = 0
    self.closed = False

  def capacity(self) -> int:
    with self._cv:
      return self._capacity()

  def _capacity(self) -> int:
    return max(0, (self.max_staleness + self.version + 1) * self.segments_per_update - self.started)

  def try_start(self, n: int) -> int:
    """Reserves up to n segment starts; returns how many were granted."""
    with self._cv:
      k = min(n, self._capacity())
      self.started += k
      return k

  def resume_at(self, version: int) -> None:
    """Continues a run at `version`: the segments of its `version` updates count as started."""
    with self._cv:
      self.version = version
      self.started = version * self.segments_per_update
      self._cv.notify_all()

  def force_start(self, n: int) -> int:
    """Starts n segments beyond capacity (deadlock breaker); the learner's mask keeps the bound."""
    with self._cv:
      self.started += n
      self.forced += n
      return n

  def put(self, segment: Segment) -> None:
    with self._cv:
      self._segments.append(segment)
      if len(self._segments) >= self.segments_per_update:
        self._cv.notify_all()

  def get_batch(self, timeout: float) -> list[Segment] | None:
    """The next `segments_per_update` segments, or None on timeout or close."""
    with self._cv:
      ok = self._cv.wait_for(lambda: self.closed or len(self._segments) >= self.segments_per_update, timeout)
      if not ok or len(self._segments) < self.segments_per_update:
        return None
      return [self._segments.popleft() for _ in range(self.segments_per_update)]

  def set_version(self, version: int) -> None:
    """The learner published `version`; more segments may start."""
    with self._cv:
      self.version = version
      self._cv.notify_all()

  def close(self) -> None:
    with self._cv:
      self.closed = True
      self._cv.notify_all()

  def __len__(self) -> int:
    with self._cv:
      return len(self._segments)
