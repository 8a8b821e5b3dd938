"""Per-thread stage spans and instant markers, written as a Chrome trace.

Totals (StageClock) say how busy each stage was; they cannot say whether the
stages overlapped. The tracer keeps the individual spans so a run can show it:
trace.json opens in Perfetto / chrome://tracing with one track per thread, and
plots.timeline draws the same spans as a Gantt chart. Instants mark discrete
events (e.g. a controller decision) on the same clock.

Recording is on the hot path (a few spans per batch of envs), so it writes one
slot of a preallocated ring under an uncontended lock; everything else (tids,
JSON, named tuples) is done when the trace is read or written. The ring is
allocated and touched whole at construction, so a run's memory does not creep
up while it fills (200k spans take about two minutes on MT10): a soak compares
resident memory at start and end.
"""

from __future__ import annotations

import collections
import json
import math
import os
import tempfile
import threading
import time
from typing import Any, NamedTuple

import numpy as np


class Span(NamedTuple):
  """A stage `name` busy on `lane` from `start` to `end` (perf_counter seconds)."""
  name: str
  lane: str
  start: float
  end: float


class Instant(NamedTuple):
  """A marker at time `t` (perf_counter seconds); `lane` None means the whole process."""
  name: str
  t: float
  args: dict
  lane: str | None


def _clean(v: Any) -> Any:
  """JSON-safe args: non-finite floats become null, unknown objects their str."""
  if isinstance(v, float):
    return v if math.isfinite(v) else None
  if isinstance(v, (str, int, bool)) or v is None:
    return v
  if isinstance(v, dict):
    return {str(k): _clean(x) for k, x in v.items()}
  if isinstance(v, (list, tuple)):
    return [_clean(x) for x in v]
  try:  # numpy / jax scalars.
    return _clean(v.item())
  except (AttributeError, TypeError, ValueError):
    return str(v)


class Tracer:
  """Thread-safe, bounded recorder of spans and instants.

  Keeps the newest `max_spans` spans (and `max_instants` instants); older ones
  are dropped and counted in `dropped_spans`, so a long run's memory stays flat
  and the trace covers its most recent stretch. `origin` (perf_counter seconds,
  default: now) is time zero of the Chrome trace.
  """

  def __init__(self, max_spans: int = 200_000, max_instants: int = 10_000, origin: float | None = None):
    self.origin = time.perf_counter() if origin is None else origin
    self.max_spans = max_spans
    self.dropped_spans = 0
    self._lock = threading.Lock()
    # The ring: span i (mod max_spans) is (names[name_id[i]], lanes[lane_id[i]], start[i], end[i]).
    self._name_id = np.full(max_spans, -1, np.int32)
    self._lane_id = np.full(max_spans, -1, np.int32)
    self._start = np.full(max_spans, np.nan)
    self._end = np.full(max_spans, np.nan)
    self._names: dict[str, int] = {}
    self._lanes: dict[str, int] = {}
    self._count = 0  # Spans recorded so far (the next one goes to slot count % max_spans).
    self._instants: collections.deque[Instant] = collections.deque(maxlen=max_instants)

  def add_span(self, name: str, lane: str, start: float, end: float) -> None:
    """Records one complete span; times are perf_counter seconds."""
    with self._lock:
      i = self._count % self.max_spans
      if self._count >= self.max_spans:
        self.dropped_spans += 1
      self._name_id[i] = self._names.setdefault(name, len(self._names))
      self._lane_id[i] = self._lanes.setdefault(lane, len(self._lanes))
      self._start[i] = start
      self._end[i] = end
      self._count += 1

  def instant(self, name: str, args: dict | None = None, t: float | None = None, lane: str | None = None) -> None:
    """Records a marker at `t` (default: now) with JSON-able `args`."""
    t = time.perf_counter() if t is None else t
    with self._lock:
      self._instants.append(Instant(name, t, dict(args or {}), lane))

  def spans(self, since: float | None = None, until: float | None = None) -> list[Span]:
    """Recorded spans overlapping [since, until] (perf_counter seconds), oldest first."""
    with self._lock:
      n = min(self._count, self.max_spans)
      first = self._count % self.max_spans if self._count >= self.max_spans else 0  # The oldest slot.
      order = (np.arange(n) + first) % self.max_spans
      name_id, lane_id = self._name_id[order], self._lane_id[order]
      start, end = self._start[order], self._end[order]
      names = {v: k for k, v in self._names.items()}
      lanes = {v: k for k, v in self._lanes.items()}
    lo = -math.inf if since is None else since
    hi = math.inf if until is None else until
    keep = np.flatnonzero((end >= lo) & (start <= hi))
    return [Span(names[int(name_id[i])], lanes[int(lane_id[i])], float(start[i]), float(end[i])) for i in keep]

  def instants(self, since: float | None = None, until: float | None = None) -> list[Instant]:
    """Recorded instants in [since, until], oldest first."""
    with self._lock:
      raw = list(self._instants)
    lo = -math.inf if since is None else since
    hi = math.inf if until is None else until
    return [i for i in raw if lo <= i.t <= hi]

  def chrome_events(self) -> dict:
    """The trace as a Chrome trace-event object (times in µs from `origin`)."""
    spans, instants = self.spans(), self.instants()
    tids: dict[str, int] = {}
    for s in sorted(spans, key=lambda s: s.start):
      tids.setdefault(s.lane, len(tids) + 1)
    for i in instants:
      if i.lane is not None:
        tids.setdefault(i.lane, len(tids) + 1)
    us = lambda t: round((t - self.origin) * 1e6, 3)
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "ebrl"}}]
    for lane, tid in tids.items():
      events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": tid, "args": {"name": lane}})
      events.append({"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": tid, "args": {"sort_index": tid}})
    for s in spans:
      events.append({"ph": "X", "name": s.name, "cat": "stage", "pid": 0, "tid": tids[s.lane],
                     "ts": us(s.start), "dur": round(max(0.0, s.end - s.start) * 1e6, 3)})
    for i in instants:
      events.append({"ph": "i", "s": "g", "name": i.name, "cat": "marker", "pid": 0,
                     "tid": tids.get(i.lane, 0), "ts": us(i.t), "args": _clean(i.args)})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"dropped_spans": self.dropped_spans}}

  def write_chrome(self, path: str) -> None:
    """Writes trace.json atomically (temp file in the same folder + os.replace)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".trace-", suffix=".tmp")
    try:
      with os.fdopen(fd, "w") as f:
        json.dump(self.chrome_events(), f, separators=(",", ":"), allow_nan=False)
      os.replace(tmp, path)
    except BaseException:
      if os.path.exists(tmp):
        os.remove(tmp)
      raise
