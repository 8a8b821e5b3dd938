"""launch.learning_bench: the success windows, the verdict, and its flag errors.

The full benchmark trains for minutes per run; here its figures are checked on
hand-made episode logs, and its mistakes on the command line it would get.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from launch import learning_bench as lb

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_episode_windows_start_at_a_full_window_and_slide():
  succ = [0.0] * 50 + [1.0] * 150
  times = [float(i) for i in range(200)]
  steps = [500 * (i + 1) for i in range(200)]
  points = lb.episode_windows(succ, times, steps)
  assert len(points) == 200 - lb.WINDOW + 1
  assert points[0] == (99.0, 50_000, 0.5)  # Episodes 0-99: 50 of them succeeded.
  assert points[-1][2] == 1.0
  # The first window at >= 0.9: episodes 40..139 hold 90 successes.
  assert lb.first_reach(points, 0.9) == (139.0, 70_000)
  assert lb.first_reach(points[:10], 0.9) is None


def _run(t, final, steps=1000):
  return {"time_to_target_s": t, "final_success": final, "env_steps_to_target": steps if t else None}


def test_the_samples_verdict_compares_median_env_steps_against_the_ratio():
  """meets_steps: every seed reaches the target and ends at it, and the median env steps to it are
  at most steps_ratio x the peer's median (a seed that never got there is later than any that did)."""
  peer = {"0": _run(30.0, 0.95, steps=200_000)}
  ok = {"sync": {"0": _run(40.0, 0.95, steps=240_000), "1": _run(45.0, 0.92, steps=260_000)}, "sb3": peer}
  v = lb.verdict(ok, 0.9, steps_ratio=1.25)
  assert v["peer_median_env_steps_to_target"] == 200_000
  assert v["sync"]["median_env_steps_to_target"] == 250_000 and v["sync"]["steps_ratio"] == 1.25
  assert v["sync"]["meets_steps"] is True and v["sync"]["meets"] is False  # Later in wall time.
  assert lb.verdict(ok, 0.9, steps_ratio=1.2)["sync"]["meets_steps"] is False
  one_short = {"sync": {"0": _run(40.0, 0.95, steps=100_000), "1": _run(None, 0.3)}, "sb3": peer}
  assert lb.verdict(one_short, 0.9)["sync"]["meets_steps"] is False  # Every seed must get there.
  dips = {"sync": {"0": _run(40.0, 0.95, steps=100_000), "1": _run(45.0, 0.85, steps=100_000)}, "sb3": peer}
  assert lb.verdict(dips, 0.9)["sync"]["meets_steps"] is False  # And end at it.
  unsolved = {"sync": {"0": _run(40.0, 0.95, steps=100_000)}, "sb3": {"0": _run(None, 0.4)}}
  assert lb.verdict(unsolved, 0.9)["sync"]["meets_steps"] is None
  lines = lb.task_table({"A-v3": ok, "B-v3": unsolved}, {"A-v3": v, "B-v3": lb.verdict(unsolved, 0.9)})
  assert lines[2] == "| A-v3 | 200k | 0.95 | 240k / 260k | 0.95 / 0.92 | 1.25 | meets |"
  assert lines[3] == "| B-v3 | never | 0.40 | 100k | 0.95 | - | EBRL solves, SB3 does not |"


def test_all_means_the_fifty_metaworld_tasks():
  from sim_adapters import metaworld_tasks  # pylint: disable=g-import-not-at-top

  tasks = metaworld_tasks()
  assert len(tasks) == 50 == len(set(tasks)) and "Reach-v3" in tasks and "PickPlaceWall-v3" in tasks
  assert not any(t.startswith("MT") for t in tasks)


