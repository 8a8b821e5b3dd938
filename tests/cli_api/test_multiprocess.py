"""launch/multiprocess.py: N processes on localhost joined through jax.distributed, process 0's
output as it is and the others' prefixed, the first non-zero exit code returned, every process
stopped on SIGTERM or after one fails; and the process flags of the launchers, checked in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(ROOT, "tests")


def _env() -> dict[str, str]:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = os.pathsep.join([ROOT, TESTS] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
  return env


def _launch(*flags: str, child: tuple[str, ...] = ()) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-m", "launch.multiprocess", "--module=multiprocess_child", *flags, "--",
                           *child], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True)


def _children(launcher_pid: int) -> list[int]:
  out = subprocess.run(["pgrep", "-P", str(launcher_pid)], capture_output=True, text=True).stdout
  return [int(p) for p in out.split()]


def _gone(pids: list[int], within_s: float) -> bool:
  deadline = time.monotonic() + within_s
  while time.monotonic() < deadline:
    if not any(os.path.exists(f"/proc/{p}") and "zombie" not in _state(p) for p in pids):
      return True
    time.sleep(0.1)
  return False


def _state(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/status") as f:
      return next((l for l in f if l.startswith("State:")), "")
  except OSError:
    return ""


def test_two_processes_join_gather_and_exit_zero():
  proc = _launch("--num_processes=2")
  try:
    out, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:  # The launcher stops its processes on SIGTERM.
      proc.terminate()
      proc.wait(timeout=60)
  assert proc.returncode == 0, err[-3000:]
  assert "process 0 of 2 gathered [0, 1]" in out  # Process 0's output, as it is.
  assert "[process 1] process 1 of 2 gathered [0, 1]" in err  # The others', prefixed.


def test_a_failing_process_is_the_exit_code_and_the_others_are_stopped():
  proc = _launch("--num_processes=2", "--grace_s=3", child=("--fail_code=3", "--hold_s=600"))
  try:
    _, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.terminate()
      proc.wait(timeout=60)
  assert proc.returncode == 3, err[-3000:]
  assert "error: process 1 exited with code 3" in err


def test_sigterm_stops_every_process():
  proc = _launch("--num_processes=2", child=("--hold_s=600",))
  try:
    deadline = time.monotonic() + 90
    children = []
    while time.monotonic() < deadline and len(children) < 2:
      children = _children(proc.pid)
      time.sleep(0.2)
    assert len(children) == 2
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert _gone(children, within_s=10)
  finally:
    if proc.poll() is None:
      proc.terminate()
      proc.wait(timeout=60)


@pytest.mark.parametrize("args, says", [
    (["-m", "launch.multiprocess", "--num_processes=0"], "--num_processes=0 must be at least 1"),
    (["-m", "launch.multiprocess", "--", "--process_id=1"], "--process_id after -- are the launcher's to set"),
    (["-m", "launch.train", "--num_processes=2", "--process_id=2", "--coordinator_address=localhost:1"],
     "--process_id=2 must be in [0, 1]"),
    (["-m", "launch.train", "--num_processes=2", "--process_id=0"], "missing --coordinator_address"),
    (["-m", "launch.bench", "--coordinator_address=localhost", "--num_processes=2", "--process_id=0"],
     "is not host:port"),
    (["-m", "launch.train", "--local_device_ids=a"], "--local_device_ids=a must be device indices"),
    (["-m", "launch.bench", "--coordinator_address=localhost:1", "--num_processes=2", "--process_id=0"],
     "--num_processes=2: this launcher's runs span one process for now"),
])
def test_bad_process_flags_are_one_line_exit_2(args, says):
  proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and says in lines[0], proc.stderr


def test_an_unreachable_coordinator_is_one_line_exit_2():
  """Process 1 of a run whose coordinator never comes up gives up after --connect_timeout_s."""
  with __import__("socket").socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]  # Bound, never listening: nothing answers there.
    proc = subprocess.run([sys.executable, "-m", "multiprocess_child", f"--coordinator_address=localhost:{port}",
                           "--num_processes=2", "--process_id=1", "--connect_timeout_s=3"],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and f"process 1 could not join the run at localhost:{port} within 3 s" in lines[0], \
      proc.stderr
