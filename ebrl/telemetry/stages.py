"""Stage timers: how much wall time each stage (sim, gen, train) is busy.

`with clock.stage("sim"):` adds the elapsed time to that stage; the clock is
thread-safe, so one clock can be shared by all of a scheduler's threads.
Totals are what metrics report as time_sim_s, time_gen_s, ... Totals cannot
show whether stages overlapped, so a clock given a Tracer also records each
stage as a span on a lane (default: the calling thread's name), which
trace.json and plots/timeline.png are drawn from.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

from ebrl.telemetry.trace import Tracer

STAGES = ("sim", "gen", "train")


class StageClock:

  def __init__(self, tracer: Tracer | None = None):
    self._lock = threading.Lock()
    self.totals: dict[str, float] = {s: 0.0 for s in STAGES}
    self.tracer = tracer

  @contextlib.contextmanager
  def stage(self, name: str, lane: str | None = None) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
      yield
    finally:
      t1 = time.perf_counter()
      with self._lock:
        self.totals[name] = self.totals.get(name, 0.0) + (t1 - t0)
      tracer = self.tracer
      if tracer is not None:
        tracer.add_span(name, lane or threading.current_thread().name, t0, t1)

  def snapshot(self) -> dict[str, float]:
    with self._lock:
      return dict(self.totals)
