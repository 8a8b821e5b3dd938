"""Runs over two processes on localhost (launch.multiprocess, jax.distributed over gloo): sync and
ebrl runs (the launcher, the Python API) write one summary with the run's env steps and the same
params on both processes; a run resumes as a run of two processes and refuses one; SIGTERM stops
both at the same update; a killed process stops the other within 60 s with one line and leaves a
checkpoint the run resumes from; bad process configs are one line, exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from ebrl.distributed import free_port
from ebrl.process_bench import process_pid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The tiny shapes of tests/tiny_configs.py, as flags: 4 envs over 2 processes, 8-step rollouts.
TINY = ("--config.num_envs=4", "--config.rollout_length=8", "--config.policy.hidden=16,16",
        "--config.algorithm.epochs=1", "--config.algorithm.num_minibatches=2", "--progress=false")


def _env(tests: bool = False) -> dict[str, str]:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  paths = [ROOT] + ([os.path.join(ROOT, "tests")] if tests else [])
  env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
  return env


def _launch(workdir, *flags: str, processes: int = 2) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-m", "launch.multiprocess", f"--num_processes={processes}", "--",
                           *TINY, f"--workdir={workdir}", *flags], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout_s: float = 240) -> tuple[int, str, str]:
  try:
    out, err = proc.communicate(timeout=timeout_s)
  finally:
    if proc.poll() is None:  # The launcher stops its processes on SIGTERM.
      proc.terminate()
      proc.communicate(timeout=90)
  return proc.returncode, out, err


def _summary(workdir) -> dict:
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)


def _checkpoints(workdir) -> list[int]:
  path = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(path) if n.isdigit()) if os.path.isdir(path) else []


def _assert_one_run(summary: dict, env_steps: int, updates: int) -> None:
  assert summary["num_processes"] == 2
  assert summary["env_steps"] == env_steps  # The run's: both processes' envs together.
  assert summary["policy_version"] == updates
  digests = summary["params_sha256_by_process"]
  assert len(digests) == 2 and digests[0] == digests[1], digests


def test_sync_run_over_two_processes_survives_a_killed_process_and_stops_on_sigterm(tmp_path):
  """One run, launched three times: to its end; resumed and one process SIGKILLed (the other exits
  within 60 s with one line, the checkpoint stays good); resumed from that checkpoint and stopped
  by SIGTERM (both leave after the same update). A single process may not resume it."""
  workdir = tmp_path / "run"
  code, _, err = _finish(_launch(workdir, "--config.scheduler=sync", "--config.total_env_steps=64"))
  assert code == 0, err[-3000:]
  # 4 envs x 8 steps per update over both processes: 64 env steps are 2 updates.
  _assert_one_run(_summary(workdir), env_steps=64, updates=2)
  files = set(os.listdir(workdir))
  assert {"summary.json", "metrics.jsonl", "config.json", "trace.json", "trace.process1.json"} <= files
  rows = _rows(workdir)
  assert json.loads(rows[-1])["env_steps"] == 64  # Process 0 writes the run's rows, once each.
  assert _checkpoints(workdir) == [64]

  proc = _launch(workdir, "--config.scheduler=sync", "--config.total_env_steps=10000000", "--config.resume=True",
                 "--config.checkpoint_every_s=1")
  try:
    deadline = time.monotonic() + 180
    while _checkpoints(workdir)[-1] == 64 and time.monotonic() < deadline:
      time.sleep(0.5)
    assert _checkpoints(workdir)[-1] > 64, "no checkpoint within 180 s"
    os.kill(process_pid(proc, 1), signal.SIGKILL)
    killed = time.monotonic()
    code, out, err = _finish(proc, timeout_s=120)
    took = time.monotonic() - killed
  finally:
    if proc.poll() is None:
      proc.kill()
  assert f"resumed from {workdir / 'checkpoints' / '64'} at 64 env steps" in out + err
  assert code == 128 + signal.SIGKILL  # Process 1's, the first to end; process 0 then exited 1.
  assert took < 60, took
  lost = [l for l in err.splitlines() if "lost process 1" in l]
  assert lost and lost[0].startswith("error: process 0: lost process 1 of the run's 2"), err[-3000:]
  assert "--config.resume=True" in lost[0]

  last = _checkpoints(workdir)[-1]
  rows = _rows(workdir)
  proc = _launch(workdir, "--config.scheduler=sync", "--config.total_env_steps=10000000", "--config.resume=True")
  try:
    deadline = time.monotonic() + 180
    while len(_rows(workdir)) <= len(rows) and time.monotonic() < deadline:  # Training: a new row.
      time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
  finally:
    code, out, err = _finish(proc)
  assert code == 128 + signal.SIGTERM, err[-3000:]
  assert f"resumed from {workdir / 'checkpoints' / str(last)} at {last} env steps" in out + err
  summary = _summary(workdir)
  assert last < summary["env_steps"] < 10000000
  _assert_one_run(summary, env_steps=summary["policy_version"] * 32, updates=summary["policy_version"])
  assert _checkpoints(workdir)[-1] == summary["env_steps"]

  one = subprocess.run([sys.executable, "-m", "launch.train", *TINY, f"--workdir={workdir}",
                        "--config.scheduler=sync", "--config.total_env_steps=10000000", "--config.resume=True"],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=240)
  assert one.returncode == 2, one.stderr[-3000:]
  assert one.stderr.strip().splitlines()[-1] == (
      f"error: the checkpoint at {summary['env_steps']} env steps was written by a run of 2 processes; resume it "
      "with --num_processes=2")


def _rows(workdir) -> list[str]:
  path = workdir / "metrics.jsonl"
  return open(path).readlines() if path.exists() else []


def test_ebrl_run_over_two_processes_through_the_python_api(tmp_path):
  """ebrl.train(..., coordinator_address=, num_processes=, process_id=) in each process."""
  workdir = tmp_path / "run"
  proc = subprocess.Popen([sys.executable, "-m", "launch.multiprocess", "--num_processes=2",
                           "--module=api_run_child", "--", str(workdir), "ebrl", "64"], cwd=ROOT, env=_env(tests=True),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
  code, out, err = _finish(proc)
  assert code == 0, err[-3000:]
  summary = _summary(workdir)
  # Each update takes 2 segments of 8 steps from each process; the envs step on between updates.
  assert summary["env_steps"] >= 64
  _assert_one_run(summary, env_steps=summary["env_steps"], updates=2)
  assert f"process 0: {summary['env_steps']} env steps" in out  # Both return the run's summary.
  assert f"[process 1] process 1: {summary['env_steps']} env steps" in err


def test_bad_process_configs_are_one_line_exit_2(tmp_path):
  code, _, err = _finish(_launch(tmp_path / "odd", "--config.num_envs=5"))
  assert code == 2
  assert ("error: num_envs=5 must be divisible by --num_processes=2 (num_envs counts every process's envs)"
          in err.splitlines())

  # Two processes started by hand with different configs: both refuse, naming process 1.
  address = f"localhost:{free_port()}"
  procs = [subprocess.Popen([sys.executable, "-m", "launch.train", *TINY, f"--workdir={tmp_path / 'mixed'}",
                             f"--coordinator_address={address}", "--num_processes=2", f"--process_id={i}",
                             f"--config.seed={i}"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(2)]
  for p in procs:
    _, err = p.communicate(timeout=240)
    assert p.returncode == 2, err[-3000:]
    assert err.strip().splitlines()[-1] == ("error: process 1 was started with a config that differs from process "
                                            "0's: every process of a run needs the same --config flags")
  assert not os.path.exists(tmp_path / "mixed" / "config.json")
