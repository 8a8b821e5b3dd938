"""Child-process bodies for tests/learner/test_transport.py (spawned: imported by name in the child)."""

from __future__ import annotations

import time

import numpy as np

from ebrl.transport.param_slot import ParamSlot, SlotSpec
from ebrl.transport.segment_ring import SegmentRing

SHAPES = ((512, 256), (1000,))


def write_versions(spec: SlotSpec, stop) -> None:
  """Publishes versions 0, 1, ... until `stop` is set, every element of every leaf equal to its version."""
  slot = ParamSlot.attach(spec)
  v = 0
  while not stop.is_set():
    slot.write([np.full(s, v, np.float32) for s in SHAPES], v)
    v += 1
  slot.close()


def segment(k: int) -> dict[str, np.ndarray]:
  return {"obs": np.full((8, 3), k, np.float32) + np.arange(3, dtype=np.float32),
          "actions": np.full((8, 2), -k, np.float32), "done": np.arange(8) % (k + 2) == 0}


def produce(ring: SegmentRing, count: int, then_sleep: bool) -> None:
  """Puts segments 0..count-1 (meta: k, 2k); then exits, or sleeps until killed."""
  for k in range(count):
    while not ring.put(segment(k), (k, 2 * k), timeout=1.0):
      pass
  if then_sleep:
    time.sleep(600)
  ring.close()


def produce_then_die_mid_segment(ring: SegmentRing, count: int) -> None:
  """Commits segments 0..count-1, then takes a free slot and writes half of the next segment
  into it, as a producer killed inside `put` leaves it (SIGKILLed there by the test)."""
  for k in range(count):
    while not ring.put(segment(k), (k, 2 * k), timeout=1.0):
      pass
  slot = None
  while slot is None:
    slot = ring.acquire(timeout=1.0)
  ring.arrays(slot)["obs"][:4] = -1.0  # Half written, never committed.
  print("MID_SEGMENT", flush=True)
  time.sleep(600)
