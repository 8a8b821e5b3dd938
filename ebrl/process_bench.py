"""One run over 1 process against the same run over N processes, side by side in one invocation.

Why a bench of its own: a run over several processes is several programs
(launch.multiprocess starts them), so it cannot be timed inside one process the
way ebrl/benchmark.py times schedulers. Each entry is a real training run
(`launch.train` through `launch.multiprocess`) with the same total envs; its
rate is read from the run's own metrics rows (the run's env steps, summed over
its processes, against process 0's wall clock), between the first row (start-up
and the first compiles are over) and the last one, written after SIGTERM
stopped every process at the same update `seconds` later. Rounds interleave the
entries (1, N, 1, N, ...) so slow drifts of the machine hit all alike.

`slow_share` < 1 adds, for every N > 1, an entry whose last process is made a
slow host: it runs only `slow_share` of every 200 ms (SIGSTOP / SIGCONT from
here), so the entry shows how much of the slow host's pace the whole run takes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Sequence

from ebrl.errors import UserError
from ebrl.telemetry.writers import read_jsonl, write_json

_STARTUP_S = 600.0  # The longest an entry may take to write its first metrics row.


@dataclasses.dataclass(frozen=True)
class ProcessBenchSpec:
  env: str
  policy: str
  schedulers: tuple[str, ...]
  processes: tuple[int, ...]
  num_envs: int
  seconds: float
  rounds: int
  out: str
  config_flags: tuple[str, ...] = ()  # --config.<key>=<value> for every entry.
  slow_share: float = 1.0  # < 1: also each N > 1 with its last process running this share of the time.

  def check(self) -> None:
    if not self.processes or any(n < 1 for n in self.processes):
      raise UserError(f"--processes={','.join(map(str, self.processes))} must be process counts >= 1, e.g. 1,2")
    for n in self.processes:
      if self.num_envs % n:
        raise UserError(f"--num_envs={self.num_envs} must be divisible by every count in --processes (not {n})")
    unsupported = [s for s in self.schedulers if s not in ("sync", "ebrl")]
    if unsupported:
      raise UserError(f"--schedulers={','.join(self.schedulers)}: over several processes only sync and ebrl run")
    if not (math.isfinite(self.seconds) and self.seconds > 0):
      raise UserError(f"--seconds={self.seconds} must be a finite number > 0")
    if not 0 < self.slow_share <= 1:
      raise UserError(f"--slow_share={self.slow_share} must be in (0, 1] (1: no slow process)")
    if self.rounds < 1:
      raise UserError(f"--rounds={self.rounds} must be an integer >= 1")


def _window(rows: list[dict]) -> dict:
  """The rate between the first and the last metrics row of a run."""
  if len(rows) < 2:
    raise RuntimeError(f"a bench entry wrote {len(rows)} metrics rows; it needs two (a longer --seconds)")
  first, last = rows[0], rows[-1]
  dt = last["wall_s"] - first["wall_s"]
  return {"env_steps": last["env_steps"] - first["env_steps"], "seconds": dt,
          "updates": last["policy_version"] - first["policy_version"],
          "env_steps_per_s": (last["env_steps"] - first["env_steps"]) / dt,
          "updates_per_s": (last["policy_version"] - first["policy_version"]) / dt}


_SLOW_PERIOD_S = 0.2


def _slow_down(pid: int, share: float, stop: threading.Event) -> None:
  """Lets process `pid` run `share` of every _SLOW_PERIOD_S until `stop` (then lets it run)."""
  try:
    while not stop.is_set():
      os.kill(pid, signal.SIGCONT)
      time.sleep(_SLOW_PERIOD_S * share)
      os.kill(pid, signal.SIGSTOP)
      time.sleep(_SLOW_PERIOD_S * (1 - share))
  except ProcessLookupError:
    return
  finally:
    try:
      os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
      pass


def process_pid(launcher: subprocess.Popen, index: int) -> int:
  """The pid of the launcher's process `index` (its command line carries --process_id=<index>)."""
  children = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split()
  for pid in children:
    with open(f"/proc/{pid}/cmdline") as f:
      if f"--process_id={index}" in f.read().split("\0"):
        return int(pid)
  raise RuntimeError(f"no process {index} among the launcher's children {children}")


