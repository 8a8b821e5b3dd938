"""Soak benchmark: a long ebrl run on MT10, SIGKILLed and resumed on a schedule.

  python -m launch.soak --minutes=30 --out=soak.json

Short runs cannot show a slow leak, a hang that takes minutes to set in, or a
checkpoint that only fails to restore after the fifth crash. This runs
`launch.train` (MetaWorld/MT10, scheduler=ebrl, `--num_envs` envs, a step
budget no soak reaches) in `--workdir`, checkpointing every
`--checkpoint_every_s`, and SIGKILLs it every `--kill_every_s` of soak time,
relaunching with `--config.resume=True` each time. A kill waits until the
launch has committed a checkpoint of its own, and one that would leave the last
launch less than `--steady_s` is skipped, so the last launch reaches steady
state. After `--minutes` the last launch is stopped with SIGINT and waited
for, as a user stops a run. A launch that writes no new metrics row for
`--hang_s` is killed, counted as hung and relaunched.

The resident memory (VmRSS) of each launch and its children is sampled every
`--sample_every_s`. Reported per launch: the env steps it resumed from (and
whether that was exactly the newest committed checkpoint), its end env steps
(last metrics row and newest checkpoint), its RSS at its first metrics row,
`--steady_s` into its life and at its end, and its RSS growth per minute from
`--steady_s` on. Overall: RSS at the start and end of the soak compared like
with like (the first launch `--steady_s` into its life against the last launch
just before it is stopped) and whether the end is within 10% of the start
(only growth counts: a leak grows), the largest per-launch growth rate (one
process throughout, so free of the launch-to-launch spread, which is itself
about 10% on MT10 here), whether env steps were monotone across resumes, the
hangs, and how many resumes succeeded. Written to `--out` as JSON (rewritten
after every launch, so a soak cut short still leaves its figures) and printed
as a table; each launch's output is kept in
`<workdir>/soak_logs/<soak start time>/`.

`--faults` injects other faults than the SIGKILL of the whole launch, each
planned kill taking the next of a shuffled cycle of the listed kinds (seeded by
`--seed`, so every kind comes equally often): `sigterm_group` (SIGTERM to the
launch's process group, as `timeout`, scancel or preemption send it),
`sigkill_child` (the learner process alone; needs
`--config.placement=processes`), `sigkill_parent` (the training process
alone), `exception` (an exception raised in the generation loop, through
launch.fault_train), `double_ctrl_c` (two SIGINTs to the group, 0.3 s apart)
and `sigkill_group` (the default). After each, the launch's process group and
its /dev/shm blocks get `--grace_s` to go; what is still there is counted as
left over (and then killed). `--max_faults` ends the soak after that many
faults and one more launch that resumes, checkpoints and is stopped with SIGINT.

`--train_args` passes further `launch.train` flags (e.g. smaller configs for a
quick check); the soak owns `--workdir`, `--config.resume` and
`--config.total_env_steps`. `--train_module` swaps in a drop-in for
`launch.train` (a stand-in that hangs or crashes exercises those paths).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time

from absl import flags

from launch import common
from ebrl.errors import UserError
from ebrl.transport import shm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_MINUTES = flags.DEFINE_float("minutes", 30.0, "How long the soak runs.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: a fresh runs/soak-<time>).")
_RESUME = flags.DEFINE_bool("resume", False, "Continue a used --workdir from its checkpoints.")
_ENV = flags.DEFINE_string("env", "MetaWorld/MT10", "Env name.")
_NUM_ENVS = flags.DEFINE_integer("num_envs", 32, "Envs.")
_CHECKPOINT_EVERY_S = flags.DEFINE_float("checkpoint_every_s", 60.0, "Checkpoint interval of every launch.")
_KILL_EVERY_S = flags.DEFINE_float("kill_every_s", 300.0, "One SIGKILL and resume per this many seconds of soak.")
_HANG_S = flags.DEFINE_float("hang_s", 120.0, "A launch with no new metrics row for this long is hung.")
_SAMPLE_EVERY_S = flags.DEFINE_float("sample_every_s", 5.0, "RSS sampling interval.")
_STEADY_S = flags.DEFINE_float("steady_s", 60.0, "Seconds into a launch at which its RSS counts as steady.")
_STOP_TIMEOUT_S = flags.DEFINE_float("stop_timeout_s", 300.0, "Longest wait for the last launch to exit after SIGINT.")
_TRAIN_ARGS = flags.DEFINE_string("train_args", "", "Further launch.train flags, e.g. '--config.rollout_length=8'.")
_OUT = flags.DEFINE_string("out", "soak.json", "Where to write the JSON results.")
_TRAIN_MODULE = flags.DEFINE_string("train_module", "launch.train",
                                    "Module each launch runs: launch.train, or a drop-in that takes its flags.")
FAULTS = ("sigkill_group", "sigterm_group", "sigkill_child", "sigkill_parent", "exception", "double_ctrl_c")
_FAULTS = flags.DEFINE_list("faults", ["sigkill_group"], f"Faults the planned kills inject; any of {', '.join(FAULTS)}.")
_MAX_FAULTS = flags.DEFINE_integer("max_faults", 0, "End after this many faults and one resumed launch (0: no cap).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the order of the faults.")
_GRACE_S = flags.DEFINE_float("grace_s", 20.0, "How long a faulted launch's processes and /dev/shm blocks may take to go.")

# The soak decides these itself: where the run lives, that relaunches resume, that the budget never ends it.
_OWNED = ("--workdir", "--config.resume", "--config.total_env_steps")
_BUDGET = 10**15  # Env steps no soak reaches: the run must never end on its own.
_RESUMED = re.compile(r"resumed from (\S+) at (\d+) env steps")
_POLL_S = 0.25
_WITHIN = 0.10  # RSS at the end within 10% of the start.


def _positive(name: str, value: float) -> None:
  if not (math.isfinite(value) and value > 0):
    raise UserError(f"--{name}={value} must be a positive finite number")


def _check_out(path: str) -> None:
  """Proves --out can be written before a 30-minute soak, leaving no file behind when there was none."""
  existed = os.path.exists(path)
  try:
    with open(path, "a"):
      pass
  except OSError as e:
    raise UserError(f"--out={path} is not writable ({e.strerror})") from None
  if not existed:
    os.remove(path)


def _train_args(text: str) -> list[str]:
  try:
    args = shlex.split(text)
  except ValueError as e:
    raise UserError(f"--train_args: {e}") from None
  for a in args:
    if not a.startswith("--"):
      raise UserError(f"--train_args: '{a}' is not a flag; pass --<flag>=<value> items")
    if a.split("=", 1)[0] in _OWNED:
      raise UserError(f"--train_args: the soak sets {a.split('=', 1)[0]} itself")
  return args


def _holds_run(path: str) -> bool:
  """Whether a run wrote here (a soak whose first launch failed to start leaves only soak_logs/)."""
  return any(os.path.exists(os.path.join(path, f)) for f in ("config.json", "metrics.jsonl", "summary.json",
                                                              "checkpoints"))


def _workdir(path: str | None, resume: bool, stamp: str) -> tuple[str, str]:
  """The run directory and this soak's log directory in it (a resumed soak keeps the earlier logs)."""
  if path is None:
    path = os.path.join("runs", f"soak-{stamp}")
  path = os.path.abspath(path)
  if _holds_run(path) and not resume:
    raise UserError(f"--workdir={path} is already used; pass --resume to continue it, or another --workdir")
  logs = os.path.join(path, "soak_logs", stamp)
  try:
    os.makedirs(logs, exist_ok=True)
  except OSError as e:
    raise UserError(f"--workdir={path} is not writable ({e.strerror})") from None
  return path, logs


