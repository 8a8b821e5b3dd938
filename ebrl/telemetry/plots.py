"""PNG plots of a run, drawn from metrics.jsonl after it ends."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top


def learning_curve(rows: list[dict], path: str, title: str) -> None:
  """Success rate and episode return against env steps (and wall time on top)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  steps = [r["env_steps"] for r in rows]
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
  for ax, key, label in ((axes[0], "success_rate", "success rate (last 100 episodes)"),
                         (axes[1], "episode_return", "episode return (last 100 episodes)")):
    ys = [r.get(key) for r in rows]
    pts = [(s, y) for s, y in zip(steps, ys) if y is not None]
    if pts:
      ax.plot(*zip(*pts), marker=".")
    else:
      ax.text(0.5, 0.5, "no signal for this task", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("env steps")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
