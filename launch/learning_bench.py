"""Side-by-side learning benchmark: EBRL and a peer PPO on the same tasks, back to back.

  python -m launch.learning_bench --tasks=Reach-v3,DrawerClose-v3 --seeds=0,1 \
      --peer_python=peers-venv/bin/python --peer_script=peers/sb3_ppo_metaworld.py \
      --out=learning/learning.json

For each MetaWorld task (goal-observable, one task alone: the MT1 convention)
and seed it trains EBRL (`launch.train` with the default config and any
`--config.*` overrides, once per `--schedulers` entry) and the peer harness
(Stable-Baselines3 PPO over the same EnvPool envs, run in its own interpreter),
one run at a time: two runs at once would share the cores and both be slower.

Success is per episode (MetaWorld's `success` at any step), over a window of
the last 100 finished episodes. Reported per run: the first wall time and env
steps at which that window reached `--target` (EBRL: from launch, imports and
compiles included; the peer: from the start of its `learn()`, with its set-up
time beside it), the window over the run's last 100 episodes, the best window,
and end-to-end env steps/s. One JSON holds every run plus a per-task verdict,
and `<out dir>/<task>.png` plots both systems' success against wall time and
against env steps.

The benchmark is resumable: each run's result is kept in `<out dir>/runs/` as
it finishes, and a later call with the same flags only does what is missing
(`--rerun` does everything again).
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import time

from absl import flags

from launch import common

_TASKS = flags.DEFINE_list("tasks", ["Reach-v3"], "MetaWorld task names (without 'MetaWorld/'); 'all' = the 50 "
                           "tasks EnvPool registers (MT50's).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "Seeds; every system runs each.")
_STEPS = flags.DEFINE_integer("steps", 600_000, "Env steps per run.")
_SCHEDULERS = flags.DEFINE_list("schedulers", ["sync"], "EBRL schedulers to run (each a system); empty = "
                                "the peer only (its runs are kept for later calls).")
_PEER_PYTHON = flags.DEFINE_string("peer_python", None, "Interpreter of the peer's virtual environment "
                                   "(see shared/peers/README.md); unset = EBRL only.")
_PEER_SCRIPT = flags.DEFINE_string("peer_script", None, "The peer harness, sb3_ppo_metaworld.py.")
_PEER_SEEDS = flags.DEFINE_list("peer_seeds", None, "Seeds for the peer (default: --seeds).")
_PEER_MINUTES = flags.DEFINE_float("peer_minutes", 15.0, "Wall cap of one peer run.")
_TARGET = flags.DEFINE_float("target", 0.9, "Success over 100 episodes that counts as solved.")
_STEPS_RATIO = flags.DEFINE_float("steps_ratio", 1.25, "A system matches the peer on a task the peer solves when "
                                  "every seed reaches --target, ends at it, and its median env steps to it are at "
                                  "most this many times the peer's median.")
_OUT = flags.DEFINE_string("out", "learning/learning.json", "The JSON; plots and runs/ go beside it.")
_RERUN = flags.DEFINE_bool("rerun", False, "Run everything again instead of reusing finished runs.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Run nothing: the table and JSON of the runs already "
                                 "finished (a long sweep's state; a task or seed not run yet is left out).")
_CONFIG_FILE = flags.DEFINE_string("config_file", None, "A run config file for every EBRL run (launch.train's "
                                    "--config), e.g. launch/configs/sb3_ppo.py; default: the default config.")
_CONFIG_OVERRIDES = flags.DEFINE_multi_string(
    "override", [], "A --config.<key>=<value> flag passed to every EBRL run (repeatable), e.g. "
    "--override=--config.algorithm.epochs=4.")

WINDOW = 100  # Episodes in the success window (EBRL's EpisodeTracker and the acceptance's).
CURVE_POINTS = 300  # Points per run kept in the JSON (plots need no more).


def _tasks() -> list[str]:
  from sim_adapters import metaworld_tasks
  return list(metaworld_tasks()) if _TASKS.value == ["all"] else list(_TASKS.value)


def _check_flags() -> tuple[list[int], list[int]]:
  """Every flag, and the output path, before the first run (a late error would waste them)."""
  from ebrl.validation import SCHEDULERS
  from sim_adapters import UnknownEnvError, check_env_name
  for task in _tasks():
    try:
      check_env_name(f"MetaWorld/{task}")
    except UnknownEnvError as e:
      common.fail(f"--tasks: {e}")
  seeds = _int_list("seeds", _SEEDS.value)
  peer_seeds = _int_list("peer_seeds", _PEER_SEEDS.value) if _PEER_SEEDS.value is not None else seeds
  if _STEPS.value <= 0:
    common.fail(f"--steps={_STEPS.value} must be a positive number of env steps")
  for s in _SCHEDULERS.value:
    if s not in SCHEDULERS or s == "random":
      common.fail(f"--schedulers: '{s}' is not a learning scheduler; valid: sync, pipelined, ebrl")
  if not math.isfinite(_STEPS_RATIO.value) or _STEPS_RATIO.value <= 0:
    common.fail(f"--steps_ratio={_STEPS_RATIO.value} must be a positive number")
  if not 0 < _TARGET.value <= 1 or not math.isfinite(_PEER_MINUTES.value) or _PEER_MINUTES.value <= 0:
    common.fail(f"--target={_TARGET.value} must be in (0, 1] and --peer_minutes={_PEER_MINUTES.value} positive")
  if (_PEER_PYTHON.value is None) != (_PEER_SCRIPT.value is None):
    common.fail("--peer_python and --peer_script go together (the peer's interpreter and its harness)")
  for name, path in (("peer_python", _PEER_PYTHON.value), ("peer_script", _PEER_SCRIPT.value)):
    if path is not None and not os.path.isfile(path):
      common.fail(f"--{name}='{path}' is not a file; see shared/peers/README.md for the peer's set-up")
  if _CONFIG_FILE.value is not None:
    try:
      common.check_config_file("config_file", _CONFIG_FILE.value)
    except common.UserError as e:
      common.fail(str(e))
  for o in _CONFIG_OVERRIDES.value:
    if not o.startswith("--config."):
      common.fail(f"--override='{o}' must be a --config.<key>=<value> flag")
  common.check_output_file("out", _OUT.value)
  return seeds, peer_seeds


def _int_list(name: str, values: list[str]) -> list[int]:
  try:
    out = [int(v) for v in values]
  except ValueError:
    common.fail(f"--{name}={','.join(values)} must be integers")
  if not out or any(v < 0 for v in out):
    common.fail(f"--{name}={','.join(values)} must be one or more integers >= 0")
  return out


# ----------------------------------------------------------------------------- success curves


def first_reach(points: list[tuple[float, int, float]], target: float) -> tuple[float, int] | None:
  """(wall s, env steps) of the first point whose success window is >= target."""
  for t, steps, sr in points:
    if sr >= target:
      return t, steps
  return None


def episode_windows(successes: list[float], times: list[float], steps: list[int]) -> list[tuple[float, int, float]]:
  """Success over the last WINDOW episodes after each episode, from the first full window on."""
  out, total = [], 0.0
  for i, s in enumerate(successes):
    total += s
    if i >= WINDOW:
      total -= successes[i - WINDOW]
    if i + 1 >= WINDOW:
      out.append((times[i], steps[i], total / WINDOW))
  return out


def _summarise(points, target: float, final: float | None, sps: float, extra: dict) -> dict:
  """The figures of one run, from its full curve; the curve kept is thinned to CURVE_POINTS."""
  hit = first_reach(points, target)
  stride = max(1, math.ceil(len(points) / CURVE_POINTS))
  kept = points[::stride] + ([points[-1]] if points and (len(points) - 1) % stride else [])
  return {"time_to_target_s": hit[0] if hit else None, "env_steps_to_target": hit[1] if hit else None,
          "final_success": final, "best_success": max((p[2] for p in points), default=None),
          "env_steps_per_s": sps, "curve": [[round(t, 2), s, round(sr, 4)] for t, s, sr in kept], **extra}


# ----------------------------------------------------------------------------- runs


def run_ebrl(task: str, seed: int, scheduler: str, workdir: str) -> dict:
  """One launch.train run in a fresh process, read back from its summary and metrics."""
  if os.path.exists(workdir):  # No figures were cached for it: a run cut short (a stopped sweep); start it again.
    print(f"[learning_bench] removing the unfinished run {workdir}", flush=True)
    shutil.rmtree(workdir)
  config = [f"--config={_CONFIG_FILE.value}"] if _CONFIG_FILE.value else []
  cmd = [sys.executable, "-m", "launch.train", *config, f"--workdir={workdir}", "--progress=false",
         f"--config.env.name=MetaWorld/{task}", f"--config.seed={seed}", f"--config.scheduler={scheduler}",
         f"--config.total_env_steps={_STEPS.value}", *_CONFIG_OVERRIDES.value]
  start = time.time()
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if proc.returncode:
    raise RuntimeError(f"EBRL run {task} seed {seed} failed: {proc.stderr.strip().splitlines()[-1:]}")
  from ebrl.telemetry.writers import read_jsonl
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  points = [(r["wall_s"], r["env_steps"], r["success_rate"]) for r in rows
            if r.get("success_rate") is not None and r.get("episodes", 0) >= WINDOW]
  out = _summarise(points, _TARGET.value, summary["final_success_rate"], summary["env_steps_per_s"],
                   {"process_wall_s": time.time() - start, "startup_s": summary.get("startup_s"),
                    "workdir": workdir})
  # The run's own (per-update) first crossing is finer than the 2 s metrics rows.
  if summary.get("time_to_success_s") is not None and summary["target_success"] == _TARGET.value:
    out["time_to_target_s"], out["env_steps_to_target"] = summary["time_to_success_s"], summary["env_steps_to_success"]
  return out


def run_peer(task: str, seed: int, logdir: str) -> dict:
  """One peer harness run; its episode CSV (written beside the script) is moved into logdir."""
  tag = f"learnbench_{task}_s{seed}"
  cmd = [_PEER_PYTHON.value, _PEER_SCRIPT.value, "--env", f"MetaWorld/{task}", "--net", "64", "64",
         "--total-steps", str(_STEPS.value), "--max-minutes", str(_PEER_MINUTES.value), "--seed", str(seed),
         "--tag", tag]
  start = time.time()
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if proc.returncode:
    raise RuntimeError(f"peer run {task} seed {seed} failed: {proc.stderr.strip().splitlines()[-1:]}")
  csv_path = os.path.join(os.path.dirname(os.path.abspath(_PEER_SCRIPT.value)), "logs", f"{tag}_episodes.csv")
  with open(csv_path) as f:
    rows = list(csv.DictReader(f))
  os.makedirs(logdir, exist_ok=True)
  os.replace(csv_path, os.path.join(logdir, f"{tag}_episodes.csv"))
  times = [float(r["t_sec"]) for r in rows]
  steps = [int(r["env_steps"]) for r in rows]
  succ = [float(r["success_any"]) for r in rows]
  points = episode_windows(succ, times, steps)
  final = sum(succ[-WINDOW:]) / WINDOW if len(succ) >= WINDOW else None
  setup = _printed(proc.stdout, "setup=", "s")
  learn_s, total = _printed(proc.stdout, "learn() wall=", "s"), _printed(proc.stdout, "env_steps=", " ")
  return _summarise(points, _TARGET.value, final, (total or 0) / max(learn_s or 1e-9, 1e-9),
                    {"setup_s": setup, "learn_wall_s": learn_s, "process_wall_s": time.time() - start})


def _printed(stdout: str, key: str, end: str) -> float | None:
  """A number the harness printed after `key` (its summary lines)."""
  for line in stdout.splitlines():
    if key in line:
      rest = line.split(key, 1)[1]
      try:
        return float(rest.split(end, 1)[0])
      except ValueError:
        continue
  return None


def _cached(path: str, label: str, make) -> dict | None:
  """A finished run's figures from its JSON, else it runs now (None under --report_only)."""
  if not _REPORT_ONLY.value:
    print(f"[learning_bench] {label}", flush=True)
  if os.path.exists(path) and not _RERUN.value:
    with open(path) as f:
      return json.load(f)
  if _REPORT_ONLY.value:
    return None
  result = make()
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(result, f)
  os.replace(tmp, path)
  return result


