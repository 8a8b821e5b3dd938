"""Metric sinks of a run: metrics.jsonl and TensorBoard event files.

TensorBoard events are written with TensorBoard's own event writer and summary
protos, so no TensorFlow is needed. A row's dict value (e.g.
`success_rate_by_task`) stays one JSON object in metrics.jsonl and becomes one
TensorBoard tag per entry (`success_rate_by_task/Reach-v3`), so TensorBoard
draws each task's curve.
"""

from __future__ import annotations

import json
import math
import os
import time

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter


def _jsonable(v):
  if isinstance(v, float) and not math.isfinite(v):
    return None
  if isinstance(v, dict):
    return {k: _jsonable(x) for k, x in v.items()}
  return v


def _scalars(row: dict) -> list[tuple[str, float]]:
  """(tag, value) of every finite number in `row`, a dict's entries tagged `key/entry`."""
  out = []
  for k, v in row.items():
    items = [(f"{k}/{e}", x) for e, x in v.items()] if isinstance(v, dict) else [(k, v)]
    out += [(tag, float(x)) for tag, x in items
            if isinstance(x, (int, float)) and math.isfinite(float(x))]
  return out


class MetricsWriter:
  """Appends one JSON object per log interval and mirrors scalars to TensorBoard."""

  def __init__(self, workdir: str):
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", buffering=1)
    self._tb = EventFileWriter(os.path.join(workdir, "tb"))

  def write(self, row: dict, step_key: str = "env_steps") -> None:
    """`row[step_key]` is the TensorBoard step (a run's env steps; pre-training's gradient steps)."""
    self._jsonl.write(json.dumps({k: _jsonable(v) for k, v in row.items()}) + "\n")
    step = int(row[step_key])
    values = [summary_pb2.Summary.Value(tag=tag, simple_value=v) for tag, v in _scalars(row)]
    self._tb.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)))

  def close(self) -> None:
    self._jsonl.close()
    self._tb.close()


def write_json(path: str, obj: dict) -> None:
  """Writes JSON atomically (temp file + rename), so readers never see half a file."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump({k: _jsonable(v) for k, v in obj.items()} if isinstance(obj, dict) else obj, f, indent=2)
  os.replace(tmp, path)


def read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