def test_verdict_needs_every_seed_to_reach_hold_and_beat_the_peer_run_of_its_seed():
  peer = {"0": _run(30.0, 0.95), "1": _run(50.0, 0.9)}
  good = {"sync": {"0": _run(20.0, 0.95), "1": _run(49.0, 0.91)}, "sb3": peer}
  v = lb.verdict(good, 0.9)
  assert v["peer_solved"] and v["peer_time_to_target_s"] == {"0": 30.0, "1": 50.0}
  assert v["sync"]["meets"] is True
  assert v["sync"]["median_time_to_target_s"] == 34.5 and v["peer_median_time_to_target_s"] == 40.0
  late = {"sync": {"0": _run(31.0, 0.95), "1": _run(20.0, 0.95)}, "sb3": peer}
  assert lb.verdict(late, 0.9)["sync"]["no_later_than_peer"] is False
  # One peer seed: every EBRL seed is held to it.
  one = {"sync": {"0": _run(20.0, 0.95), "1": _run(31.0, 0.95)}, "sb3": {"0": _run(30.0, 0.95)}}
  assert lb.verdict(one, 0.9)["sync"]["no_later_than_peer"] is False
  # A peer seed that never got there sets no time for that seed.
  miss = {"sync": {"0": _run(20.0, 0.95), "1": _run(90.0, 0.95)}, "sb3": {"0": _run(30.0, 0.95), "1": _run(None, 0.2)}}
  assert lb.verdict(miss, 0.9)["sync"]["meets"] is True
  assert lb.verdict(miss, 0.9)["peer_median_time_to_target_s"] is None  # Half its seeds never got there.
  dropped = {"sync": {"0": _run(20.0, 0.95), "1": _run(25.0, 0.5)}, "sb3": peer}
  assert lb.verdict(dropped, 0.9)["sync"]["final_at_target_every_seed"] is False
  missed = {"sync": {"0": _run(None, 0.1), "1": _run(25.0, 0.95)}, "sb3": peer}
  assert lb.verdict(missed, 0.9)["sync"]["meets"] is False
  # A seed that never got there is later than every seed that did.
  assert lb.median_time({"0": _run(10.0, 1.0), "1": _run(None, 0.0), "2": _run(20.0, 1.0)}) == 20.0
  assert lb.median_time({"0": _run(30.0, 1.0), "1": _run(None, 0.0), "2": _run(None, 0.0)}) is None
  # A task the peer never solves sets no bar (reported, not judged).
  unsolved = {"sync": {"0": _run(None, 0.0)}, "sb3": {"0": _run(None, 0.0)}}
  v = lb.verdict(unsolved, 0.9)
  assert not v["peer_solved"] and v["sync"]["meets"] is None


@pytest.mark.parametrize("flags,expected", [
    (["--tasks=Nope-v3"], "--tasks: unknown env 'MetaWorld/Nope-v3'"),
    (["--schedulers=random"], "'random' is not a learning scheduler"),
    (["--seeds=a"], "--seeds=a must be integers"),
    (["--steps=0"], "--steps=0 must be a positive"),
    (["--peer_python=/nonexistent/python", "--peer_script=/nonexistent/s.py"], "--peer_python='/nonexistent/python' is not a file"),
    (["--peer_python=/nonexistent/python"], "--peer_python and --peer_script go together"),
    (["--override=--seed=3"], "--override='--seed=3' must be a --config.<key>=<value> flag"),
    (["--out=/proc/learning.json"], "--out='/proc/learning.json' is not writable"),
    (["--config_file=/nonexistent/cfg.py"], "cannot load --config_file=/nonexistent/cfg.py: no such file"),
    (["--steps_ratio=0"], "--steps_ratio=0.0 must be a positive number"),
])
def test_flag_mistakes_are_one_line_before_any_run(flags, expected, tmp_path):
  proc = subprocess.run([sys.executable, "-m", "launch.learning_bench", *flags], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, check=False)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and expected in lines[0], proc.stderr
  assert "Traceback" not in proc.stderr


