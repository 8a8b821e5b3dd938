"""SIGKILL in the middle of checkpoint writes never costs a resume.

A checkpoint is only as good as the launch that reads it after a crash. Each
test trains a tiny run that checkpoints every 50 ms, so most of its time is
spent inside Orbax saves (temporary directory written, renamed, old steps
deleted), and kills it with SIGKILL at seeded random moments, many times over.
After every kill the committed checkpoints on disk (step directories; Orbax's
`<step>.orbax-checkpoint-tmp` directories are work in progress) decide where
the next launch must resume: exactly at the newest one, never behind an
earlier launch, never with a corrupt-checkpoint warning.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from ebrl.transport import shm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# orbax-checkpoint 0.12.8 writes step N into "N.orbax-checkpoint-tmp" (older releases append
# "-<timestamp>") and renames it to "N" once every file is in place.
ORBAX_TMP_MARK = ".orbax-checkpoint-tmp"
RESUMED = re.compile(r"resumed from (\S+) at (\d+) env steps")
TINY = ["--config.num_envs=8", "--config.rollout_length=8", "--config.policy.hidden=(16,16)",
        "--config.algorithm.epochs=1", "--config.algorithm.num_minibatches=2",
        "--config.checkpoint_every_s=0.05", "--config.log_every_s=0.2", "--config.total_env_steps=10000000"]
START_TIMEOUT_S = 90.0  # One launch's imports, env start and cached compiles, on a busy 2-core machine.


def committed_steps(ckpt_dir: str) -> list[int]:
  """Steps whose save finished: Orbax renames the temporary directory to the bare step number last."""
  try:
    names = os.listdir(ckpt_dir)
  except FileNotFoundError:
    return []
  return sorted(int(n) for n in names if n.isdigit() and os.path.isdir(os.path.join(ckpt_dir, n)))


def temporary_dirs(ckpt_dir: str) -> list[str]:
  try:
    return sorted(n for n in os.listdir(ckpt_dir) if ORBAX_TMP_MARK in n)
  except FileNotFoundError:
    return []


class Launch:
  """One `launch.train` process in its own session, its output collected by a thread.

  Its own session (process group) lets one killpg take down anything it started, so
  no test leaves an orphan behind.
  """

  def __init__(self, workdir: str, extra: list[str], resume: bool):
    args = ["launch.train", "--progress=false", f"--workdir={workdir}", f"--config.resume={resume}", *TINY, *extra]
    # Python keeps SIGINT ignored when its parent ignored it (background jobs): re-arm it for the clean stop.
    boot = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            f"sys.argv = {args!r}; runpy.run_module('launch.train', run_name='__main__')")
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    self.proc = subprocess.Popen([sys.executable, "-c", boot], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)
    self.pgid = self.proc.pid
    self.lines: list[str] = []
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self) -> None:
    for line in self.proc.stdout:
      self.lines.append(line.rstrip("\n"))

  def output(self) -> str:
    return "\n".join(self.lines[-60:])

  def resumed_at(self) -> tuple[str, int] | None:
    for line in list(self.lines):
      m = RESUMED.search(line)
      if m:
        return m.group(1), int(m.group(2))
    return None

  def kill(self) -> None:
    """SIGKILL to the whole process group; returns once the launch is reaped and its output read."""
    try:
      os.killpg(self.pgid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    self.proc.wait(timeout=30)
    self._reader.join(timeout=10)

  def group_alive(self) -> bool:
    try:
      os.killpg(self.pgid, 0)
    except ProcessLookupError:
      return False
    except PermissionError:
      return True
    return True


def _wait_for(launch: Launch, what: str, ready, timeout_s: float, poll_s: float = 0.005):
  deadline = time.time() + timeout_s
  while True:
    got = ready()
    if got:
      return got
    assert launch.proc.poll() is None, f"launch exited ({launch.proc.returncode}) before {what}:\n{launch.output()}"
    assert time.time() < deadline, f"no {what} within {timeout_s:.0f} s:\n{launch.output()}"
    time.sleep(poll_s)


def _kill_mid_checkpoint(launch: Launch, ckpt_dir: str, rng: random.Random, after: int) -> str:
  """Waits for a checkpoint past `after` to commit, then SIGKILLs at a seeded random moment.

  Half the kills wait for the next save to open its temporary directory and land a
  random few milliseconds into it (mid-write, the rename, or the deletion of the
  oldest step that follows); the others land anywhere in the next 0.6 s.
  """
  _wait_for(launch, f"a checkpoint past {after} env steps", lambda: any(s > after for s in committed_steps(ckpt_dir)),
            START_TIMEOUT_S)
  if rng.random() < 0.5:
    stale = set(temporary_dirs(ckpt_dir))  # Left by earlier kills: not this launch's write.
    _wait_for(launch, "the next checkpoint write", lambda: set(temporary_dirs(ckpt_dir)) - stale, 30.0,
              poll_s=0.001)
    time.sleep(rng.uniform(0.0, 0.1))
    how = "mid-save"
  else:
    time.sleep(rng.uniform(0.0, 0.6))
    how = "anytime"
  assert launch.proc.poll() is None, f"launch exited on its own:\n{launch.output()}"
  launch.kill()
  return how


def _metric_rows(path: str) -> list[dict]:
  """Every row of metrics.jsonl; a torn row (a kill mid-line) fails json.loads here."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _shm() -> set[str]:
  """EBRL's blocks in /dev/shm (ebrl/transport/shm.py names each after the pid that made it)."""
  return set(shm.leftover_blocks())


