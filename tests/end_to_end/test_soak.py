"""launch.soak keeps its contract on a 45-second soak: kills, resumes, memory figures, a clean stop.

The real soak runs for half an hour; this one runs the same code path with
every interval shrunk (SIGKILLs 15 s apart, checkpoints every 3 s, a tiny MT10
config), so a change that breaks resuming, the hang detector or the report
shows here rather than thirty minutes into a benchmark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_TRAIN = ("--config.rollout_length=8 --config.policy.hidden=(16,16) --config.algorithm.epochs=1 "
              "--config.algorithm.num_minibatches=2 --config.log_every_s=0.5")


def _soak(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": ROOT}
  env.setdefault("JAX_PLATFORMS", "cpu")
  return subprocess.run([sys.executable, "-m", "launch.soak", *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)


def _alive_in(workdir: str) -> list[int]:
  """Processes still running whose command line names this workdir (a launch the soak left behind)."""
  alive = []
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        with open(f"/proc/{name}/cmdline", "rb") as f:
          if workdir.encode() in f.read():
            alive.append(int(name))
      except OSError:
        pass
  return alive


@pytest.mark.slow  # A 45-second soak whose counts need the cores to itself.
def test_short_soak_kills_resumes_and_reports(tmp_path):
  workdir, out = str(tmp_path / "run"), str(tmp_path / "soak.json")
  # --max_faults=1 ends the soak on its fault count, not on the clock: on a loaded machine (a parallel
  # test suite, cold compiles) the first launch may need most of a minute before its first checkpoint.
  proc = _soak("--minutes=3", "--max_faults=1", "--kill_every_s=15", "--checkpoint_every_s=3",
               "--sample_every_s=1", "--steady_s=8", "--num_envs=10", f"--train_args={TINY_TRAIN}",
               f"--workdir={workdir}", f"--out={out}")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert not _alive_in(workdir)
  with open(out) as f:
    report = json.load(f)
  o, launches = report["overall"], report["launches"]
  assert report["env"] == "MetaWorld/MT10" and report["scheduler"] == "ebrl"
  # One kill (the first checkpointed moment from 15 s on), then one resumed launch that checkpoints,
  # reaches steady state and is stopped.
  kills = o["kills"]
  assert kills == 1 and [l["ended"] for l in launches] == ["killed", "stopped"], launches
  assert o["hangs"] == 0 and o["exited_on_their_own"] == 0
  assert o["resumes"] == kills and o["resumes_succeeded"] == kills
  for l in launches[1:]:
    assert l["resumed_from_env_steps"] == l["expected_resume_env_steps"] > 0
  assert o["env_steps_monotone"] is True
  starts = [l["start_env_steps"] for l in launches]
  assert starts == sorted(starts) and o["end_env_steps"] > starts[-1]
  for l in launches:
    assert l["rss_first_row_mb"] > 0 and l["rss_end_mb"] > 0 and l["metrics_rows"] > 0, l
  assert o["rss_start_mb"] > 0 and o["rss_end_mb"] > 0
  assert o["rss_start_at_s"] >= 8 and o["rss_end_steady"] is True  # Like with like: both in steady state.
  assert isinstance(o["rss_within_10pct"], bool) and isinstance(o["orbax_tmp_dirs_left"], list)
  assert all("rss_growth_mb_per_min" in l for l in launches)
  assert o["final_stop"]["clean"] is True
  assert os.path.isfile(os.path.join(workdir, "summary.json"))
  assert f"resumes succeeded: {kills}/{kills}" in proc.stdout


@pytest.mark.slow  # Minutes of launches; each fault alone is tested where it is handled.
def test_a_fault_soak_injects_each_fault_and_counts_what_it_left(tmp_path):
  """--faults: each planned kill injects the next fault of a shuffled round (here every kind once),
  checks that the launch ended as that fault should end it, counts the processes and /dev/shm
  blocks it left, and the next launch resumes from the newest checkpoint."""
  workdir, out = str(tmp_path / "run"), str(tmp_path / "soak.json")
  faults = ["exception", "sigkill_parent", "double_ctrl_c"]
  proc = _soak("--minutes=5", "--kill_every_s=1", "--checkpoint_every_s=3", "--sample_every_s=1", "--steady_s=5",
               "--num_envs=10", f"--faults={','.join(faults)}", "--max_faults=3", "--grace_s=15",
               f"--train_args=--config.placement=processes {TINY_TRAIN}", f"--workdir={workdir}", f"--out={out}",
               timeout=400)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert not _alive_in(workdir)
  with open(out) as f:
    report = json.load(f)
  o, launches = report["overall"], report["launches"]
  assert sorted(l["fault"] for l in launches[:3]) == sorted(faults) and launches[3]["fault"] is None
  assert o["faults"] == 3 and o["faults_as_expected"] == 3, [l["fault_outcome"] for l in launches]
  assert o["runs_resumed"] == 3 and o["leftover_processes"] == 0 and o["leftover_blocks"] == 0
  assert o["env_steps_monotone"] is True and o["final_stop"]["clean"] is True
  assert report["train_argv"][0] == "launch.fault_train"  # The exception comes through the drop-in.
  assert "ended as expected: 3/3; runs resumed: 3/3; left over: 0 processes, 0 /dev/shm blocks" in proc.stdout


@pytest.mark.parametrize("args, expected", [
    (["--minutes=0"], "--minutes=0.0 must be a positive finite number"),
    (["--minutes=nan"], "--minutes=nan must be a positive finite number"),
    (["--kill_every_s=-5"], "--kill_every_s=-5.0 must be a positive finite number"),
    (["--checkpoint_every_s=inf"], "--checkpoint_every_s=inf must be a positive finite number"),
    (["--hang_s=0"], "--hang_s=0.0 must be"),
    (["--out=/proc/no-such-dir/soak.json"], "--out=/proc/no-such-dir/soak.json is not writable"),
    (["--train_args=--config.total_env_steps=5"], "the soak sets --config.total_env_steps itself"),
    (["--train_args=--config.seed='1"], "--train_args:"),
    (["--faults=sigkill,sigterm_group"], "--faults=sigkill,sigterm_group: unknown sigkill; valid: sigkill_group"),
    (["--max_faults=-1"], "--max_faults=-1 must be >= 0"),
])
def test_bad_flags_are_one_line_exit_2(args, expected, tmp_path):
  proc = _soak(*args, f"--workdir={tmp_path / 'run'}", timeout=60)
  assert proc.returncode == 2, proc.stderr
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], proc.stderr
  assert not (tmp_path / "run").exists()  # Nothing created before the flags are known good.


def test_used_workdir_needs_resume(tmp_path):
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
  proc = _soak(f"--workdir={tmp_path / 'run'}", f"--out={tmp_path / 'soak.json'}", timeout=60)
  assert proc.returncode == 2, proc.stderr
  assert "already used; pass --resume" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
  assert not (tmp_path / "soak.json").exists()


def test_hung_launches_are_killed_and_counted(tmp_path):
  """A launch that never logs a row is killed after --hang_s, counted, and relaunched."""
  (tmp_path / "never_logs.py").write_text(
      "import time\nprint('starting, never logging', flush=True)\nwhile True:\n  time.sleep(1)\n")
  out = tmp_path / "soak.json"
  env_path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
  proc = subprocess.run([sys.executable, "-m", "launch.soak", "--minutes=0.15", "--hang_s=2", "--steady_s=1",
                         "--sample_every_s=0.5", "--stop_timeout_s=10", "--train_module=never_logs",
                         f"--workdir={tmp_path / 'run'}", f"--out={out}"], cwd=ROOT,
                        env={**os.environ, "PYTHONPATH": env_path}, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr[-2000:]
  report = json.loads(out.read_text())
  ended = [l["ended"] for l in report["launches"]]
  assert len(ended) >= 3 and set(ended[:-1]) == {"hung"} and ended[-1] in ("hung", "stopped"), ended
  assert report["overall"]["hangs"] == ended.count("hung") and report["overall"]["kills"] == 0
  assert all(l["rss_samples"] > 0 and l["metrics_rows"] == 0 for l in report["launches"])
  assert not _alive_in(str(tmp_path / "run"))


def test_launch_that_cannot_start_is_one_line_exit_2(tmp_path):
  proc = _soak("--minutes=1", "--train_args=--config.rollout_length=0", f"--workdir={tmp_path / 'run'}",
               f"--out={tmp_path / 'soak.json'}", timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and "launch.train exited with 2 before training" in lines[0], proc.stderr
  assert "rollout_length=0" in lines[0]