def test_report_only_tables_the_finished_runs_and_runs_nothing(tmp_path):
  """A sweep of hours is read while it runs: --report_only runs nothing (no peer flags, no
  launch.train), tables the runs already in runs/, says 'not run' for a system missing on a task,
  or 'peer not run', and counts seeds where fewer than the acceptance's two ran."""
  import json
  runs = tmp_path / "runs"
  runs.mkdir()
  curve = [[10.0, 100_000, 0.5], [20.0, 200_000, 0.95]]
  def write(name, steps, final):
    (runs / f"{name}.json").write_text(json.dumps({**_run(20.0 if steps else None, final, steps), "best_success": final,
                                                   "env_steps_per_s": 1.0, "curve": curve}))
  write("Reach-v3_sync_s0", 200_000, 0.95)
  write("Reach-v3_sb3_s0", 200_000, 0.96)
  write("Push-v3_sb3_s0", 300_000, 0.97)
  write("Hammer-v3_sync_s0", None, 0.1)
  proc = subprocess.run([sys.executable, "-m", "launch.learning_bench", "--report_only", "--tasks=Reach-v3,Push-v3,Hammer-v3",
                         "--seeds=0,1", f"--out={tmp_path / 'learning.json'}"], cwd=ROOT, capture_output=True, text=True,
                        timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "| Reach-v3 | 200k | 0.96 | 200k | 0.95 | 1.00 | meets (1 seed) |" in proc.stdout
  assert "| Push-v3 | 300k | 0.97 | - | - | - | not run |" in proc.stdout
  assert "| Hammer-v3 | - | - | never | 0.10 | - | peer not run |" in proc.stdout
  assert "[learning_bench] EBRL" not in proc.stdout
  report = json.loads((tmp_path / "learning.json").read_text())
  assert sorted(report["runs"]) == ["Hammer-v3", "Push-v3", "Reach-v3"] and sorted(os.listdir(runs)) == [
      "Hammer-v3_sync_s0.json", "Push-v3_sb3_s0.json", "Reach-v3_sb3_s0.json", "Reach-v3_sync_s0.json"]


def test_a_run_cut_short_is_started_again_in_a_clean_workdir(tmp_path, monkeypatch):
  """A stopped sweep leaves a run's workdir without its figures; launch.train refuses a used
  workdir, so the next call removes it before starting the run again."""
  from absl import flags
  if not flags.FLAGS.is_parsed():  # run_ebrl reads its flags' defaults; left unparsed for other tests.
    flags.FLAGS.mark_as_parsed()
    request_unparse = True
  else:
    request_unparse = False
  workdir = tmp_path / "Reach-v3_sync_s0"
  workdir.mkdir()
  (workdir / "metrics.jsonl").write_text("{}\n")
  seen = []
  def fake_run(cmd, **kwargs):
    seen.append(os.path.exists(workdir))
    return subprocess.CompletedProcess(cmd, 1, "", "error: stopped here")
  monkeypatch.setattr(lb.subprocess, "run", fake_run)
  try:
    with pytest.raises(RuntimeError, match="stopped here"):
      lb.run_ebrl("Reach-v3", 0, "sync", str(workdir))
  finally:
    if request_unparse:
      flags.FLAGS.unparse_flags()
  assert seen == [False]


def test_the_seed_table_counts_held_seeds_and_judges_the_peer_against_itself():
  """Per task the peer solves: k/n seeds that reached the target and ended at it, the medians, and
  the peer's later seeds judged by EBRL's bar against its seed 0 (a seed that never got there, or
  dipped below the target at the end, is not held)."""
  results = {
      "A-v3": {"sb3": {"0": _run(30.0, 0.95, steps=200_000), "1": _run(None, 0.2), "2": _run(30.0, 0.92, steps=220_000)},
               "sync": {"0": _run(30.0, 0.95, steps=180_000), "1": _run(30.0, 0.85, steps=240_000)}},
      "B-v3": {"sb3": {"0": _run(None, 0.1)}, "sync": {"0": _run(30.0, 0.95)}},  # Peer never solves: no row.
      "C-v3": {"sb3": {"0": _run(30.0, 0.95, steps=100_000), "1": _run(30.0, 0.93, steps=120_000)}},
  }
  lines = lb.seed_table(results, 0.9)
  assert len(lines) == 4
  # Peer seeds 1 and 2 against seed 0: seed 1 never got there, so the peer fails its own bar.
  assert lines[2] == "| A-v3 | 2/3 | 220k | 1/2 | 210k | short (-; 2 seeds) |"
  assert lines[3] == "| C-v3 | 2/2 | 110k | - | - | meets (1.20; 1 seed) |"