def _listdir(path: str) -> list[str]:
  try:
    return os.listdir(path)
  except FileNotFoundError:
    return []


def committed_steps(ckpt_dir: str) -> list[int]:
  """Checkpoint steps whose save finished (Orbax renames its `N.orbax-checkpoint-tmp` to `N` last)."""
  return sorted(int(n) for n in _listdir(ckpt_dir) if n.isdigit())


def _vm_rss_kb(pid: int) -> int:
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1])
  except (OSError, ValueError, IndexError):
    pass
  return 0


def _descendants(pid: int) -> list[int]:
  """Every live process below `pid` (read from /proc, so children of children count too)."""
  children: dict[int, list[int]] = {}
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])  # The command name may hold spaces and parens.
    except (OSError, ValueError, IndexError):
      continue
    children.setdefault(ppid, []).append(int(name))
  out, todo = [], [pid]
  while todo:
    for c in children.get(todo.pop(), []):
      out.append(c)
      todo.append(c)
  return out


def tree_rss_mb(pid: int) -> float:
  """VmRSS of `pid` plus its descendants' (pages they share count once per process)."""
  return sum(_vm_rss_kb(p) for p in [pid, *_descendants(pid)]) / 1024.0


class _MetricsTail:
  """The metrics.jsonl rows one launch appends, read from where the file ended when it started.

  A resume may rewrite the file without the rows past its checkpoint (work the
  kill lost); then the whole new file is read again, and only rows past the
  resume point are this launch's.
  """

  def __init__(self, path: str):
    self.path = path
    self.inode, self.offset = self._stat()
    self.torn = 0  # Lines that do not parse (a row cut short).

  def _stat(self) -> tuple[int | None, int]:
    try:
      st = os.stat(self.path)
    except FileNotFoundError:
      return None, 0
    return st.st_ino, st.st_size

  def new_rows(self, floor: int) -> list[dict]:
    """Rows appended since the last call; after a rewrite, those of the new file past `floor` env steps."""
    inode, size = self._stat()
    if inode is None:
      return []
    rewritten = self.inode is not None and (inode != self.inode or size < self.offset)
    if rewritten:
      self.offset = 0
    self.inode = inode
    try:
      with open(self.path, "rb") as f:
        f.seek(self.offset)
        data = f.read()
    except FileNotFoundError:
      return []
    end = data.rfind(b"\n") + 1  # Whole lines only; a row being written is read next time.
    self.offset += end
    rows = []
    for line in data[:end].splitlines():
      if line.strip():
        try:
          rows.append(json.loads(line))
        except ValueError:
          self.torn += 1
    return [r for r in rows if int(r["env_steps"]) > floor] if rewritten else rows


