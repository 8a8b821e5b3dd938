"""The small signals a run's processes exchange between updates: counts, flags, a little JSON.

Why: in a run over several processes every process must issue the same
collectives in the same order, or they wait for each other until the run is
declared lost. So every decision that could differ between processes - log a
row now, checkpoint now, stop now - is taken from one gather that each process
makes once per update (the recorder's), and never from a process's own clock
or signal handler alone. The payloads are a few numbers per process; the
learner's gradients travel in the jitted update itself (ebrl/learner.py).

A run of one process has a group of one, and nothing is exchanged.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import numpy as np

from ebrl.errors import UserError

_DISCONNECT_S = 1.0  # What process 0 allows the others' disconnect after they announced it.
_left = False  # This process left its run (`leave`): it takes part in no further collective.


class ProcessGroup:
  """Every process of a run (`count`), seen from process `index`."""

  def __init__(self, count: int = 1, index: int = 0):
    self.count, self.index = count, index

  @property
  def leader(self) -> bool:
    """Process 0 writes the run's outputs (metrics, summary, plots, config.json)."""
    return self.index == 0

  def gather(self, values: np.ndarray) -> np.ndarray:
    """Each process's `values` (float64, the same shape on every process), stacked in process order."""
    values = np.asarray(values, np.float64)
    if self.count == 1:
      return values[None]
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    return np.asarray(multihost_utils.process_allgather(values, tiled=False)).reshape(self.count, *values.shape)

  def gather_json(self, value: Any) -> list[Any]:
    """Each process's JSON-able `value`, in process order (two gathers: the lengths, then the bytes)."""
    if self.count == 1:
      return [value]
    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    longest = int(self.gather(np.array([len(data)])).max())
    padded = np.zeros(longest, np.float64)
    padded[:len(data)] = data
    rows = self.gather(padded).astype(np.uint8)
    return [json.loads(row.tobytes().rstrip(b"\0").decode()) for row in rows]

  def leave(self, timeout_s: float = 600.0) -> None:
    """Ends this process's part in the run once every process got here: the others disconnect from
    the coordination service first, then process 0, which runs it, may exit. (With JAX's
    recoverable tasks, ebrl/distributed.py, no shutdown barrier holds process 0 back, and a process
    still disconnecting from a service that is gone is aborted.) After it, this process takes part
    in no collective."""
    global _left
    if self.count == 1 or _left:
      return
    import jax  # pylint: disable=g-import-not-at-top
    from jax._src import distributed  # pylint: disable=g-import-not-at-top

    client = distributed.global_state.client
    client.wait_at_barrier("ebrl/run end", int(timeout_s * 1000))
    _left = True
    if not self.leader:
      client.key_value_set(f"ebrl/left/{self.index}", "1")
      jax.distributed.shutdown()
      return
    for i in range(1, self.count):
      client.blocking_key_value_get(f"ebrl/left/{i}", int(timeout_s * 1000))
    time.sleep(_DISCONNECT_S)  # Their disconnect, announced just before it, to complete.

  def check_same_config(self, config: Any) -> None:
    """A UserError on every process when the processes were started with different configs (the
    first process whose config differs from process 0's is named)."""
    if self.count == 1:
      return
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).digest()[:8]
    digests = self.gather(np.frombuffer(digest, np.uint8).astype(np.float64))
    differs = [i for i in range(self.count) if not np.array_equal(digests[i], digests[0])]
    if differs:
      raise UserError(f"process {differs[0]} was started with a config that differs from process 0's: every process "
                      "of a run needs the same --config flags")


def leave_at_exit(timeout_s: float = 10.0) -> None:
  """At interpreter exit (registered by ebrl/distributed.py, so it runs before JAX's own clean-up):
  a process that has not left its run leaves it with the others (a run that ended in the same
  error everywhere, a program that joined without running a Trainer). When the others do not come
  within `timeout_s`, this process leaves alone and quietly: JAX's disconnect from a coordination
  service that is gone would abort it with a fatal log instead of its own exit code."""
  group = joined()
  if group.count == 1 or _left:
    return
  try:
    group.leave(timeout_s)
  except Exception:  # pylint: disable=broad-except  # The others are gone or busy: leave alone.
    from jax._src import distributed  # pylint: disable=g-import-not-at-top

    distributed.global_state.preemption_sync_manager = None
    distributed.global_state.client = None
    distributed.global_state.service = None


def joined() -> ProcessGroup:
  """The processes this process joined through `jax.distributed` (ebrl/distributed.py); a group of
  one when it joined none. Reading it starts no JAX backend."""
  import sys  # pylint: disable=g-import-not-at-top

  if "jax" not in sys.modules:
    return ProcessGroup()
  from jax._src import distributed  # pylint: disable=g-import-not-at-top

  state = distributed.global_state
  if state.client is None or not state.num_processes:
    return ProcessGroup()
  return ProcessGroup(int(state.num_processes), int(state.process_id))
