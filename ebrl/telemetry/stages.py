"""Stage timers: how much wall time each stage (sim, gen, train) is busy.

One StageClock per thread; `with clock.stage("sim"):` adds the elapsed time to
that stage. Totals are what metrics report as time_sim_s, time_gen_s, ...
"""

from __future__ import annotations

import contextlib
import threading
import time

STAGES = ("sim", "gen", "train")


class StageClock:

  def __init__(self):
    self._lock = threading.Lock()
    self.totals: dict[str, float] = {s: 0.0 for s in STAGES}

  @contextlib.contextmanager
  def stage(self, name: str):
    t0 = time.perf_counter()
    try:
      yield
    finally:
      dt = time.perf_counter() - t0
      with self._lock:
        self.totals[name] = self.totals.get(name, 0.0) + dt

  def snapshot(self) -> dict[str, float]:
    with self._lock:
      return dict(self.totals)
