"""ParamStore: the one place a run's params are published and read, with their version.

Why one rule for copies: every update donates (frees) the train state it is
given, so params handed to acting must not share its buffers. `publish`
always copies, on the device the params are used on, and actors read
`latest()` whenever they start a batch: a reader never waits for the learner
and never sees params an update is about to free. Thread-safe; the same
interface can later be backed by shared memory (stage processes) or a
parameter server (hosts).

What is published is chosen once per run by `select` (host acting needs the
policy params; device collects also need the value statistics, see
`with_value_stats`) and placed by `place` (e.g. replicated on the simulator's
mesh).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp

from ebrl.learner import process_local


def policy_params(state) -> Any:
  return state.params


def with_value_stats(state) -> Any:
  """Policy params plus "value_norm": a device collect folds the truncation bootstrap in return
  units, so it needs the critic's standardisation statistics (TrainState.value_norm)."""
  return {**state.params, "value_norm": state.value_norm}


class ParamStore:

  def __init__(self, select: Callable[[Any], Any] = policy_params, place: Callable[[Any], Any] | None = None):
    self._select = select
    self._place = place
    self._lock = threading.Lock()
    self._params: Any = None
    self._version = -1

  def publish(self, state) -> None:
    """Publishes `state`'s params (a copy) as version `state.version`."""
    self.publish_params(self._select(state), int(state.version))

  def publish_params(self, params, version: int) -> None:
    # This process's copy of a learner's replicated params over several processes: acting is local.
    copy = jax.tree.map(jnp.copy, process_local(params))
    if self._place is not None:
      copy = self._place(copy)
    with self._lock:
      self._params, self._version = copy, int(version)

  def latest(self) -> tuple[Any, int]:
    """The newest (params, version); (None, -1) before the first publish."""
    with self._lock:
      return self._params, self._version
