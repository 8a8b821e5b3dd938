"""Ctrl-C or SIGTERM in the middle of a training run, as a user's terminal or a cluster sends it
(shared by scheduler tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# In the environment of the run and every process it starts: tests running in parallel tell their
# run's processes from another test's by it (/proc/<pid>/environ).
RUN_TAG = "EBRL_TEST_RUN"


def interrupt_run(workdir, config_args: list[str], sig: int = signal.SIGINT, output: list | None = None,
                  preamble: str = "") -> dict:
  """Starts `launch.train` in a process group of its own, sends `sig` to the whole group once the
  run logs (as a terminal's Ctrl-C, `timeout` or SLURM's scancel do: every process the run started
  gets it too), and checks it ended cleanly within 10 s.

  Returns the run's summary.json; asserts that the final checkpoint was written and that no
  shared-memory block was left for the resource tracker to clean up (it warns of each one it
  unlinks). The run's output is appended to `output` when given; `preamble` is Python code run in
  the launch's process before launch.train (fault injection).
  """
  args = ["launch.train", "--progress=false", f"--workdir={workdir}", "--config.log_every_s=0.2", *config_args]
  # Python leaves SIGINT ignored when its parent ignored it (background jobs): re-arm it in the child.
  boot = (f"{preamble}\nimport runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
          f"sys.argv = {args!r}; runpy.run_module('launch.train', run_name='__main__')")
  proc = subprocess.Popen([sys.executable, "-c", boot], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, RUN_TAG: str(workdir)},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    deadline = time.time() + 120
    while not (workdir / "metrics.jsonl").exists() or not (workdir / "metrics.jsonl").read_text().strip():
      assert time.time() < deadline and proc.poll() is None, "the run never started logging"
      time.sleep(0.2)
    sent = time.time()
    os.killpg(proc.pid, sig)
    out, _ = proc.communicate(timeout=30)
  finally:
    try:
      os.killpg(proc.pid, signal.SIGKILL)  # Whatever the run left in its group.
    except ProcessLookupError:
      pass
    proc.wait()
  if output is not None:
    output.append(out)
  assert time.time() - sent < 10, out
  assert proc.returncode == 0, out
  assert "leaked shared_memory" not in out, out  # The run removed its blocks; the tracker did not have to.
  summary = json.loads((workdir / "summary.json").read_text())
  assert 0 < summary["env_steps"] < 600_000  # Stopped before the default budget.
  assert str(summary["env_steps"]) in os.listdir(workdir / "checkpoints")
  return summary
