"""Ctrl-C as users press it: during the first compile, and twice in a row.

The first SIGINT asks the run to stop after the update it is in (here its first
compile, with an empty compilation cache so the compile takes seconds): the run
exits 0 with one checkpoint a resume can read and one summary. A second SIGINT
ends the process at once, and the last good checkpoint still resumes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--config.scheduler=ebrl", "--config.num_envs=8", "--config.rollout_length=8",
        "--config.policy.hidden=(16,16)", "--config.algorithm.num_minibatches=2", "--config.algorithm.epochs=1"]
# Python leaves SIGINT ignored when its parent ignored it (background jobs): re-arm it in the child.
BOOT = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = {args!r}; runpy.run_module('launch.train', run_name='__main__')")


def _start(workdir, extra: list[str], env: dict | None = None, group: bool = False) -> subprocess.Popen:
  """launch.train on TINY; `group`: in a process group of its own (signalled as a whole)."""
  args = ["launch.train", "--progress=false", f"--workdir={workdir}", *TINY, *extra]
  return subprocess.Popen([sys.executable, "-c", BOOT.format(args=args)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=group)


def _wait_for_line(proc: subprocess.Popen, prefix: str, timeout: float) -> list[str]:
  lines, deadline = [], time.time() + timeout
  while time.time() < deadline:
    line = proc.stdout.readline()
    if not line:
      break
    lines.append(line)
    if line.startswith(prefix):
      return lines
  raise AssertionError(f"no line starting {prefix!r}: {''.join(lines)}")


def test_ctrl_c_during_the_first_compile_waits_for_the_update_then_saves_once(tmp_path):
  workdir = tmp_path / "run"
  proc = _start(workdir, [], env={"EBRL_JAX_CACHE": str(tmp_path / "empty_cache")})
  try:
    head = _wait_for_line(proc, "training ", timeout=120)
    time.sleep(1.0)  # Threads started; the sampler and learner are compiling their first calls.
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
  finally:
    proc.kill()
  out = "".join(head) + out
  assert proc.returncode == 0, out
  assert time.time() - sent < 90, out
  assert "Traceback" not in out and "not checkpointing" not in out, out
  assert out.count("outputs in ") == 1, out  # finish ran once: one summary, one final checkpoint.
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["policy_version"] <= 2  # It stopped within its first updates.
  steps = [d for d in os.listdir(workdir / "checkpoints") if d.isdigit()]
  assert steps == [str(summary["env_steps"])]
  # The checkpoint is complete: a resumed launch reads it.
  resumed = subprocess.run([sys.executable, "-m", "launch.train", "--progress=false", f"--workdir={workdir}",
                            *TINY, "--config.resume=True", f"--config.total_env_steps={summary['env_steps'] + 128}"],
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                           timeout=180)
  assert resumed.returncode == 0, resumed.stdout + resumed.stderr
  assert f"at {summary['env_steps']} env steps" in resumed.stdout


def test_a_second_ctrl_c_exits_at_once_and_the_last_checkpoint_still_resumes(tmp_path):
  workdir = tmp_path / "run"
  proc = _start(workdir, ["--config.checkpoint_every_s=0.1"])
  try:
    _wait_for_line(proc, "training ", timeout=120)
    deadline = time.time() + 120
    while not any(d.isdigit() for d in os.listdir(workdir / "checkpoints")):
      assert time.time() < deadline and proc.poll() is None, "no checkpoint was written"
      time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    exited = time.time() - sent
  finally:
    proc.kill()
  assert proc.returncode == -signal.SIGINT and exited < 5
  resumed = subprocess.run([sys.executable, "-m", "launch.train", "--progress=false", f"--workdir={workdir}",
                            *TINY, "--config.resume=True", "--config.total_env_steps=64"], cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=180)
  assert resumed.returncode == 0 and "resumed from" in resumed.stdout, resumed.stdout + resumed.stderr
  assert "corrupt" not in resumed.stdout + resumed.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_sigterm_stops_like_ctrl_c(tmp_path, sig):
  """Cluster preemption sends SIGTERM: the run saves and exits 0 as for Ctrl-C."""
  workdir = tmp_path / "run"
  proc = _start(workdir, [])
  try:
    _wait_for_line(proc, "training ", timeout=120)
    time.sleep(2.0)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 0, out
  assert (workdir / "summary.json").is_file()


def test_a_second_signal_under_previous_waits_for_a_write_in_progress():
  """The Python API's mode: a second SIGINT raises the earlier handler's KeyboardInterrupt, but
  never inside a checkpoint write (Orbax's writer threads would be left running): it is held
  until the write ends."""
  import threading  # pylint: disable=g-import-not-at-top

  from ebrl import interrupts

  stop, events = threading.Event(), []
  before = signal.getsignal(signal.SIGINT)
  with interrupts.stop_on_signals(stop, log=lambda m: None, second="previous"):
    signal.raise_signal(signal.SIGINT)
    assert stop.is_set()
    with pytest.raises(KeyboardInterrupt):
      with interrupts.uninterruptible():
        signal.raise_signal(signal.SIGINT)
        events.append("write finished")  # Reached: the signal did not cut the write.
    assert events == ["write finished"]
    with pytest.raises(KeyboardInterrupt):  # Outside a write it interrupts at once.
      signal.raise_signal(signal.SIGINT)
  assert signal.getsignal(signal.SIGINT) is before


def test_the_earlier_handlers_are_back_before_a_second_signal_raises():
  """The KeyboardInterrupt of a second signal can land anywhere, the block's own restoring included;
  the earlier handlers are put back before it is raised, so a notebook kernel never keeps the run's."""
  import threading  # pylint: disable=g-import-not-at-top

  from ebrl import interrupts

  before = {sig: signal.getsignal(sig) for sig in interrupts.SIGNALS}
  with interrupts.stop_on_signals(threading.Event(), log=lambda m: None, second="previous"):
    signal.raise_signal(signal.SIGINT)
    try:
      signal.raise_signal(signal.SIGINT)
      raise AssertionError("the second SIGINT did not raise")
    except KeyboardInterrupt:
      assert {sig: signal.getsignal(sig) for sig in interrupts.SIGNALS} == before  # Already, inside the block.


def test_a_signal_landing_while_the_block_restores_its_handlers_leaves_none_behind(monkeypatch):
  """A SIGINT delivered just after the first handler is put back on the way out of the block (the
  race a notebook kernel met: the run's handler left installed). It takes the earlier handler's
  effect, KeyboardInterrupt, and every earlier handler is back."""
  import threading  # pylint: disable=g-import-not-at-top

  from ebrl import interrupts

  before = {sig: signal.getsignal(sig) for sig in interrupts.SIGNALS}
  real, state = signal.signal, {"armed": False, "fired": False}

  def signal_then_interrupt(sig, handler):
    out = real(sig, handler)
    if state["armed"] and not state["fired"]:
      state["fired"] = True
      signal.raise_signal(signal.SIGINT)  # Its Python handler runs before raise_signal returns.
    return out

  monkeypatch.setattr(signal, "signal", signal_then_interrupt)
  with pytest.raises(KeyboardInterrupt):
    with interrupts.stop_on_signals(threading.Event(), log=lambda m: None, second="previous"):
      state["armed"] = True
  monkeypatch.undo()
  assert state["fired"]
  assert {sig: signal.getsignal(sig) for sig in interrupts.SIGNALS} == before


@pytest.mark.slow  # A calibration child first; signals to the group are tested on a learner-process run by default.
def test_sigterm_to_the_group_during_the_stage_calibration_still_stops_cleanly(tmp_path):
  """resources=auto calibrates in a process of its own while the run is built. A SIGTERM to the
  group then (`timeout` on a long job, preemption) reaches the calibration too: it is the run's to
  act on, so the run is built, stops at its first update and saves, instead of failing with
  "stage calibration process failed (exit code -15)"."""
  workdir = tmp_path / "run"
  proc = _start(workdir, ["--config.resources=auto", "--config.total_env_steps=1000000"],
                env={"EBRL_PROFILE_CACHE": str(tmp_path / "profiles")}, group=True)
  try:
    _wait_for_line(proc, "[profile] sim:", timeout=120)  # Printed by the calibration process.
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=240)
  finally:
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    proc.wait()
  assert proc.returncode == 0, out
  assert "calibration process failed" not in out
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["env_steps"] < 1000000