class _Launch:
  """One launch.train process in its own process group, watched for progress and memory."""

  def __init__(self, index: int, module: str, args: list[str], workdir: str, logs: str, t0: float,
               steady_s: float):
    self.index, self.t0, self.steady_s = index, t0, steady_s
    self.ckpt_dir = os.path.join(workdir, "checkpoints")
    committed = committed_steps(self.ckpt_dir)
    self.expected_resume = committed[-1] if committed else None
    self.tail = _MetricsTail(os.path.join(workdir, "metrics.jsonl"))
    self.log_path = os.path.join(logs, f"launch-{index:03d}.log")
    self._log = open(self.log_path, "w")
    # Python keeps SIGINT ignored when its parent ignored it (nohup, background jobs): re-arm it so the
    # final SIGINT stops the run as Ctrl-C would.
    boot = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            f"sys.argv = {[module, *args]!r}; runpy.run_module({module!r}, run_name='__main__')")
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    self.started = time.time()
    # Its own session: the soak's Ctrl-C does not reach it unasked, and one killpg ends all it started.
    self.proc = subprocess.Popen([sys.executable, "-c", boot], cwd=ROOT, stdin=subprocess.DEVNULL,
                                 stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"})
    self.resumed_at: int | None = None
    self.first_row_steps: int | None = None
    self.last_row_steps: int | None = None
    self.last_row_t = self.started
    self.rows = 0
    self.rows_monotone = True
    self.samples: list[tuple[float, float]] = []  # (seconds since this launch started, RSS MB)
    self.rss_first_row: float | None = None
    self.ended: str | None = None  # killed | hung | stopped | stop_timeout | exited | interrupted
    self.stop_s: float | None = None
    self.ended_t: float | None = None
    self.kill_delay_s: float | None = None  # How long a planned kill waited for this launch's first checkpoint.
    self.fault: str | None = None  # The fault injected (--faults), and what it left behind.
    self.fault_exit_s: float | None = None
    self.leftover_processes: list[str] | None = None
    self.leftover_blocks: list[str] | None = None

  def checkpointed(self) -> bool:
    """Whether this launch has committed a checkpoint past the one it resumed from.

    A planned kill waits for one: killing a launch still starting up would only
    resume it from the same checkpoint again, and test nothing new.
    """
    committed = committed_steps(self.ckpt_dir)
    return bool(committed) and (self.expected_resume is None or committed[-1] > self.expected_resume)

  def age(self) -> float:
    return time.time() - self.started

  def sample(self) -> float | None:
    if self.exited():
      return None
    mb = tree_rss_mb(self.proc.pid)
    if mb > 0:
      self.samples.append((self.age(), mb))
      return mb
    return None

  def watch(self) -> None:
    """Takes in the rows written since the last call; the first one also fixes the resume point."""
    if self.resumed_at is None and self.rows == 0:
      self._read_resume_line()
    floor = self.resumed_at if self.resumed_at is not None else (self.expected_resume or 0)
    for row in self.tail.new_rows(floor):
      steps = int(row["env_steps"])
      if self.last_row_steps is not None and steps < self.last_row_steps:
        self.rows_monotone = False
      if self.rows == 0:
        self.first_row_steps = steps
        self.rss_first_row = self.sample()
      self.last_row_steps = steps
      self.rows += 1
      self.last_row_t = time.time()

  def _read_resume_line(self) -> None:
    try:
      with open(self.log_path, errors="replace") as f:
        m = _RESUMED.search(f.read())
    except OSError:
      return
    if m:
      self.resumed_at = int(m.group(2))

  def exited(self) -> bool:
    """Whether it has exited, without reaping it: its zombie keeps the process group ours to signal."""
    if self.proc.returncode is not None:
      return True
    try:
      return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
      return True

  def _reap(self) -> None:
    """SIGKILL to whatever is left of its group (children it started), then reaps it."""
    if self.proc.returncode is None:
      try:
        os.killpg(self.proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    self.proc.wait()
    self.ended_t = self.ended_t or time.time()

  def kill(self, why: str) -> None:
    self._reap()
    self.ended = why

  def group(self) -> list[int]:
    """Live processes of this launch's process group (its own session), the launch excluded."""
    out = []
    for name in os.listdir("/proc"):
      if not name.isdigit() or int(name) == self.proc.pid:
        continue
      try:
        with open(f"/proc/{name}/stat") as f:
          fields = f.read().rsplit(")", 1)[1].split()
      except OSError:
        continue
      if int(fields[2]) == self.proc.pid and fields[0] != "Z":
        out.append(int(name))
    return out

  def learner_process(self) -> int | None:
    """The launch's spawned learner process, if it has one."""
    for pid in self.group():
      try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
          cmd = f.read()
        with open(f"/proc/{pid}/stat") as f:
          ppid = int(f.read().rsplit(")", 1)[1].split()[1])
      except OSError:
        continue
      if ppid == self.proc.pid and b"multiprocessing.spawn" in cmd:
        return pid
    return None

  def inject(self, fault: str, wait_s: float, grace_s: float) -> None:
    """Ends the launch with `fault` (see the module's docstring), waits up to `wait_s` for it to
    exit and `grace_s` more for its processes and shared memory to go, and records what was left."""
    pid = self.proc.pid
    sent = time.time()
    if fault == "sigkill_group":  # multiprocessing's resource tracker dies too: its blocks stay.
      os.killpg(pid, signal.SIGKILL)
    elif fault == "sigterm_group":
      os.killpg(pid, signal.SIGTERM)
    elif fault == "sigkill_parent":
      os.kill(pid, signal.SIGKILL)
    elif fault == "sigkill_child":
      child = self.learner_process()
      if child is None:
        raise UserError("--faults=sigkill_child needs a learner process: pass "
                        "--train_args=--config.placement=processes")
      os.kill(child, signal.SIGKILL)
    elif fault == "exception":
      os.kill(pid, signal.SIGUSR1)  # launch.fault_train raises in the generation loop.
    elif fault == "double_ctrl_c":
      os.killpg(pid, signal.SIGINT)
      time.sleep(0.3)
      os.killpg(pid, signal.SIGINT)
    while not self.exited() and time.time() - sent < wait_s:
      time.sleep(0.1)
    self.fault, self.fault_exit_s = fault, time.time() - sent
    deadline = time.time() + grace_s
    while (self.group() or shm.leftover_blocks(pid)) and time.time() < deadline:
      time.sleep(0.2)
    self.leftover_processes = [_cmdline(p) for p in self.group()]
    self.leftover_blocks = shm.leftover_blocks(pid)
    self.kill("killed")

  def stop(self, timeout_s: float) -> None:
    """SIGINT, as a user's Ctrl-C; SIGKILL if it has not exited within `timeout_s`."""
    self.sample()  # The end-of-soak figure, before the final checkpoint and plots allocate.
    sent = time.time()
    try:
      os.kill(self.proc.pid, signal.SIGINT)
    except ProcessLookupError:
      pass
    while not self.exited() and time.time() - sent < timeout_s:
      time.sleep(0.1)
    self.ended = "stopped" if self.exited() else "stop_timeout"
    self._reap()
    self.stop_s = time.time() - sent

  def close(self) -> None:
    if self._log.closed:
      return
    if self.ended is None:
      self.ended = "exited" if self.exited() else "interrupted"
    self._reap()
    self.watch()
    self._read_resume_line()
    self._log.close()

  def start_steps(self) -> int:
    return self.resumed_at if self.resumed_at is not None else 0

  def steady_rss(self, steady_s: float) -> tuple[float, float] | None:
    """The first sample `steady_s` into the launch, else its last one (a launch that ended sooner)."""
    later = [s for s in self.samples if s[0] >= steady_s]
    return later[0] if later else (self.samples[-1] if self.samples else None)

  def report(self) -> dict:
    committed = committed_steps(self.ckpt_dir)
    is_resume = self.expected_resume is not None or self.index > 0
    rss = [mb for _, mb in self.samples]
    steady = self.steady_rss(self.steady_s)
    growth = None  # Within one process: a leak shows here without launch-to-launch variance.
    if steady and self.samples and self.samples[-1][0] - steady[0] >= 10.0:
      growth = (self.samples[-1][1] - steady[1]) / (self.samples[-1][0] - steady[0]) * 60.0
    return {
        "index": self.index, "pid": self.proc.pid, "start_s": self.started - self.t0,
        "duration_s": (self.ended_t or time.time()) - self.started,
        "ended": self.ended, "returncode": self.proc.returncode, "log": self.log_path,
        "resume": is_resume, "expected_resume_env_steps": self.expected_resume,
        "resumed_from_env_steps": self.resumed_at,
        "resume_ok": (self.resumed_at == self.expected_resume and self.rows > 0) if is_resume else None,
        "start_env_steps": self.start_steps(), "first_row_env_steps": self.first_row_steps,
        "end_env_steps": self.last_row_steps, "end_checkpoint_env_steps": committed[-1] if committed else None,
        "metrics_rows": self.rows, "torn_rows": self.tail.torn, "rows_monotone": self.rows_monotone,
        "rss_first_row_mb": self.rss_first_row, "rss_steady_mb": steady[1] if steady else None,
        "rss_end_mb": rss[-1] if rss else None, "rss_growth_mb_per_min": growth,
        "rss_max_mb": max(rss) if rss else None, "rss_samples": len(rss), "stop_s": self.stop_s,
        "kill_delay_s": self.kill_delay_s, "fault": self.fault, "fault_exit_s": self.fault_exit_s,
        "leftover_processes": self.leftover_processes, "leftover_blocks": self.leftover_blocks,
        "fault_outcome": _fault_outcome(self.fault, self.proc.returncode, self.log_path) if self.fault else None,
    }


def _cmdline(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
  except OSError:
    return str(pid)
  return f"{pid}: {cmd[:200]}"


# What each fault must end in: the exit status, and the run's last line where it says something.
_EXPECTED = {"sigkill_group": (-signal.SIGKILL, None), "sigkill_parent": (-signal.SIGKILL, None),
             "sigterm_group": (0, "outputs in "), "sigkill_child": (1, "error: learner process"),
             "exception": (1, "InjectedFault"), "double_ctrl_c": (-signal.SIGINT, None)}


def _fault_outcome(fault: str, returncode: int | None, log_path: str) -> dict:
  """Whether the launch ended as `fault` should end it (its exit status and last line)."""
  code, last = _EXPECTED[fault]
  try:
    with open(log_path, errors="replace") as f:
      lines = [l.strip() for l in f.read().splitlines() if l.strip()]
  except OSError:
    lines = []
  said = lines[-1] if lines else ""
  ok = returncode == code and (last is None or last in said)
  return {"expected_returncode": code, "last_line": said[:300], "as_expected": ok}


def _monotone(launches: list[dict]) -> bool:
  """Every resume starts where the newest checkpoint was, none behind the one before; rows only go up."""
  ok = all(l["rows_monotone"] and l["torn_rows"] == 0 for l in launches)
  for l in launches:
    if l["first_row_env_steps"] is not None and l["first_row_env_steps"] < l["start_env_steps"]:
      ok = False
  for a, b in zip(launches, launches[1:]):
    ok = ok and b["start_env_steps"] >= a["start_env_steps"]
    if a["end_checkpoint_env_steps"] is not None:
      ok = ok and b["start_env_steps"] >= a["end_checkpoint_env_steps"]
  return ok


def _overall(launches: list[_Launch], reports: list[dict], wall_s: float) -> dict:
  first, last = launches[0], launches[-1]
  start = first.steady_rss(first.steady_s)
  end = last.samples[-1] if last.samples else None
  change = end[1] / start[1] - 1.0 if start and end else None
  resumes = [r for r in reports if r["resume"]]
  growths = [r["rss_growth_mb_per_min"] for r in reports if r["rss_growth_mb_per_min"] is not None]
  return {
      "wall_s": wall_s, "launches": len(reports),
      "kills": sum(r["ended"] == "killed" for r in reports),
      "hangs": sum(r["ended"] == "hung" for r in reports),
      "exited_on_their_own": sum(r["ended"] == "exited" for r in reports),
      "resumes": len(resumes), "resumes_succeeded": sum(bool(r["resume_ok"]) for r in resumes),
      "env_steps_monotone": _monotone(reports),
      "start_env_steps": reports[0]["start_env_steps"],
      "end_env_steps": max([r["end_env_steps"] or 0 for r in reports] + [r["end_checkpoint_env_steps"] or 0
                                                                          for r in reports]),
      "rss_start_mb": start[1] if start else None, "rss_start_at_s": start[0] if start else None,
      "rss_end_mb": end[1] if end else None, "rss_end_at_s": end[0] if end else None,
      "rss_end_steady": bool(end and end[0] >= last.steady_s),
      # A leak shows as growth; a lower end is no leak, so only growth counts against the 10%.
      "rss_change": change, "rss_within_10pct": change <= _WITHIN if change is not None else None,
      "rss_growth_mb_per_min_max": max(growths) if growths else None,
      # Saves a SIGKILL cut short: Orbax leaves their temporary directories, and nothing removes them.
      "orbax_tmp_dirs_left": sorted(n for n in _listdir(first.ckpt_dir) if ".orbax-checkpoint-tmp" in n),
      "final_stop": {"ended": last.ended, "returncode": last.proc.returncode, "stop_s": last.stop_s,
                     "clean": last.ended == "stopped" and last.proc.returncode == 0},
      **_fault_totals(reports),
  }


def _fault_totals(reports: list[dict]) -> dict:
  faulted = [r for r in reports if r["fault"]]
  if not faulted:
    return {}
  def resumed(r: dict) -> bool:  # The next launch restored exactly the newest checkpoint.
    return r["index"] + 1 < len(reports) and bool(reports[r["index"] + 1]["resume_ok"])

  return {
      "faults": len(faulted),
      "faults_by_kind": {k: sum(r["fault"] == k for r in faulted) for k in FAULTS if any(r["fault"] == k for r in faulted)},
      "faults_as_expected": sum(r["fault_outcome"]["as_expected"] for r in faulted),
      "runs_resumed": sum(resumed(r) for r in faulted),
      "leftover_processes": sum(len(r["leftover_processes"] or []) for r in faulted),
      "leftover_blocks": sum(len(r["leftover_blocks"] or []) for r in faulted),
  }


def _write(path: str, obj: dict) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)


def _mb(x: float | None) -> str:
  return f"{x:,.0f} MB" if x is not None else "-"


def _steps(x: int | None) -> str:
  return f"{x:,}" if x is not None else "-"


def _print_table(out: dict) -> None:
  print(f"\n{'launch':<8}{'ended':<10}{'start steps':>13}{'end steps':>13}{'ckpt steps':>13}"
        f"{'rss 1st row':>13}{'rss end':>11}{'MB/min':>8}  resume")
  for r in out["launches"]:
    resume = ("fresh" if not r["resume"] else "ok" if r["resume_ok"]
              else f"FAILED (expected {r['expected_resume_env_steps']}, got {r['resumed_from_env_steps']})")
    growth = r["rss_growth_mb_per_min"]
    print(f"{r['index']:<8}{r['ended'] or '-':<10}{_steps(r['start_env_steps']):>13}{_steps(r['end_env_steps']):>13}"
          f"{_steps(r['end_checkpoint_env_steps']):>13}{_mb(r['rss_first_row_mb']):>13}{_mb(r['rss_end_mb']):>11}"
          f"{f'{growth:+.1f}' if growth is not None else '-':>8}  {resume}")
  o = out["overall"]
  change = f"{o['rss_change']:+.1%}" if o["rss_change"] is not None else "-"
  if o.get("faults"):
    print(f"faults: {o['faults']} ({', '.join(f'{k} {n}' for k, n in o['faults_by_kind'].items())}); ended as "
          f"expected: {o['faults_as_expected']}/{o['faults']}; runs resumed: {o['runs_resumed']}/{o['faults']}; "
          f"left over: {o['leftover_processes']} processes, {o['leftover_blocks']} /dev/shm blocks")
  print(f"RSS {_mb(o['rss_start_mb'])} -> {_mb(o['rss_end_mb'])} ({change}; within 10%: "
        f"{'yes' if o['rss_within_10pct'] else 'no'}); env steps monotone: "
        f"{'yes' if o['env_steps_monotone'] else 'no'}; hangs: {o['hangs']}; "
        f"resumes succeeded: {o['resumes_succeeded']}/{o['resumes']}; "
        f"final stop: {'clean' if o['final_stop']['clean'] else o['final_stop']['ended']}")


def _kill_times(t0: float, minutes: float, every_s: float, steady_s: float) -> list[float]:
  """Every `every_s` of soak, skipping those after which the last launch could not reach steady state."""
  deadline, times, k = t0 + minutes * 60.0, [], 1
  while t0 + k * every_s + steady_s <= deadline:
    times.append(t0 + k * every_s)
    k += 1
  return times


def _terminate(signum, frame) -> None:
  """SIGTERM ends the soak as Ctrl-C does: the running launch is stopped and the report still written."""
  del signum, frame
  raise KeyboardInterrupt


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; pass launch.train flags through --train_args")
  for name, flag in (("minutes", _MINUTES), ("checkpoint_every_s", _CHECKPOINT_EVERY_S),
                     ("kill_every_s", _KILL_EVERY_S), ("hang_s", _HANG_S), ("sample_every_s", _SAMPLE_EVERY_S),
                     ("steady_s", _STEADY_S), ("stop_timeout_s", _STOP_TIMEOUT_S)):
    _positive(name, flag.value)
  if _NUM_ENVS.value <= 0:
    raise UserError(f"--num_envs={_NUM_ENVS.value} must be positive")
  extra = _train_args(_TRAIN_ARGS.value)
  bad = [f for f in _FAULTS.value if f not in FAULTS]
  if bad or not _FAULTS.value:
    raise UserError(f"--faults={','.join(_FAULTS.value)}: unknown {', '.join(bad) or 'empty list'}; valid: "
                    f"{', '.join(FAULTS)}")
  if _MAX_FAULTS.value < 0:
    raise UserError(f"--max_faults={_MAX_FAULTS.value} must be >= 0 (0: no cap)")
  _positive("grace_s", _GRACE_S.value)
  module = _TRAIN_MODULE.value
  if "exception" in _FAULTS.value and module == "launch.train":
    module = "launch.fault_train"  # launch.train, with SIGUSR1 raising in the generation loop.
  rng = random.Random(_SEED.value)
  cycle: list[str] = []

  def next_fault() -> str:
    if not cycle:  # A shuffled round of every kind: random order, each kind equally often.
      cycle.extend(rng.sample(_FAULTS.value, len(_FAULTS.value)))
    return cycle.pop()

  out_path = os.path.abspath(_OUT.value)
  _check_out(out_path)
  workdir, logs = _workdir(_WORKDIR.value, _RESUME.value, datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
  # Every launch passes resume=True: the first one then continues a --resume workdir or starts an empty one.
  args = ["--progress=false", f"--workdir={workdir}", "--config.resume=True", f"--config.env.name={_ENV.value}",
          "--config.scheduler=ebrl", f"--config.num_envs={_NUM_ENVS.value}",
          f"--config.checkpoint_every_s={_CHECKPOINT_EVERY_S.value}", *extra,
          f"--config.total_env_steps={_BUDGET}"]
  signal.signal(signal.SIGTERM, _terminate)
  t0 = time.time()
  deadline = t0 + _MINUTES.value * 60.0
  kills = _kill_times(t0, _MINUTES.value, _KILL_EVERY_S.value, _STEADY_S.value)
  planned = min(len(kills), _MAX_FAULTS.value or len(kills))
  what = "SIGKILL" if _FAULTS.value == ["sigkill_group"] else f"faults ({', '.join(_FAULTS.value)})"
  print(f"[soak] {_MINUTES.value:g} min in {workdir}: up to {planned} {what} + resume, "
        f"checkpoints every {_CHECKPOINT_EVERY_S.value:g} s", flush=True)
  out = {"env": _ENV.value, "scheduler": "ebrl", "num_envs": _NUM_ENVS.value, "minutes": _MINUTES.value,
         "checkpoint_every_s": _CHECKPOINT_EVERY_S.value, "kill_every_s": _KILL_EVERY_S.value,
         "hang_s": _HANG_S.value, "steady_s": _STEADY_S.value, "workdir": workdir,
         "train_argv": [module, *args], "faults": _FAULTS.value, "seed": _SEED.value,
         "date": datetime.datetime.fromtimestamp(t0).isoformat("T", "seconds"),
         "interrupted": False, "launches": [], "overall": None}
  launches: list[_Launch] = []
  failures_in_a_row = faults = 0
  finishing = False  # --max_faults reached: one more launch resumes, checkpoints, runs steady_s and stops.
  try:
    while time.time() < deadline and failures_in_a_row < 3:
      launch = _Launch(len(launches), module, args, workdir, logs, t0, _STEADY_S.value)
      launches.append(launch)
      print(f"[soak] launch {launch.index} at {launch.started - t0:.0f} s (pid {launch.proc.pid}); "
            f"newest checkpoint: {launch.expected_resume}", flush=True)
      next_sample = launch.started + _SAMPLE_EVERY_S.value
      while launch.ended is None:
        time.sleep(_POLL_S)
        now = time.time()
        launch.watch()
        if now >= next_sample:
          launch.sample()
          next_sample = now + _SAMPLE_EVERY_S.value
        if launch.exited():
          launch.ended = "exited"
        elif now >= deadline:
          launch.stop(_STOP_TIMEOUT_S.value)
        elif finishing and launch.rows > 0 and launch.checkpointed() and launch.age() >= _STEADY_S.value:
          launch.stop(_STOP_TIMEOUT_S.value)  # Not on a clock: a slow start must still resume and checkpoint.
        elif now - launch.last_row_t > _HANG_S.value:
          launch.kill("hung")
        elif kills and now >= kills[0]:
          if deadline - now < _STEADY_S.value:
            kills.clear()  # Too late: the last launch would end before its RSS is steady.
          elif launch.checkpointed():
            launch.kill_delay_s = now - kills.pop(0)
            launch.inject(next_fault(), _STOP_TIMEOUT_S.value, _GRACE_S.value)
            faults += 1
            if _MAX_FAULTS.value and faults >= _MAX_FAULTS.value:  # One more launch: resume, checkpoint, stop.
              kills.clear()
              finishing = True
      launch.close()
      report = launch.report()
      out["launches"].append(report)
      failures_in_a_row = failures_in_a_row + 1 if report["ended"] == "exited" else 0
      if report["ended"] == "exited" and launch.index == 0 and report["metrics_rows"] == 0:
        with open(launch.log_path, errors="replace") as f:
          last = [l for l in f.read().splitlines() if l.strip()][-1:]
        raise UserError(f"{module} exited with {report['returncode']} before training: "
                        f"{last[0] if last else '(no output)'}; see {launch.log_path}")
      print(f"[soak] launch {launch.index} {report['ended']} after {report['duration_s']:.0f} s at "
            f"{_steps(report['end_env_steps'])} env steps, RSS {_mb(report['rss_end_mb'])}", flush=True)
      out["overall"] = _overall(launches, out["launches"], time.time() - t0)
      _write(out_path, out)
      if finishing and not report["fault"]:
        break
  except KeyboardInterrupt:
    out["interrupted"] = True
    if launches and launches[-1].ended is None:
      launches[-1].stop(_STOP_TIMEOUT_S.value)
  finally:
    for launch in launches:
      launch.close()
  if launches and len(out["launches"]) < len(launches):
    out["launches"].append(launches[-1].report())
  if not out["launches"]:
    return
  out["overall"] = _overall(launches, out["launches"], time.time() - t0)
  _write(out_path, out)
  _print_table(out)
  print(f"written {out_path}")


if __name__ == "__main__":
  common.run(main)
