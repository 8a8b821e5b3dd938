"""Finished segments from the generation process to the learner process: a ring of fixed slots.

Every slot holds one segment's arrays at fixed shapes in one shared-memory
block; only slot indices (and a few ints of metadata per segment, such as its
start version) travel, through two queues: `free` (slots a producer may fill)
and `ready` (filled slots, in the order they were committed). The consumer
reads a slot in place and hands it back, so a segment is copied once, into
the slot, and never pickled. With every slot full the producer's `acquire`
waits: the ring is back-pressure, not a buffer that grows.

Waits take a timeout so that a caller can check, between waits, that the
process on the other side is alive (a stage process that died ends the run
instead of hanging it).
"""

from __future__ import annotations

import dataclasses
import queue
from typing import Any, Mapping

import numpy as np

from ebrl.transport import shm


@dataclasses.dataclass(frozen=True)
class RingSpec:
  name: str
  slots: int
  fields: tuple[tuple[str, tuple[int, ...], str], ...]  # (name, shape, dtype str)
  offsets: tuple[tuple[int, ...], ...]  # Per slot, per field.


class SegmentRing:
  """One block of `slots` segment slots plus the two index queues; picklable into a spawned
  process (which maps the block; only the creating process removes it)."""

  def __init__(self, spec: RingSpec, free, ready, block, owner: bool):
    self.spec, self._free, self._ready, self._block, self._owner = spec, free, ready, block, owner
    self._views = [{f: shm.view(block, off, shape, dtype) for (f, shape, dtype), off in zip(spec.fields, offsets)}
                   for offsets in spec.offsets]

  @staticmethod
  def _layout(fields: Mapping[str, tuple[tuple[int, ...], Any]], slots: int) -> tuple[tuple, tuple, int]:
    """(fields as (name, shape, dtype str), offsets per slot, total bytes)."""
    layout = tuple((name, tuple(int(d) for d in shape), np.dtype(dtype).str) for name, (shape, dtype) in fields.items())
    offsets, at = [], 0
    for _ in range(slots):
      row = []
      for _, shape, dtype in layout:
        row.append(at)
        at = shm.aligned(at + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
      offsets.append(tuple(row))
    return layout, tuple(offsets), at

  @classmethod
  def nbytes(cls, fields: Mapping[str, tuple[tuple[int, ...], Any]], slots: int) -> int:
    """The shared memory a ring of `slots` slots of `fields` takes (whole pages, as /dev/shm counts it)."""
    return shm.page_rounded(cls._layout(fields, slots)[2])

  @classmethod
  def create(cls, fields: Mapping[str, tuple[tuple[int, ...], Any]], slots: int, mp_context,
             what: str = "the learner process") -> "SegmentRing":
    """A ring of `slots` slots, each with arrays `fields` = {name: (shape, dtype)}, its queues
    made by `mp_context` (a spawn context: the processes that share it are spawned).
    ShmSpaceError if /dev/shm cannot hold it (`what` names who needs it)."""
    if slots < 1:
      raise ValueError(f"slots={slots} must be >= 1")
    layout, offsets, total = cls._layout(fields, slots)
    block = shm.create("ring", total, what)
    free, ready = mp_context.Queue(), mp_context.Queue()
    for i in range(slots):
      free.put(i)
    return cls(RingSpec(block.name, slots, layout, offsets), free, ready, block, owner=True)

  def __getstate__(self):
    return {"spec": self.spec, "free": self._free, "ready": self._ready}

  def __setstate__(self, state):
    self.__init__(state["spec"], state["free"], state["ready"], shm.attach(state["spec"].name), owner=False)

  # -- producer ---------------------------------------------------------------

  def acquire(self, timeout: float) -> int | None:
    """A free slot's index, or None if none frees up within `timeout` seconds."""
    try:
      return self._free.get(timeout=timeout)
    except queue.Empty:
      return None

  def commit(self, slot: int, meta: tuple[int, ...] = ()) -> None:
    """Hands a filled slot to the consumer with a few ints of metadata."""
    self._ready.put((slot, tuple(int(m) for m in meta)))

  def put(self, arrays: Mapping[str, np.ndarray], meta: tuple[int, ...] = (), timeout: float = 1.0) -> bool:
    """Copies one segment into a free slot and commits it; False if no slot freed up in time."""
    unknown = sorted(set(arrays) - set(self._views[0]))
    if unknown:
      raise KeyError(f"fields {unknown} are not in this ring's slots; its fields: {sorted(self._views[0])}")
    slot = self.acquire(timeout)
    if slot is None:
      return False
    try:
      for name, src in arrays.items():  # A field left out (an optional one) keeps old contents.
        np.copyto(self._views[slot][name], src, casting="same_kind")
    except BaseException:
      self.release_slot(slot)
      raise
    self.commit(slot, meta)
    return True

  # -- consumer ---------------------------------------------------------------

  def get(self, timeout: float) -> tuple[int, tuple[int, ...]] | None:
    """The next committed (slot, meta), or None within `timeout` seconds."""
    try:
      return self._ready.get(timeout=timeout)
    except queue.Empty:
      return None

  def arrays(self, slot: int) -> dict[str, np.ndarray]:
    """The slot's arrays, in place (valid until `release_slot`)."""
    return self._views[slot]

  def release_slot(self, slot: int) -> None:
    self._free.put(slot)

  def take(self, timeout: float) -> tuple[dict[str, np.ndarray], tuple[int, ...]] | None:
    """The next segment as copies (its slot goes back at once), or None within `timeout`."""
    item = self.get(timeout)
    if item is None:
      return None
    slot, meta = item
    out = {name: np.array(v) for name, v in self._views[slot].items()}
    self.release_slot(slot)
    return out, meta

  def close(self) -> None:
    """Unmaps the block (the creating process also removes it) and closes this side's queues."""
    self._views = []
    for q in (self._free, self._ready):
      q.close()
      if self._owner:
        q.cancel_join_thread()  # Its peers may be dead: never wait on indices nobody will read.
      else:
        q.join_thread()  # What this side committed reaches the pipe before it exits.
    shm.release(self._block, self._owner)
    self._block = None