# ----------------------------------------------------------------------------- report


def median_time(runs: dict) -> float | None:
  """Median time to target over seeds; a seed that never got there counts as later than any that
  did (None when half or more never did). Two systems running the same algorithm differ per seed
  by a whole batch of episodes, so the median says which is faster where one seed cannot."""
  times = sorted(float("inf") if r["time_to_target_s"] is None else r["time_to_target_s"] for r in runs.values())
  if not times:
    return None
  n = len(times)
  mid = times[n // 2] if n % 2 else (times[n // 2 - 1] + times[n // 2]) / 2
  return None if mid == float("inf") else mid


def median_steps(runs: dict) -> float | None:
  """Median env steps to target over seeds, a seed that never got there counting as later than any
  that did (None when half or more never did)."""
  return median_time({s: {"time_to_target_s": r["env_steps_to_target"]} for s, r in runs.items()})


def verdict(task_runs: dict, target: float, steps_ratio: float = 1.25) -> dict:
  """Per EBRL system, against the peer. A task the peer solves (any seed) needs every EBRL seed to
  reach the target no later in wall time than the peer's run of the same seed (run back to back;
  the peer's seed 0 where it ran one seed, and a peer seed that never reached it counts as 'no
  later'), and to end at >= target: `meets`. In samples (`meets_steps`): every seed reaches the
  target and ends at it, and the median env steps to it are at most `steps_ratio` times the
  peer's median. The medians over seeds are reported beside them."""
  peer = task_runs.get("sb3", {})
  peer_times = {s: r["time_to_target_s"] for s, r in peer.items()}
  solved = [t for t in peer_times.values() if t is not None]
  peer_steps = median_steps(peer) if peer else None
  out = {"peer_solved": bool(solved), "peer_time_to_target_s": peer_times,
         "peer_median_time_to_target_s": median_time(peer), "peer_median_env_steps_to_target": peer_steps}
  for system, runs in task_runs.items():
    if system == "sb3":
      continue
    times = {s: r["time_to_target_s"] for s, r in runs.items()}
    finals = [r["final_success"] for r in runs.values()]
    reached = all(t is not None for t in times.values())
    held = all(f is not None and f >= target for f in finals)
    bar = lambda s: peer_times.get(s, peer_times.get("0", min(solved) if solved else None))
    faster = reached and all(bar(s) is None or t <= bar(s) for s, t in times.items())
    steps = median_steps(runs)
    ratio = steps / peer_steps if steps is not None and peer_steps else None
    out[system] = {"reached_every_seed": reached, "final_at_target_every_seed": held,
                   "no_later_than_peer": faster if solved else None,
                   "median_time_to_target_s": median_time(runs),
                   "meets": (reached and held and faster) if solved else None,
                   "median_env_steps_to_target": steps, "steps_ratio": ratio,
                   "meets_steps": (reached and held and ratio is not None and ratio <= steps_ratio)
                                  if peer_steps is not None else None}
  return out


def plot_task(task: str, task_runs: dict, path: str, target: float) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  colors = {"sb3": "tab:gray"}
  palette = iter(["tab:blue", "tab:orange", "tab:green", "tab:red"])
  for system, runs in task_runs.items():
    color = colors.setdefault(system, next(palette))
    for i, (seed, r) in enumerate(sorted(runs.items())):
      pts = r["curve"]
      label = f"{'SB3 PPO' if system == 'sb3' else 'EBRL ' + system}" if i == 0 else None
      style = ["-", "--", ":", "-."][i % 4]
      axes[0].plot([p[0] for p in pts], [p[2] for p in pts], style, color=color, label=label)
      axes[1].plot([p[1] for p in pts], [p[2] for p in pts], style, color=color, label=label)
  for ax, xlabel in zip(axes, ("wall s (EBRL from launch, SB3 from learn())", "env steps")):
    ax.axhline(target, color="k", lw=0.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"success, last {WINDOW} episodes")
    ax.set_ylim(-0.02, 1.02)
  axes[0].legend(loc="lower right")
  fig.suptitle(f"MetaWorld/{task} (seeds: line styles)")
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}")
  seeds, peer_seeds = _check_flags()
  out_dir = os.path.dirname(os.path.abspath(_OUT.value))
  runs_dir = os.path.join(out_dir, "runs")
  os.makedirs(runs_dir, exist_ok=True)
  results: dict = {}
  for task in _tasks():
    task_runs = results.setdefault(task, {})
    for scheduler in _SCHEDULERS.value:
      for seed in seeds:
        name = f"{task}_{scheduler}_s{seed}"
        run = _cached(os.path.join(runs_dir, name + ".json"), f"EBRL {scheduler} {task} seed {seed}",
                      lambda: run_ebrl(task, seed, scheduler, os.path.join(runs_dir, name)))
        if run is not None:
          task_runs.setdefault(scheduler, {})[str(seed)] = run
    if _PEER_PYTHON.value or _REPORT_ONLY.value:
      for seed in peer_seeds:
        run = _cached(os.path.join(runs_dir, f"{task}_sb3_s{seed}.json"), f"SB3 PPO {task} seed {seed}",
                      lambda: run_peer(task, seed, runs_dir))
        if run is not None:
          task_runs.setdefault("sb3", {})[str(seed)] = run
    if not task_runs:
      del results[task]
      continue
    plot_task(task, task_runs, os.path.join(out_dir, f"{task}.png"), _TARGET.value)
  report = {"date": datetime.date.today().isoformat(), "machine": common.machine_info(), "steps": _STEPS.value,
            "target": _TARGET.value, "window_episodes": WINDOW, "config_file": _CONFIG_FILE.value,
            "overrides": _CONFIG_OVERRIDES.value,
            "steps_ratio": _STEPS_RATIO.value,
            "verdicts": {t: verdict(r, _TARGET.value, _STEPS_RATIO.value) for t, r in results.items()},
            "runs": results}
  tmp = _OUT.value + ".tmp"
  with open(tmp, "w") as f:
    json.dump(report, f, indent=1)
  os.replace(tmp, _OUT.value)
  _print_table(results, report["verdicts"])
  print()
  for line in task_table(results, report["verdicts"]):
    print(line)
  print()
  for line in seed_table(results, _TARGET.value, _STEPS_RATIO.value):
    print(line)
  print(f"wrote {_OUT.value} and {len(results)} plots in {out_dir}")


