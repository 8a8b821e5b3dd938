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


def success_by_task(final: dict[str, float | None], best: dict[str, float | None], path: str, title: str) -> None:
  """One horizontal bar per task: its final success rate (over its last 100 episodes), the best
  that window reached at an update marked beside it; a task with no finished episode says so."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tasks = list(final)
  fig, ax = plt.subplots(figsize=(8, 1.2 + 0.22 * max(1, len(tasks))))
  rows = range(len(tasks))
  ax.barh(rows, [final[t] or 0.0 for t in tasks], color="tab:blue", label="final")
  marks = [(i, best[t]) for i, t in enumerate(tasks) if best.get(t) is not None]
  if marks:
    ax.scatter([b for _, b in marks], [i for i, _ in marks], marker="|", s=120, color="tab:orange", zorder=3,
               label="best")
  for i, t in enumerate(tasks):
    ax.annotate("no episode yet" if final[t] is None else f"{final[t]:.2f}", (1.0, i),
                xycoords=("axes fraction", "data"), xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
  ax.set_yticks(list(rows), tasks, fontsize=8 if len(tasks) <= 20 else 6)
  ax.set_ylim(len(tasks) - 0.5, -0.5)  # First task on top.
  ax.set_xlim(0.0, 1.0)
  ax.set_xlabel("success rate (each task's last 100 episodes)")
  ax.grid(axis="x", alpha=0.3)
  ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=7, frameon=False)  # Above the bars.
  ax.set_title(title, loc="left", fontsize=10)
  fig.tight_layout(rect=(0, 0, 0.93, 1))
  fig.savefig(path, dpi=100)
  plt.close(fig)


# -- stage timelines -----------------------------------------------------------

STAGE_COLORS = {"sim": "tab:blue", "gen": "tab:orange", "train": "tab:green"}
_EXTRA_COLORS = ("tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:red")
_FALLBACK_COLOR = "tab:gray"
_ROW_H = 0.35  # Figure inches per lane.


def _color(stage: str, extras: dict[str, str]) -> str:
  if stage in STAGE_COLORS:
    return STAGE_COLORS[stage]
  if stage not in extras:
    extras[stage] = _EXTRA_COLORS[len(extras)] if len(extras) < len(_EXTRA_COLORS) else _FALLBACK_COLOR
  return extras[stage]


def _window(spans, window_s: float, end: float | None) -> tuple[float, float, list]:
  """(lo, hi, spans clipped to [lo, hi]) with hi = end or the last span's end."""
  hi = end if end is not None else max((s[3] for s in spans), default=0.0)
  lo = hi - window_s
  clipped = [(n, l, max(a, lo), min(b, hi)) for n, l, a, b in spans if b >= lo and a <= hi]
  return lo, hi, clipped


def _lane_order(clipped) -> list[str]:
  """Lanes grouped by their busiest stage (sim, gen, train, others), then by name.

  Sorting by name puts env groups 0..N together; numbers compare as numbers so
  group-10 follows group-9.
  """
  busy: dict[str, dict[str, float]] = {}
  for n, l, a, b in clipped:
    busy.setdefault(l, {}).setdefault(n, 0.0)
    busy[l][n] += b - a
  rank = {s: i for i, s in enumerate(STAGE_COLORS)}
  def key(lane):
    top = max(busy[lane], key=busy[lane].get)
    natural = [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in _split_digits(lane)]
    return (rank.get(top, len(rank)), top, natural)
  return sorted(busy, key=key)


def _split_digits(s: str) -> list[str]:
  out, cur = [], ""
  for ch in s:
    if cur and ch.isdigit() != cur[-1].isdigit():
      out.append(cur)
      cur = ""
    cur += ch
  return out + [cur] if cur else out


