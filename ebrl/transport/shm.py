"""Named shared-memory blocks that the creating process owns and every other process only maps.

Why a helper: Python 3.11's `multiprocessing.resource_tracker` registers every
`SharedMemory` a process opens, attached or created, and unlinks it when that
process exits - so a child that merely maps the parent's block would delete it
under the parent (and the tracker warns about "leaked" blocks it never owned).
Here only the owner registers and unlinks; attaching processes map the
block's file without telling the tracker.

Names are `ebrl_<pid>_<token>_<tag>_<n>`: the owner's pid makes leftovers of a
crashed run recognisable (`leftover_blocks`), and a random token keeps two
processes with the same pid (containers sharing one /dev/shm) from colliding;
a name that exists anyway is drawn again.

Space is reserved when a block is made. /dev/shm is a tmpfs: creating a file
past its size succeeds, and the first write to a page it cannot back kills
the process with SIGBUS ("Bus error"). Docker gives containers 64 MB by default,
less than one ring slot of a pixel run. So `create` checks the free space
first (`check_space`: a one-line ShmSpaceError naming the size, the free
space and the fixes) and then allocates every page (posix_fallocate), which
fails cleanly with ENOSPC if another process took the space meanwhile.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import secrets
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from ebrl.errors import UserError

PREFIX = "ebrl_"
SHM_DIR = "/dev/shm"
_counter = itertools.count()
_MIB = float(1 << 20)


class ShmSpaceError(UserError):
  """/dev/shm cannot hold a block a stage process needs; the message says how much and what to do."""


def _new_name(tag: str) -> str:
  return f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}_{tag}_{next(_counter)}"


def _statvfs(path: str) -> os.statvfs_result | None:
  try:
    return os.statvfs(path)
  except OSError:
    return None


def free_bytes(path: str = SHM_DIR) -> int | None:
  """Bytes an unprivileged process may still allocate in `path`'s filesystem; None if unknown."""
  st = _statvfs(path)
  return None if st is None else st.f_bavail * st.f_frsize


def _total_bytes(path: str = SHM_DIR) -> int | None:
  st = _statvfs(path)
  return None if st is None else st.f_blocks * st.f_frsize


def space_message(needed: int, free: int | None, what: str) -> str:
  """The one line a run prints when /dev/shm is too small for `what`."""
  total = _total_bytes()
  have = "an unknown amount" if free is None else f"{free / _MIB:,.1f} MiB"
  size = "" if total is None else f" of {total / _MIB:,.1f} MiB"
  return (f"{what} needs {needed / _MIB:,.1f} MiB of shared memory in {SHM_DIR}, which has {have} free{size}; "
          f"give it more (docker run --shm-size=<size>, or remount {SHM_DIR} larger) or keep the learner in this "
          "process with --config.placement=threads")


def page_rounded(nbytes: int) -> int:
  """What a block of `nbytes` takes in a tmpfs: whole pages."""
  page = mmap.PAGESIZE
  return -(-max(int(nbytes), 1) // page) * page


def fits(nbytes: int, path: str = SHM_DIR) -> bool:
  """Whether `nbytes` (one or several blocks' page_rounded sizes) fit in `path` now."""
  free = free_bytes(path)
  return free is None or nbytes <= free


def check_space(nbytes: int, what: str) -> None:
  """ShmSpaceError unless /dev/shm has room for `nbytes` now (a check; `create` also reserves)."""
  if os.path.isdir(SHM_DIR) and not fits(nbytes):
    raise ShmSpaceError(space_message(nbytes, free_bytes(), what))


def create(tag: str, nbytes: int, what: str = "the learner process") -> shared_memory.SharedMemory:
  """A new zero-filled block of at least `nbytes` owned by this process, its pages allocated (unlink it
  with `release`). ShmSpaceError, naming `what` needs the space, if /dev/shm cannot hold it."""
  size = max(int(nbytes), 1)
  check_space(page_rounded(size), what)
  while True:
    try:
      block = shared_memory.SharedMemory(name=_new_name(tag), create=True, size=size)
      break
    except FileExistsError:
      continue  # Another process drew the same name (same pid in another container): draw again.
  try:
    _reserve(block, size)
  except ShmSpaceError:
    release(block, owner=True)
    raise ShmSpaceError(space_message(page_rounded(size), free_bytes(), what)) from None
  except BaseException:
    release(block, owner=True)
    raise
  return block


def _reserve(block: shared_memory.SharedMemory, size: int) -> None:
  """Allocates every page of a new block now, so a full tmpfs fails here and not as SIGBUS later."""
  fd = getattr(block, "_fd", -1)
  if fd < 0 or not hasattr(os, "posix_fallocate"):
    return
  try:
    os.posix_fallocate(fd, 0, size)
  except OSError as e:
    if e.errno == errno.ENOSPC:
      raise ShmSpaceError(str(e)) from None
    if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
      raise
    # A filesystem without fallocate: the check_space above is what there is.


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


def orphaned(names: set[str]) -> set[str]:
  """The blocks among `names` whose owner pid (the name's) is no longer running: a block of a live
  owner is in use, one of a dead owner was left behind."""
  return {n for n in names if not os.path.exists(f"/proc/{n[len(PREFIX):].split('_', 1)[0]}")}


def aligned(offset: int, alignment: int = 64) -> int:
  """`offset` rounded up to a cache line, so no two fields share one across processes."""
  return -(-offset // alignment) * alignment


def view(block: shared_memory.SharedMemory, offset: int, shape: tuple[int, ...], dtype) -> np.ndarray:
  """A numpy array over `block` at `offset` (no copy)."""
  return np.ndarray(shape, dtype=np.dtype(dtype), buffer=block.buf, offset=offset)