def _print_table(results: dict, verdicts: dict) -> None:
  """The table BENCHMARKS.md keeps, as markdown."""
  fmt = lambda v, d=1: "-" if v is None else f"{v:,.{d}f}"
  print("| task | system | seed | time to target (s; SB3 from learn()) | env steps to target | final (last 100) | best | env steps/s |")
  print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
  for task, task_runs in results.items():
    for system, runs in task_runs.items():
      for seed, r in sorted(runs.items()):
        steps = r["env_steps_to_target"]
        t = r["time_to_target_s"]
        if system == "sb3" and t is not None and r.get("learn_wall_s"):  # Its imports and set-up too.
          t_launch = t + r["process_wall_s"] - r["learn_wall_s"]
          shown = f"{t:,.1f} ({t_launch:,.1f} from launch)"
        else:
          shown = fmt(t)
        print(f"| {task} | {'SB3 PPO' if system == 'sb3' else 'EBRL ' + system} | {seed} | "
              f"{shown} | {'-' if steps is None else f'{steps:,}'} | "
              f"{fmt(r['final_success'], 2)} | {fmt(r['best_success'], 2)} | {fmt(r['env_steps_per_s'], 0)} |")
  print()
  for task, v in verdicts.items():
    judged = {k: x["meets"] for k, x in v.items() if isinstance(x, dict) and "meets" in x}
    medians = {k: x["median_time_to_target_s"] for k, x in v.items() if isinstance(x, dict) and "meets" in x}
    medians["sb3"] = v["peer_median_time_to_target_s"]
    shown = {k: None if m is None else round(m, 1) for k, m in medians.items()}
    print(f"{task}: peer solved {v['peer_solved']}; meets: {judged}; median time to target (s): {shown}")