def _draw_timeline(ax, spans, window_s: float, end: float | None, extras: dict[str, str]) -> set[str]:
  """One Gantt row per lane on `ax`, x in seconds from the window start; returns stages drawn."""
  lo, _, clipped = _window(list(spans), window_s, end)
  ax.set_xlim(0.0, window_s)
  if not clipped:
    ax.text(0.5, 0.5, "no stage spans in this window", ha="center", va="center", transform=ax.transAxes)
    ax.set_yticks([])
    return set()
  lanes = _lane_order(clipped)
  row = {l: i for i, l in enumerate(lanes)}
  bars: dict[tuple[str, str], list[tuple[float, float]]] = {}
  busy: dict[str, dict[str, float]] = {l: {} for l in lanes}
  for n, l, a, b in clipped:
    bars.setdefault((l, n), []).append((a - lo, b - a))
    busy[l][n] = busy[l].get(n, 0.0) + b - a
  stages = set()
  for (l, n), xr in bars.items():
    ax.broken_barh(xr, (row[l] - 0.4, 0.8), facecolors=_color(n, extras), linewidth=0)
    stages.add(n)
  ax.set_yticks(range(len(lanes)), lanes)
  ax.set_ylim(len(lanes) - 0.5, -0.5)  # First lane on top.
  for l in lanes:  # Busy share of the window, per stage, right of each row.
    share = "  ".join(f"{n} {v / window_s:.0%}" for n, v in sorted(busy[l].items(), key=lambda kv: -kv[1]))
    ax.annotate(share, (1.0, row[l]), xycoords=("axes fraction", "data"), xytext=(4, 0),
                textcoords="offset points", va="center", fontsize=7)
  ax.grid(axis="x", alpha=0.3)
  return stages


def _legend(fig, stages: set[str], extras: dict[str, str]) -> None:
  from matplotlib.patches import Patch  # pylint: disable=g-import-not-at-top
  order = [s for s in STAGE_COLORS if s in stages] + sorted(stages - set(STAGE_COLORS))
  if order:
    fig.legend(handles=[Patch(color=_color(s, extras), label=s) for s in order], loc="upper right",
               ncol=len(order), fontsize=8, frameon=False)


def timeline(spans, path: str, title: str, window_s: float = 3.0, end: float | None = None) -> None:
  """Gantt chart of stage spans per lane over the last `window_s` seconds before `end`.

  `spans` are (name, lane, start, end) tuples in perf_counter seconds (Tracer.spans());
  `end` defaults to the last span's end.
  """
  spans = list(spans)
  lanes = len({s[1] for s in spans})
  fig, ax = plt.subplots(figsize=(11, 1.4 + _ROW_H * max(1, lanes)))
  extras: dict[str, str] = {}
  stages = _draw_timeline(ax, spans, window_s, end, extras)
  ax.set_xlabel(f"seconds (last {window_s:g} s)")
  ax.set_title(title, loc="left", fontsize=10)
  _legend(fig, stages, extras)
  _save(fig, path)


def timelines(named_spans: dict[str, list], path: str, window_s: float = 3.0) -> None:
  """Several runs' timelines stacked on one shared x scale (one subplot per run).

  Each run is drawn over the last `window_s` seconds of its own spans, so
  schedulers that ran at different times line up.
  """
  named = {k: list(v) for k, v in named_spans.items()}
  if not named:
    named = {"(no runs)": []}
  heights = [max(1, len({s[1] for s in v})) for v in named.values()]
  fig, axes = plt.subplots(len(named), 1, sharex=True, squeeze=False,
                           figsize=(11, 1.0 + sum(0.6 + _ROW_H * h for h in heights)),
                           gridspec_kw={"height_ratios": [h + 1.5 for h in heights]})
  extras: dict[str, str] = {}
  stages: set[str] = set()
  for ax, (name, spans) in zip(axes[:, 0], named.items()):
    stages |= _draw_timeline(ax, spans, window_s, None, extras)
    ax.set_title(name, loc="left", fontsize=10)
  axes[-1, 0].set_xlabel(f"seconds (last {window_s:g} s of each run)")
  _legend(fig, stages, extras)
  _save(fig, path)


def _save(fig, path: str) -> None:
  folder = os.path.dirname(path)
  if folder:
    os.makedirs(folder, exist_ok=True)
  fig.tight_layout(rect=(0, 0, 0.9, 0.97))
  fig.savefig(path, dpi=100)
  plt.close(fig)
