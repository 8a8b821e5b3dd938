"""Params from the learner process to the generation process: a versioned double buffer.

The writer (learner) fills the buffer readers are not pointed at, then points
them at it; each buffer has a sequence counter, odd while it is written
(a seqlock per buffer). A reader copies the active buffer and keeps the copy
only if that buffer's counter was even and unchanged across the copy, so a
read never mixes two versions, and the writer never waits for a reader. A
reader slow enough to be lapped twice simply copies again.

Leaves are a flat list of arrays with shapes and dtypes fixed at creation
(the caller flattens its pytree; both processes build the same policy, so the
same tree). Ordering relies on stores becoming visible in program order
(x86-64's TSO); aligned int64 counters are written with single stores.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from ebrl.transport import shm

# Header: int64 words, each on its own cache line: [active, seq0, seq1, version0, version1].
_WORDS = 5
_LINE = 64 // 8
_HEADER_BYTES = _WORDS * 64


@dataclasses.dataclass(frozen=True)
class SlotSpec:
  """What another process needs to map the slot (picklable)."""
  name: str
  shapes: tuple[tuple[int, ...], ...]
  dtypes: tuple[str, ...]
  offsets: tuple[tuple[int, ...], ...]  # Per buffer, per leaf.


class ParamSlot:
  """One writer, any number of readers, in any processes."""

  def __init__(self, spec: SlotSpec, block, owner: bool):
    self.spec, self._block, self._owner = spec, block, owner
    words = shm.view(block, 0, (_WORDS * _LINE,), np.int64)
    self._active = words[0:1]
    self._seq = (words[1 * _LINE:1 * _LINE + 1], words[2 * _LINE:2 * _LINE + 1])
    self._version = (words[3 * _LINE:3 * _LINE + 1], words[4 * _LINE:4 * _LINE + 1])
    self._leaves = tuple(tuple(shm.view(block, off, shape, dtype)
                               for off, shape, dtype in zip(offsets, spec.shapes, spec.dtypes))
                         for offsets in spec.offsets)

  @classmethod
  def create(cls, template: Sequence[np.ndarray]) -> "ParamSlot":
    """A slot for leaves shaped like `template`; nothing is readable until the first `write`."""
    shapes = tuple(tuple(np.shape(a)) for a in template)
    dtypes = tuple(np.asarray(a).dtype.str for a in template)
    offsets, at = [], _HEADER_BYTES
    for _ in range(2):
      buf = []
      for shape, dtype in zip(shapes, dtypes):
        buf.append(at)
        at = shm.aligned(at + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
      offsets.append(tuple(buf))
    block = shm.create("params", at)
    slot = cls(SlotSpec(block.name, shapes, dtypes, tuple(offsets)), block, owner=True)
    slot._version[0][0] = slot._version[1][0] = -1
    return slot

  @classmethod
  def attach(cls, spec: SlotSpec) -> "ParamSlot":
    return cls(spec, shm.attach(spec.name), owner=False)

  def write(self, leaves: Sequence[np.ndarray], version: int) -> None:
    """Publishes `leaves` as `version` (the writer's only call; never blocks)."""
    if len(leaves) != len(self.spec.shapes):
      raise ValueError(f"{len(leaves)} leaves for a slot of {len(self.spec.shapes)}")
    i = 1 - int(self._active[0])
    self._seq[i][0] += 1  # Odd: buffer i is being written.
    for dst, src in zip(self._leaves[i], leaves):
      np.copyto(dst, np.asarray(src), casting="same_kind")
    self._version[i][0] = version
    self._seq[i][0] += 1  # Even again: buffer i is whole.
    self._active[0] = i

  def version(self) -> int:
    """The newest published version (-1 before the first write)."""
    return int(self._version[int(self._active[0])][0])

  def read(self, newer_than: int | None = None) -> tuple[list[np.ndarray], int] | None:
    """A consistent copy of the newest params and their version; None before the first write or
    when nothing newer than `newer_than` is published."""
    while True:
      i = int(self._active[0])
      before = int(self._seq[i][0])
      version = int(self._version[i][0])
      if version < 0 or (newer_than is not None and version <= newer_than):
        if int(self._seq[i][0]) == before and int(self._active[0]) == i:
          return None
        continue
      if before % 2:
        continue  # Lapped: the writer is refilling the buffer we were pointed at.
      copies = [np.array(a) for a in self._leaves[i]]
      if int(self._seq[i][0]) == before:
        return copies, version

  def close(self) -> None:
    """Unmaps (and, in the creating process, removes) the slot."""
    self._leaves = ()
    self._active = self._seq = self._version = None
    shm.release(self._block, self._owner)
    self._block = None
