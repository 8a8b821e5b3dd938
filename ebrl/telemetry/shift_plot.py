"""Throughput against the plan's prediction across a demand shift, drawn from metrics.jsonl.

A run whose workload changes mid-way (a slower sim, a heavier policy) shows
whether the controller noticed: measured env steps/s should fall, the
predicted rate should step to the re-plan, and the measured rate should come
back within 90% of the new prediction.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

_EVENT_COLORS = ("tab:red", "tab:purple", "tab:brown", "tab:olive", "tab:cyan")
_PRED_KEY = "controller_predicted_env_steps_per_s"


def demand_shift(rows: list[dict], events: list[dict], path: str, title: str) -> None:
  """Env steps/s over wall time, the predicted rate (dashed), 90% of it (dotted), and events.

  `rows` are metrics rows with wall_s and env_steps_per_s (and, once a
  controller runs, controller_predicted_env_steps_per_s); `events` are dicts
  with `t` (wall_s) and `label`, drawn as vertical markers.
  """
  folder = os.path.dirname(path)
  if folder:
    os.makedirs(folder, exist_ok=True)
  fig, ax = plt.subplots(figsize=(10, 4))
  rate = [(r["wall_s"], r["env_steps_per_s"]) for r in rows
          if r.get("wall_s") is not None and r.get("env_steps_per_s") is not None]
  pred = [(r["wall_s"], r[_PRED_KEY]) for r in rows
          if r.get("wall_s") is not None and r.get(_PRED_KEY) is not None]
  if rate:
    ax.plot(*zip(*rate), color="tab:blue", linestyle="-", label="measured env steps/s")
  if pred:
    xs, ys = zip(*pred)
    ax.step(xs, ys, where="post", color="black", linestyle="--", label="plan's prediction")
    ax.step(xs, [0.9 * y for y in ys], where="post", color="gray", linestyle=":",
            label="90% of prediction")
  if not rate and not pred:
    ax.text(0.5, 0.5, "no throughput rows", ha="center", va="center", transform=ax.transAxes)
  colors: dict[str, str] = {}
  for e in sorted(events, key=lambda e: e["t"]):
    label = str(e.get("label", "event"))
    first = label not in colors
    if first:
      colors[label] = _EVENT_COLORS[len(colors) % len(_EVENT_COLORS)]
    ax.axvline(e["t"], color=colors[label], linestyle="-.", linewidth=1.0, alpha=0.8,
               label=label if first else None)
    ax.annotate(label, (e["t"], 1.0), xycoords=("data", "axes fraction"), xytext=(2, -2),
                textcoords="offset points", rotation=90, va="top", fontsize=7, color=colors[label])
  ax.set_xlabel("wall seconds")
  ax.set_ylabel("env steps/s")
  top = max([y for _, y in rate + pred], default=0.0)
  if top > 0:
    ax.set_ylim(0, 1.25 * top)  # Headroom for the event labels above the curves.
  else:
    ax.set_ylim(bottom=0)
  ax.grid(alpha=0.3)
  ax.set_title(title, loc="left", fontsize=10)
  if ax.get_legend_handles_labels()[0]:
    ax.legend(loc="lower left", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