def crash_resume_rounds(tmp_path, scheduler: str, seed: int, budget_s: float, min_kills: int) -> dict:
  """Kill-and-resume rounds until `budget_s` has passed; the last launch is stopped cleanly with SIGINT."""
  rng = random.Random(seed)
  workdir = str(tmp_path / "run")
  ckpt_dir = os.path.join(workdir, "checkpoints")
  metrics = os.path.join(workdir, "metrics.jsonl")
  extra = [f"--config.scheduler={scheduler}"]
  shm_before = _shm()
  launches: list[Launch] = []
  resumes: list[int] = []  # The env steps every relaunch resumed at, in order.
  kinds: list[str] = []
  left_behind: set[str] = set()
  own_from = 0  # Rows of metrics.jsonl before this index are earlier launches' (a resume may drop some).
  start = time.time()
  try:
    launch = Launch(workdir, extra, resume=False)
    launches.append(launch)
    resumed = 0
    while True:
      kinds.append(_kill_mid_checkpoint(launch, ckpt_dir, rng, after=resumed))
      steps = committed_steps(ckpt_dir)
      assert steps and steps[-1] > resumed, (steps, resumed)  # A committed checkpoint never disappears.
      left_behind.update(temporary_dirs(ckpt_dir))
      env_steps = [r["env_steps"] for r in _metric_rows(metrics)[own_from:]]
      assert env_steps == sorted(env_steps) and all(s > resumed for s in env_steps), (resumed, env_steps)

      launch = Launch(workdir, extra, resume=True)
      launches.append(launch)
      path, at = _wait_for(launch, "the 'resumed from' line", launch.resumed_at, START_TIMEOUT_S)
      assert at == steps[-1], f"resumed at {at}, newest committed checkpoint {steps[-1]} (all: {steps})"
      assert os.path.samefile(path, os.path.join(ckpt_dir, str(steps[-1]))), path
      assert at >= resumed  # Env steps never go backwards across launches.
      resumes.append(at)
      resumed = at
      # Printed once the run has settled its metrics.jsonl, long before its first update logs a row.
      own_from = len(_metric_rows(metrics))
      if len(resumes) >= min_kills and time.time() - start > budget_s:
        break

    # The last launch, after all those crashes, still ends cleanly with its final checkpoint and summary.
    _wait_for(launch, f"a checkpoint past {resumed} env steps",
              lambda: any(s > resumed for s in committed_steps(ckpt_dir)), START_TIMEOUT_S)
    launch.proc.send_signal(signal.SIGINT)
    launch.proc.wait(timeout=60)
    launch._reader.join(timeout=10)  # pylint: disable=protected-access
    assert launch.proc.returncode == 0, launch.output()
    env_steps = [r["env_steps"] for r in _metric_rows(metrics)[own_from:]]
    assert env_steps and env_steps == sorted(env_steps) and env_steps[0] > resumed, (resumed, env_steps)
    corrupt = [line for l in launches for line in l.lines if "corrupt" in line]
    assert not corrupt, corrupt
  finally:
    for l in launches:
      if l.proc.poll() is None or l.group_alive():
        l.kill()
  assert not any(l.group_alive() for l in launches), "a launch left a process behind"
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  assert summary["env_steps"] >= resumes[-1]
  assert committed_steps(ckpt_dir)[-1] == summary["env_steps"]
  # Blocks of live owners are other tests' (the suite runs in parallel); every launch here has exited.
  assert shm.orphaned(_shm() - shm_before) == set(), "shared memory left in /dev/shm"
  return {"resumes": resumes, "kinds": kinds, "left_behind": sorted(left_behind),
          "tmp_at_end": temporary_dirs(ckpt_dir), "wall_s": time.time() - start}


@pytest.mark.slow  # The same kills during the same Orbax writes as the ebrl run below.
def test_sigkill_during_checkpoint_writes_sync(tmp_path):
  out = crash_resume_rounds(tmp_path, "sync", seed=1234, budget_s=30.0, min_kills=6)
  assert out["resumes"] == sorted(set(out["resumes"]))  # Every launch moved the run on.
  assert "mid-save" in out["kinds"]
  print(json.dumps(out))


def test_sigkill_during_checkpoint_writes_ebrl(tmp_path):
  out = crash_resume_rounds(tmp_path, "ebrl", seed=4321, budget_s=15.0, min_kills=3)
  assert out["resumes"] == sorted(set(out["resumes"]))
  print(json.dumps(out))