def _run_entry(spec: ProcessBenchSpec, scheduler: str, processes: int, workdir: str, root: str,
               slow: bool = False) -> dict:
  metrics = os.path.join(workdir, "metrics.jsonl")
  cmd = [sys.executable, "-m", "launch.multiprocess", f"--num_processes={processes}", "--",
         f"--config.env.name={spec.env}", f"--config.policy.name={spec.policy}", f"--config.scheduler={scheduler}",
         f"--config.num_envs={spec.num_envs}", "--config.total_env_steps=1000000000", "--config.log_every_s=1",
         "--config.checkpoint_every_s=1e9", *spec.config_flags, f"--workdir={workdir}", "--progress=false"]
  proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
  try:
    deadline = time.monotonic() + _STARTUP_S
    while not (os.path.exists(metrics) and read_jsonl(metrics)):
      if proc.poll() is not None or time.monotonic() > deadline:
        out = proc.communicate()[0] if proc.poll() is not None else ""
        raise RuntimeError(f"{scheduler} over {processes} process(es) did not start training: {out[-2000:]}")
      time.sleep(0.5)
    stop_slowing = threading.Event()
    slower = None
    if slow:
      rows_before = len(read_jsonl(metrics))
      slower = threading.Thread(target=_slow_down, args=(process_pid(proc, processes - 1), spec.slow_share,
                                                          stop_slowing), daemon=True)
      slower.start()
    time.sleep(spec.seconds)
    stop_slowing.set()
    if slower is not None:
      slower.join()
    proc.send_signal(signal.SIGTERM)  # Every process stops after the same update; the last row is written.
    out = proc.communicate(timeout=300)[0]
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  if proc.returncode not in (0, 128 + signal.SIGTERM):
    raise RuntimeError(f"{scheduler} over {processes} process(es) exited with {proc.returncode}: {out[-2000:]}")
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  rows = read_jsonl(metrics)
  if slow:  # From the last row before the slowing began.
    rows = rows[rows_before - 1:]
  return {**_window(rows), "stage_busy": summary["stage_busy"],
          "params_sha256_by_process": summary["params_sha256_by_process"]}


def run_process_bench(spec: ProcessBenchSpec, root: str, machine: dict, log: Callable[[str], None] = print) -> dict:
  """Every scheduler over every process count, `rounds` times interleaved; writes and returns the JSON."""
  spec.check()
  rounds: dict[str, list[dict]] = {}
  with tempfile.TemporaryDirectory(prefix="ebrl-process-bench-") as tmp:
    for r in range(spec.rounds):
      for scheduler in spec.schedulers:
        for n, slow in _entries(spec):
          name = _name(scheduler, n, slow)
          result = _run_entry(spec, scheduler, n, os.path.join(tmp, f"{name}-{r}"), root, slow)
          rounds.setdefault(name, []).append(result)
          log(f"round {r + 1}: {name}: {result['env_steps_per_s']:,.0f} env steps/s, "
              f"{result['updates_per_s']:.2f} updates/s over {result['seconds']:.1f} s")
  entries = {}
  for name, results in rounds.items():
    steps = sum(x["env_steps"] for x in results)
    seconds = sum(x["seconds"] for x in results)
    entries[name] = {"env_steps_per_s": steps / seconds,
                     "updates_per_s": sum(x["updates"] for x in results) / seconds, "rounds": results}
  for scheduler in spec.schedulers:
    base = entries[f"{scheduler}@{spec.processes[0]}p"]["env_steps_per_s"]
    for n, slow in _entries(spec):
      name = _name(scheduler, n, slow)
      entry = entries[name]
      entry["vs_first_count"] = entry["env_steps_per_s"] / base
      log(f"{name}: {entry['env_steps_per_s']:,.0f} env steps/s, {entry['vs_first_count']:.2f}x "
          f"{scheduler}@{spec.processes[0]}p")
  result = {"spec": dataclasses.asdict(spec), "machine": machine, "entries": entries}
  write_json(spec.out, result)
  return result


def _name(scheduler: str, processes: int, slow: bool) -> str:
  return f"{scheduler}@{processes}p" + ("+slow" if slow else "")


def _entries(spec: ProcessBenchSpec) -> list[tuple[int, bool]]:
  """(process count, slow) of every entry, in run order."""
  return [(n, slow) for n in spec.processes for slow in ((False, True) if n > 1 and spec.slow_share < 1 else (False,))]


def config_flags(argv: Sequence[str]) -> tuple[str, ...]:
  """The --config flags of a command line (`--config=<file>` and `--config.<key>=<value>`), for every entry."""
  return tuple(a for a in argv if a.startswith("--config.") or a.startswith("--config="))
