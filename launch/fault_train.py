"""`launch.train` with an exception to inject: SIGUSR1 makes the generation loop raise.

  python -m launch.fault_train <launch.train flags>   # then: kill -USR1 <pid>

A fault-injection instrument (`launch.soak --faults=exception`): the run's
next action generation after the signal raises InjectedFault in whichever
thread generates, as a bug in a stage would, so the error path of the whole
run (its loop threads, the learner process, shared memory, env pools, files)
is exercised for real. Without the signal it is launch.train.
"""

from __future__ import annotations

import signal
import threading

from ebrl import sampler
from launch import train


class InjectedFault(RuntimeError):
  """The exception SIGUSR1 asked for."""


def arm() -> threading.Event:
  """Installs the SIGUSR1 handler and the raising Sampler.act; returns the event the signal sets."""
  armed = threading.Event()
  signal.signal(signal.SIGUSR1, lambda signum, frame: armed.set())
  act = sampler.Sampler.act

  def act_or_fail(self, *args, **kwargs):
    if armed.is_set():
      raise InjectedFault("fault injected by SIGUSR1 (launch.fault_train)")
    return act(self, *args, **kwargs)

  sampler.Sampler.act = act_or_fail
  return armed


if __name__ == "__main__":
  arm()
  train.cli()
