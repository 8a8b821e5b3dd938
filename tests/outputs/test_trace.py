"""Stage tracing: Chrome trace.json is valid and exact; timeline PNGs are drawn.

Spans are recorded with explicit times wherever timing matters, so the checks
are exact and the tests take well under a second.
"""

from __future__ import annotations

import json
import os
import threading
import time

import matplotlib.image
import pytest

from ebrl.telemetry import plots
from ebrl.telemetry.stages import STAGES, StageClock
from ebrl.telemetry.trace import Span, Tracer


def _events(tracer: Tracer, tmp_path) -> list[dict]:
  path = os.path.join(tmp_path, "trace.json")
  tracer.write_chrome(path)
  with open(path) as f:
    doc = json.load(f)
  assert doc["displayTimeUnit"] == "ms"
  assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # Atomic write left no temp file.
  return doc["traceEvents"]


def test_chrome_trace_fields_and_times(tmp_path):
  tr = Tracer(origin=100.0)
  tr.add_span("sim", "env-0", 100.5, 100.75)
  tr.add_span("gen", "sampler", 101.0, 101.002)
  tr.instant("split", {"sim_groups": 3, "ratio": float("nan")}, t=102.0)
  events = _events(tr, tmp_path)
  xs = [e for e in events if e["ph"] == "X"]
  assert [(e["name"], e["ts"], e["dur"], e["pid"]) for e in xs] == [
      ("sim", 500_000.0, 250_000.0, 0), ("gen", 1_000_000.0, 2_000.0, 0)]
  assert all(e.keys() >= {"name", "ph", "ts", "dur", "pid", "tid"} for e in xs)
  (inst,) = [e for e in events if e["ph"] == "i"]
  assert inst["s"] == "g" and inst["ts"] == 2_000_000.0 and inst["name"] == "split"
  assert inst["args"] == {"sim_groups": 3, "ratio": None}  # NaN made JSON-safe.


def test_two_threads_get_two_named_tids(tmp_path):
  tr = Tracer()
  clock = StageClock(tr)

  def work(stage):
    for _ in range(3):
      with clock.stage(stage):
        pass

  threads = [threading.Thread(target=work, args=(s,), name=n) for s, n in (("sim", "env-0"), ("train", "learner"))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  events = _events(tr, tmp_path)
  names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
  assert sorted(names.values()) == ["env-0", "learner"]
  assert len(set(names)) == 2 and all(isinstance(t, int) and t > 0 for t in names)
  by_lane = {}
  for e in events:
    if e["ph"] == "X":
      by_lane.setdefault(names[e["tid"]], set()).add(e["name"])
  assert by_lane == {"env-0": {"sim"}, "learner": {"train"}}
  assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")


def test_bounded_memory_drops_oldest():
  tr = Tracer(max_spans=5)
  for i in range(8):
    tr.add_span("sim", "main", float(i), i + 0.5)
  spans = tr.spans()
  assert [s.start for s in spans] == [3.0, 4.0, 5.0, 6.0, 7.0]
  assert tr.dropped_spans == 3
  assert tr.chrome_events()["otherData"]["dropped_spans"] == 3


def test_spans_window_keeps_overlapping():
  tr = Tracer()
  for a, b in ((0.0, 1.0), (1.5, 2.5), (3.0, 4.0)):
    tr.add_span("gen", "main", a, b)
  assert tr.spans(since=2.0, until=3.5) == [Span("gen", "main", 1.5, 2.5), Span("gen", "main", 3.0, 4.0)]
  assert len(tr.spans()) == 3


def test_stage_clock_totals_and_optional_tracer():
  plain = StageClock()
  with plain.stage("sim"):
    time.sleep(0.01)
  assert plain.tracer is None and plain.snapshot()["sim"] >= 0.01
  assert set(STAGES) <= set(plain.snapshot())

  tr = Tracer()
  clock = StageClock(tr)
  for name in ("sim", "gen", "sim", "train", "other"):
    with clock.stage(name):
      time.sleep(0.002)
  with clock.stage("gen", lane="sampler"):
    pass
  totals, spans = clock.snapshot(), tr.spans()
  assert [s.name for s in spans] == ["sim", "gen", "sim", "train", "other", "gen"]
  assert [s.lane for s in spans] == [threading.current_thread().name] * 5 + ["sampler"]
  for name, total in totals.items():
    assert total == pytest.approx(sum(s.end - s.start for s in spans if s.name == name))
  assert all(s.end >= s.start for s in spans)


def _ebrl_like(t0: float, seconds: float) -> list[Span]:
  """Overlapping sim/gen/train lanes, as the ebrl scheduler's threads would record them."""
  spans, t = [], t0
  while t < t0 + seconds:
    for g in range(3):
      spans.append(Span("sim", f"env-group-{g}", t + 0.004 * g, t + 0.004 * g + 0.015))
    spans.append(Span("gen", "sampler", t + 0.002, t + 0.012))
    t += 0.02
  spans += [Span("train", "learner", t0 + k * 0.5, t0 + k * 0.5 + 0.35) for k in range(int(seconds / 0.5))]
  return spans + [Span("ckpt", "learner", t0 + 1.0, t0 + 1.1)]


def _sync_like(t0: float, seconds: float) -> list[Span]:
  spans, t = [], t0
  while t < t0 + seconds:
    for _ in range(16):
      spans += [Span("gen", "MainThread", t, t + 0.003), Span("sim", "MainThread", t + 0.003, t + 0.01)]
      t += 0.01
    spans.append(Span("train", "MainThread", t, t + 0.2))
    t += 0.2
  return spans


def _check_png(path: str) -> tuple[int, ...]:
  assert os.path.getsize(path) > 1000
  img = matplotlib.image.imread(path)
  assert img.ndim == 3 and img.shape[2] in (3, 4) and img.shape[0] >= 100 and img.shape[1] >= 500
  return img.shape


def test_timeline_png(tmp_path):
  path = os.path.join(tmp_path, "plots", "timeline.png")
  plots.timeline(_ebrl_like(50.0, 4.0), path, "ebrl", window_s=3.0)
  _check_png(path)
  empty = os.path.join(tmp_path, "plots", "empty.png")
  plots.timeline([], empty, "nothing traced")
  _check_png(empty)


def test_timelines_stacks_schedulers(tmp_path):
  path = os.path.join(tmp_path, "timelines.png")
  one = os.path.join(tmp_path, "one.png")
  plots.timelines({"sync": _sync_like(10.0, 4.0)}, one, window_s=2.0)
  plots.timelines({"sync": _sync_like(10.0, 4.0), "pipelined": _sync_like(900.0, 4.0),
                   "ebrl": _ebrl_like(3.0, 4.0)}, path, window_s=2.0)
  assert _check_png(path)[0] > _check_png(one)[0]  # Stacked figure is taller.
