"""Ctrl-C in the middle of a training run, as a user presses it (shared by scheduler tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def interrupt_run(workdir, config_args: list[str]) -> dict:
  """Starts `launch.train`, sends SIGINT once it logs, and checks it ended cleanly within 10 s.

  Returns the run's summary.json; asserts that the final checkpoint was written.
  """
  args = ["launch.train", "--progress=false", f"--workdir={workdir}", "--config.log_every_s=0.2", *config_args]
  # Python leaves SIGINT ignored when its parent ignored it (background jobs): re-arm it in the child.
  boot = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
          f"sys.argv = {args!r}; runpy.run_module('launch.train', run_name='__main__')")
  proc = subprocess.Popen([sys.executable, "-c", boot], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    deadline = time.time() + 120
    while not (workdir / "metrics.jsonl").exists() or not (workdir / "metrics.jsonl").read_text().strip():
      assert time.time() < deadline and proc.poll() is None, "the run never started logging"
      time.sleep(0.2)
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
  finally:
    proc.kill()
  assert time.time() - sent < 10, out
  assert proc.returncode == 0, out
  summary = json.loads((workdir / "summary.json").read_text())
  assert 0 < summary["env_steps"] < 600_000  # Stopped before the default budget.
  assert str(summary["env_steps"]) in os.listdir(workdir / "checkpoints")
  return summary
