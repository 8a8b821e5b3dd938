"""Named shared-memory blocks that the creating process owns and every other process only maps.

Why a helper: Python 3.11's `multiprocessing.resource_tracker` registers every
`SharedMemory` a process opens, attached or created, and unlinks it when that
process exits - so a child that merely maps the parent's block would delete it
under the parent (and the tracker warns about "leaked" blocks it never owned).
Here only the owner registers and unlinks; attaching processes map the
block's file without telling the tracker. Names carry the owner's pid (`ebrl_<pid>_<tag>_<n>`) so leftovers of a
crashed run are recognisable (`leftover_blocks`) and a test can check that
none remain.
"""

from __future__ import annotations

import itertools
import mmap
import os
from multiprocessing import resource_tracker, shared_memory

import numpy as np

PREFIX = "ebrl_"
SHM_DIR = "/dev/shm"
_counter = itertools.count()


def _new_name(tag: str) -> str:
  return f"{PREFIX}{os.getpid()}_{tag}_{next(_counter)}"


def create(tag: str, nbytes: int) -> shared_memory.SharedMemory:
  """A new zero-filled block of at least `nbytes` owned by this process (unlink it with `release`)."""
  return shared_memory.SharedMemory(name=_new_name(tag), create=True, size=max(int(nbytes), 1))


class _Mapping:
  """A block mapped by name, without a SharedMemory object (so no resource tracker hears of it)."""

  def __init__(self, name: str):
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
      self._map = mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
      os.close(fd)
    self.name, self.buf = name, memoryview(self._map)

  def close(self) -> None:
    self.buf.release()
    self._map.close()


def attach(name: str):
  """Maps a block another process owns; this process will never unlink it.

  Linux: the block's file in /dev/shm is mapped directly. Opening it as a
  `SharedMemory` would register it with the resource tracker, which spawned
  children share with their parent: the child's unregister would then drop
  the parent's registration, and a crash of the parent would leave the block
  behind.
  """
  if os.path.isdir(SHM_DIR):
    return _Mapping(name)
  block = shared_memory.SharedMemory(name=name, create=False)
  resource_tracker.unregister(block._name, "shared_memory")  # pylint: disable=protected-access
  return block


def release(block: shared_memory.SharedMemory | None, owner: bool) -> None:
  """Unmaps the block; the owner also removes its name. Safe to call twice."""
  if block is None:
    return
  try:
    block.close()
  except BufferError:  # A numpy view still maps it: the mapping goes when the view does.
    pass
  if owner:
    try:
      block.unlink()
    except FileNotFoundError:
      pass


def leftover_blocks(pid: int | None = None) -> list[str]:
  """Names of EBRL blocks in /dev/shm (of one owner pid, if given)."""
  if not os.path.isdir(SHM_DIR):
    return []
  head = PREFIX if pid is None else f"{PREFIX}{pid}_"
  return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(head))


def aligned(offset: int, alignment: int = 64) -> int:
  """`offset` rounded up to a cache line, so no two fields share one across processes."""
  return -(-offset // alignment) * alignment


def view(block: shared_memory.SharedMemory, offset: int, shape: tuple[int, ...], dtype) -> np.ndarray:
  """A numpy array over `block` at `offset` (no copy)."""
  return np.ndarray(shape, dtype=np.dtype(dtype), buffer=block.buf, offset=offset)