def task_table(results: dict, verdicts: dict) -> list[str]:
  """One row per task, in samples: each system's env steps to the target and final success per
  seed, the ratio of the medians to the peer's and the verdict (what BENCHMARKS.md keeps for
  sweeps over many tasks)."""
  systems = sorted({s for runs in results.values() for s in runs if s != "sb3"})
  k = lambda v: "never" if v is None else f"{v / 1000:,.0f}k"
  f = lambda v: "-" if v is None else f"{v:.2f}"
  lines = ["| task | SB3: env steps to target | SB3 final | " + " | ".join(
      f"EBRL {s}: env steps to target | EBRL {s} final | ratio | verdict" for s in systems) + " |",
           "| --- | ---: | ---: | " + " | ".join("---: | ---: | ---: | ---" for _ in systems) + " |"]
  for task, runs in results.items():
    peer, v = runs.get("sb3", {}), verdicts[task]
    row = [task, " / ".join(k(r["env_steps_to_target"]) for _, r in sorted(peer.items())) or "-",
           " / ".join(f(r["final_success"]) for _, r in sorted(peer.items())) or "-"]
    for system in systems:
      own, sv = runs.get(system, {}), v.get(system, {})
      if not own:
        said = "not run"
      elif not peer:
        said = "peer not run"
      elif sv.get("meets_steps") is None:
        said = "EBRL solves, SB3 does not" if sv.get("reached_every_seed") else "neither solves"
      else:
        said = "meets" if sv["meets_steps"] else "short of the peer"
        if len(own) < 2:
          said += f" ({len(own)} seed)"  # The acceptance counts two.
      ratio = sv.get("steps_ratio")
      row += [" / ".join(k(r["env_steps_to_target"]) for _, r in sorted(own.items())) or "-",
              " / ".join(f(r["final_success"]) for _, r in sorted(own.items())) or "-",
              "-" if ratio is None else f"{ratio:.2f}", said]
    lines.append("| " + " | ".join(row) + " |")
  return lines


