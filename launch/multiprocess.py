"""Start a run over several processes on this machine: `python -m launch.multiprocess --num_processes=2 -- <flags>`.

Starts `--num_processes` copies of `python -m <module> <flags>` (launch.train by
default), each told the run's coordinator (a free port on localhost), the
process count and its own index, which is how every process of a run over
several hosts is started (README: "Several processes and hosts"). Process
0's output is shown as it is (its progress bar); the others' lines are shown
prefixed with their index. Ctrl-C or SIGTERM stops every process; the exit
code is the first non-zero one a process returned, or 0.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time

from absl import flags

from ebrl import distributed
from launch import common

_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 2, "Processes to start.")
_MODULE = flags.DEFINE_string("module", "launch.train", "The launcher each process runs (python -m <module>).")
_GRACE_S = flags.DEFINE_float("grace_s", 60.0, "After a process fails, seconds the others get to notice it and "
                              "exit on their own before they are stopped.")


def _relay(index: int, stream) -> None:
  for line in iter(stream.readline, ""):
    sys.stderr.write(f"[process {index}] {line}")
  stream.close()


def launch(module: str, num_processes: int, args: list[str], grace_s: float) -> int:
  """Runs the processes to the end; returns the first non-zero exit code, or 0."""
  coordinator = f"localhost:{distributed.free_port()}"
  procs: list[subprocess.Popen] = []
  exits: queue.Queue[tuple[int, int]] = queue.Queue()  # (index, code) in the order processes ended.
  stop = threading.Event()
  previous = {sig: signal.signal(sig, lambda *_: (stop.set(), exits.put((-1, 0)))) for sig in (signal.SIGINT,
                                                                                                signal.SIGTERM)}
  try:
    for i in range(num_processes):
      cmd = [sys.executable, "-m", module, f"--coordinator_address={coordinator}",
             f"--num_processes={num_processes}", f"--process_id={i}", *args]
      # Each in its own process group: a terminal's Ctrl-C reaches the launcher alone, which stops
      # every process the same way (SIGTERM), whichever of them the terminal would have reached.
      if i == 0:
        procs.append(subprocess.Popen(cmd, start_new_session=True))
      else:
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
        threading.Thread(target=_relay, args=(i, procs[-1].stdout), daemon=True).start()
      # A waiter per process: the first to end is told first, even when the others follow within
      # milliseconds (a run's processes stop together once one of them is lost).
      threading.Thread(target=lambda i=i, p=procs[-1]: exits.put((i, _exit_code(p.wait()))), daemon=True).start()
    first_failure, deadline, ended = 0, None, 0
    while ended < num_processes and not stop.is_set():
      try:
        index, code = exits.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
      except queue.Empty:
        break  # The others did not stop on their own within the grace period.
      if index < 0:
        break
      ended += 1
      if code != 0 and not first_failure:
        first_failure, deadline = code, time.monotonic() + grace_s
        print(f"error: process {index} exited with code {code}; the others stop once they notice it "
              f"(at most {grace_s:.0f} s)", file=sys.stderr)
    _stop([p for p in procs if p.poll() is None])
    if stop.is_set() and not first_failure:
      first_failure = 128 + signal.SIGTERM
    return first_failure
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def _exit_code(returncode: int) -> int:
  """A process's exit status as a shell reports it: 128 + N for one ended by signal N (Popen: -N)."""
  return 128 - returncode if returncode < 0 else returncode


def _stop(live: list[subprocess.Popen], timeout_s: float = 30.0) -> None:
  """SIGTERM to each (a run saves and exits on it), SIGKILL to any still there after `timeout_s`."""
  for p in live:
    p.send_signal(signal.SIGTERM)
  deadline = time.monotonic() + timeout_s
  for p in live:
    try:
      p.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


def main(argv: list[str]) -> None:
  if _NUM_PROCESSES.value < 1:
    common.fail(f"--num_processes={_NUM_PROCESSES.value} must be at least 1")
  given = {a.split("=")[0] for a in argv[1:]}
  taken = given & {"--coordinator_address", "--num_processes", "--process_id"}
  if taken:
    common.fail(f"{', '.join(sorted(taken))} after -- are the launcher's to set; drop them")
  sys.exit(launch(_MODULE.value, _NUM_PROCESSES.value, argv[1:], _GRACE_S.value))


def cli() -> None:
  """The `ebrl-multiprocess` console command (pyproject.toml)."""
  common.run(main)


if __name__ == "__main__":
  cli()
