"""Whether rollout should overlap training at all, measured on the run itself.

Overlap pays only where the stages leave cores idle for each other. On a
machine the simulator already saturates, training beside the rollout competes
with it for cores (and for the GIL and the caches) and the sum is slower than
the two one after another (BENCHMARKS.md: MetaWorld/Reach-v3 on 2 cores is
slower than sync overlapped and faster with a barrier). No profile taken
stage by stage predicts that contention, so the run measures it.

The knob is the queue's *admission staleness* (TrajectoryQueue.admission): with
`max_staleness` allowed, segments are admitted up to that many versions ahead
(overlap); with 0, no segment starts while an update runs (a barrier, the sync
schedule). Either keeps every sample within `max_staleness`, so choosing never
touches what the learner may train on; nothing is rebuilt, so it is cheap to try.

The probe: after `start_after` updates (compiles done), alternate the two
settings in windows (A B A B, so a drift of the machine hits both alike). A
window settles first, for `settle_s` and for `max_staleness + 1` updates: the
segments admitted under the old setting drain through that many updates (a
device group's batch is a whole group, so on mjx:CartpoleBalance with 256 envs
draining took most of a one-second window, whose barrier then counted 0 env
steps/s). Env steps are counted over `window_s - settle_s` from there, and the
barrier is kept only if it was faster by more than `margin`; the probe repeats
every `reprobe_s`, since the balance moves when the workload does, but never
sooner than REST times its own length after it: with updates 2.3 s apart
(MetaWorld/MT10, 160 envs, T = 128) a probe takes about 30 s, half of it in the
slower setting, and one every minute would cost more than it finds. OverlapProbe is
pure logic (fed (time, env steps), it says the admission); OverlapSwitch is a
run's side of it: fed after every update, it tells the queue each change and
puts the results on the timeline and in the log.

Who probes: resources=auto on a fully batched host plan (ebrl/resources/manager.py;
a barrier plan, planner.plan_barrier, starts in the barrier),
and scheduler=ebrl on a device simulator with resources=auto, where simulation
and generation run fused in XLA's threads and nothing is left to place: two
XLA programs sharing the cores can run slower side by side than one after
the other, as the learner-bound mjx:CartpoleBalance with 256 envs does on 2
cores.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Callable

from ebrl.tuning import Knobs, Mark, UpdateReport

if TYPE_CHECKING:
  from ebrl.spec import RunSpec


@dataclasses.dataclass(frozen=True)
class ProbeResult:
  t: float
  overlapped_env_steps_per_s: float
  barrier_env_steps_per_s: float
  admission: int  # What the run keeps until the next probe.

  def line(self, max_staleness: int) -> str:
    chosen = "overlap" if self.admission else "barrier"
    return (f"overlap probe: overlapped {self.overlapped_env_steps_per_s:,.0f} vs barrier "
            f"{self.barrier_env_steps_per_s:,.0f} env steps/s -> {chosen} "
            f"(segments admitted up to {self.admission} of max_staleness={max_staleness} versions ahead)")


class OverlapProbe:
  """A/B windows of admission staleness max_staleness (overlap) and 0 (barrier)."""

  PATTERN = (True, False, True, False)  # Overlapped?, per window.
  REST = 4.0  # The next probe starts at least REST probe lengths after one ends (<= 20% probing).

  def __init__(self, max_staleness: int, *, window_s: float = 1.0, settle_s: float = 0.25,
               start_after: int = 3, reprobe_s: float = 60.0, margin: float = 0.02, barrier: bool = False):
    if max_staleness < 1:
      raise ValueError(f"max_staleness={max_staleness}: with no overlap allowed there is nothing to probe")
    self.max_staleness = max_staleness
    self.window_s, self.settle_s, self.start_after = window_s, settle_s, start_after
    self.settle_updates = max_staleness + 1  # Updates that drain what the old setting admitted.
    self.reprobe_s, self.margin = reprobe_s, margin
    self.admission = 0 if barrier else max_staleness  # Until the first probe: the plan's choice.
    self.results: list[ProbeResult] = []
    self._updates = 0
    self._window = -1  # Index into PATTERN while probing; -1 between probes.
    self._window_start = 0.0
    self._window_updates = 0  # Updates since the window began.
    self._mark: tuple[float, int] | None = None  # (t, env steps) once the window has settled.
    self._rates: list[tuple[bool, float]] = []
    self._next_probe = None
    self._probe_start = 0.0

  def observe(self, t: float, env_steps: int) -> ProbeResult | None:
    """After every update; returns a result when a probe ends (then `admission` is its choice)."""
    self._updates += 1
    if self._window < 0:
      if self._next_probe is None and self._updates >= self.start_after:
        self._next_probe = t
      if self._next_probe is None or t < self._next_probe:
        return None
      self._probe_start = t
      self._begin(0, t)
      return None
    self._window_updates += 1
    if self._mark is None:
      if t - self._window_start >= self.settle_s and self._window_updates >= self.settle_updates:
        self._mark = (t, env_steps)
      return None
    t0, s0 = self._mark
    if t - t0 < self.window_s - self.settle_s:
      return None
    self._rates.append((self.PATTERN[self._window], (env_steps - s0) / max(t - t0, 1e-9)))
    if self._window + 1 < len(self.PATTERN):
      self._begin(self._window + 1, t)
      return None
    return self._decide(t)

  def _begin(self, window: int, t: float) -> None:
    self._window, self._window_start, self._mark, self._window_updates = window, t, None, 0
    self.admission = self.max_staleness if self.PATTERN[window] else 0

  def _decide(self, t: float) -> ProbeResult:
    mean = lambda overlapped: (sum(r for o, r in self._rates if o == overlapped)
                               / max(1, sum(o == overlapped for o, _ in self._rates)))
    over, barrier = mean(True), mean(False)
    self.admission = 0 if barrier > over * (1.0 + self.margin) else self.max_staleness
    result = ProbeResult(t, over, barrier, self.admission)
    self.results.append(result)
    rest = max(self.reprobe_s, self.REST * (t - self._probe_start))
    self._window, self._rates, self._next_probe = -1, [], t + rest
    return result

  @property
  def probing(self) -> bool:
    return self._window >= 0


class OverlapSwitch:
  """A run's probe as a tuner (ebrl/tuning.py): fed every update's report, it returns each
  admission change as a knob and each result as a mark for the timeline, and logs it."""

  @staticmethod
  def allowed(run: RunSpec) -> bool:
    """resources=auto may probe this run: overlap is allowed at all and probing is not switched off."""
    return run.resources == "auto" and run.max_staleness >= 1 and run.quotas.overlap_probe_s > 0

  def __init__(self, max_staleness: int, window_s: float, log: Callable[[str], None] = print,
               barrier: bool = False):
    self.probe = OverlapProbe(max_staleness, window_s=window_s, settle_s=window_s / 4, barrier=barrier)
    self._log = log
    self._t0 = time.time()

  @property
  def results(self) -> list[ProbeResult]:
    return self.probe.results

  @property
  def admission(self) -> int:
    """The admission the queue should have now."""
    return self.probe.admission

  def initial(self) -> Knobs:
    return Knobs(admission=self.probe.admission)

  def decide(self, report: UpdateReport) -> Knobs | None:
    before = self.probe.admission
    result = self.probe.observe(report.time - self._t0, report.env_steps)
    admission = self.probe.admission if self.probe.admission != before else None
    if result is None:
      return None if admission is None else Knobs(admission=admission)
    self._log(f"[resources] {result.line(self.probe.max_staleness)}")
    mark = Mark("overlap_probe", "overlap" if result.admission else "barrier",
                {"overlapped_env_steps_per_s": result.overlapped_env_steps_per_s,
                 "barrier_env_steps_per_s": result.barrier_env_steps_per_s, "admission": result.admission})
    return Knobs(admission=admission, marks=(mark,))

  def metrics(self) -> dict:
    if not self.results:
      return {}
    last = self.results[-1]
    return {"overlap_admission": last.admission, "overlap_overlapped_env_steps_per_s": last.overlapped_env_steps_per_s,
            "overlap_barrier_env_steps_per_s": last.barrier_env_steps_per_s}
