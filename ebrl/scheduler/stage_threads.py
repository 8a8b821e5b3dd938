"""Stage threads of an asynchronous scheduler: started together, stopped together.

Why one place: both asynchronous schedulers (host env groups and device
groups) need the same guarantees, and they are easy to get subtly wrong. The
first exception in any stage stops every stage and is re-raised as the run's
error (never a hang); a stop (step budget, deadline, Ctrl-C in the main thread)
ends every thread within 10 s or is reported naming the ones still alive.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import jax

POLL_S = 0.05
_JOIN_S = 10.0


class StageThreads:

  def __init__(self):
    self.stop = threading.Event()  # Stage loops poll it; setting it ends the run.
    self.errors: list[BaseException] = []

  def run(self, stages: list[tuple[str, Callable, tuple]], on_stop: Callable[[], None] = lambda: None) -> None:
    """Runs `(name, fn, args)` stages until one stops the run; `on_stop` wakes blocked stages."""
    threads = [threading.Thread(target=self._guard, args=(fn, *args), name=name, daemon=True)
               for name, fn, args in stages]
    for th in threads:
      th.start()
    try:
      while not self.stop.is_set():
        self.stop.wait(POLL_S)
    finally:
      self.stop.set()
      on_stop()
      for th in threads:
        th.join(timeout=_JOIN_S)
      alive = [th.name for th in threads if th.is_alive()]
    if self.errors:
      raise self.errors[0]
    if alive:
      raise RuntimeError(f"stage threads did not stop within {_JOIN_S:.0f} s: {alive}")

  def _guard(self, fn, *args) -> None:
    try:
      fn(*args)
    except BaseException as e:  # pylint: disable=broad-except  # Surfaced by run().
      self.errors.append(e)
    finally:
      self.stop.set()


def learner_loop(trainer, queue, stopping: Callable[[], bool], assemble: Callable[[list], Any],
                 publish: Callable[[Any], None]) -> None:
  """The learner stage of both asynchronous schedulers: an update on every batch the queue
  releases, then `publish(state)` hands the new params to generation and wakes waiting groups."""
  t = trainer
  while not stopping():
    items = queue.get_batch(timeout=POLL_S)
    if items is None:
      continue
    batch = assemble(items)
    with t.clock.stage("train", lane="learner"):
      t.state, metrics = t.learner.update_segments(t.state, batch)
      jax.block_until_ready(t.state)
    publish(t.state)
    t.after_update(metrics)