def held(runs: dict, target: float) -> str:
  """'k/n': of n seeds, k reached the target and ended at it (the acceptance's test of one seed)."""
  ok = sum(r["env_steps_to_target"] is not None and (r["final_success"] or 0.0) >= target for r in runs.values())
  return f"{ok}/{len(runs)}"


def seed_table(results: dict, target: float, steps_ratio: float = 1.25) -> list[str]:
  """One row per task the peer solves, over every seed run: how many seeds of each system reached
  the target and held it, their median env steps to it, and the peer judged against itself by the
  same bar as EBRL (its seeds after 0 against its seed 0). Two runs of one algorithm differ per
  seed; this says how often the per-seed bar fails where nothing differs but the seed."""
  systems = sorted({s for runs in results.values() for s in runs if s != "sb3"})
  k = lambda v: "never" if v is None else f"{v / 1000:,.0f}k"
  lines = ["| task | SB3 seeds held | SB3 median | " + " | ".join(
      f"EBRL {s} seeds held | EBRL {s} median" for s in systems) + " | SB3's later seeds against its seed 0 |",
           "| --- | ---: | ---: | " + " | ".join("---: | ---:" for _ in systems) + " | --- |"]
  for task, runs in results.items():
    peer = runs.get("sb3", {})
    if not any(r["env_steps_to_target"] is not None for r in peer.values()):
      continue
    row = [task, held(peer, target), k(median_steps(peer))]
    for system in systems:
      own = runs.get(system, {})
      row += [held(own, target), k(median_steps(own))] if own else ["-", "-"]
    later = {s: r for s, r in peer.items() if s != "0"}
    if "0" not in peer or not later:
      row.append("-")
    else:
      v = verdict({"sb3": {"0": peer["0"]}, "self": later}, target, steps_ratio)["self"]
      said = "meets" if v["meets_steps"] else "short"
      ratio = v["steps_ratio"]
      row.append(f"{said} ({'-' if ratio is None else f'{ratio:.2f}'}; {len(later)} seed{'s' * (len(later) > 1)})")
    lines.append("| " + " | ".join(row) + " |")
  return lines


if __name__ == "__main__":
  common.run(main)
