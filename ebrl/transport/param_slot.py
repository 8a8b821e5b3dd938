"""Params from the learner process to the generation process: a versioned double buffer.

The writer (learner) fills the buffer readers are not pointed at, then points
them at it; each buffer has a sequence counter, odd while it is written
(a seqlock per buffer), and a CRC-32 of its version and contents. A reader
copies the active buffer and keeps the copy only if that buffer's counter was
even and unchanged across the copy and the copy's checksum is the one the
writer stored, so a read never mixes two versions, and the writer never waits
for a reader. A reader slow enough to be lapped twice simply copies again.

Why a checksum as well as the counter: the counter alone is enough only where
other processes see this process's stores in program order (x86-64's TSO).
On weakly ordered CPUs (ARM: Grace-Hopper nodes, Graviton) a reader may see
the counter even and unchanged while some of the leaves it copied are a later
write's; Python has no memory fence to order them. The checksum does not
depend on store order: a torn copy fails it (but for a 2^-32 chance) and is
read again. It costs one CRC pass per write and per read (about 4 GB/s here,
against the copy's 10 GB/s), small beside an update.

Leaves are a flat list of arrays with shapes and dtypes fixed at creation
(the caller flattens its pytree; both processes build the same policy, so the
same tree).
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Sequence

import numpy as np

from ebrl.transport import shm

# Header: int64 words, each on its own cache line: [active, seq0, seq1, version0, version1, crc0, crc1].
_WORDS = 7
_LINE = 64 // 8
_HEADER_BYTES = _WORDS * 64


@dataclasses.dataclass(frozen=True)
class SlotSpec:
  """What another process needs to map the slot (picklable)."""
  name: str
  shapes: tuple[tuple[int, ...], ...]
  dtypes: tuple[str, ...]
  offsets: tuple[tuple[int, ...], ...]  # Per buffer, per leaf.


def _layout(template: Sequence[np.ndarray]) -> tuple[tuple, tuple, tuple, int]:
  """(shapes, dtypes, offsets per buffer, total bytes) of a slot for leaves shaped like `template`."""
  shapes = tuple(tuple(np.shape(a)) for a in template)
  dtypes = tuple(np.asarray(a).dtype.str for a in template)
  offsets, at = [], _HEADER_BYTES
  for _ in range(2):
    buf = []
    for shape, dtype in zip(shapes, dtypes):
      buf.append(at)
      at = shm.aligned(at + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    offsets.append(tuple(buf))
  return shapes, dtypes, tuple(offsets), at


def _checksum(version: int, leaves: Sequence[np.ndarray]) -> int:
  crc = zlib.crc32(np.int64(version).tobytes())
  for leaf in leaves:
    crc = zlib.crc32(np.ascontiguousarray(leaf).reshape(-1).view(np.uint8), crc)
  return crc


class ParamSlot:
  """One writer, any number of readers, in any processes."""

  def __init__(self, spec: SlotSpec, block, owner: bool):
    self.spec, self._block, self._owner = spec, block, owner
    words = shm.view(block, 0, (_WORDS * _LINE,), np.int64)
    word = lambda k: words[k * _LINE:k * _LINE + 1]
    self._active = word(0)
    self._seq = (word(1), word(2))
    self._version = (word(3), word(4))
    self._crc = (word(5), word(6))
    self._leaves = tuple(tuple(shm.view(block, off, shape, dtype)
                               for off, shape, dtype in zip(offsets, spec.shapes, spec.dtypes))
                         for offsets in spec.offsets)

  @staticmethod
  def nbytes(template: Sequence[np.ndarray]) -> int:
    """The shared memory a slot for `template` takes (in whole pages, as /dev/shm counts it)."""
    return shm.page_rounded(_layout(template)[3])

  @classmethod
  def create(cls, template: Sequence[np.ndarray], what: str = "the learner process") -> "ParamSlot":
    """A slot for leaves shaped like `template`; nothing is readable until the first `write`.
    ShmSpaceError if /dev/shm cannot hold it (`what` names who needs it)."""
    shapes, dtypes, offsets, total = _layout(template)
    block = shm.create("params", total, what)
    slot = cls(SlotSpec(block.name, shapes, dtypes, offsets), block, owner=True)
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
    self._crc[i][0] = _checksum(version, self._leaves[i])
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
      crc = int(self._crc[i][0])
      if int(self._seq[i][0]) == before and _checksum(version, copies) == crc:
        return copies, version

  def close(self) -> None:
    """Unmaps (and, in the creating process, removes) the slot."""
    self._leaves = ()
    self._active = self._seq = self._version = self._crc = None
    shm.release(self._block, self._owner)
    self._block = None
