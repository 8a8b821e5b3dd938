"""The shared-memory transport across real spawned processes: no torn params, no lost or
reordered segment, a killed producer noticed, and nothing left in /dev/shm."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest

import transport_workers as workers
from ebrl.transport import shm
from ebrl.transport.param_slot import ParamSlot
from ebrl.transport.segment_ring import SegmentRing

SPAWN = mp.get_context("spawn")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIELDS = {"obs": ((8, 3), np.float32), "actions": ((8, 2), np.float32), "done": ((8,), np.bool_)}


@pytest.fixture(autouse=True)
def no_leftovers():
  yield
  assert shm.leftover_blocks(os.getpid()) == []


def test_param_reads_across_processes_are_never_torn():
  slot = ParamSlot.create([np.zeros(s, np.float32) for s in workers.SHAPES])
  assert slot.read() is None and slot.version() == -1
  stop = SPAWN.Event()
  writer = SPAWN.Process(target=workers.write_versions, args=(slot.spec, stop))
  writer.start()
  seen, last, deadline = [], -1, time.time() + 60
  try:
    while len(seen) < 100 and time.time() < deadline:  # Reads while the writer keeps publishing.
      got = slot.read(newer_than=last)
      if got is None:
        assert writer.is_alive(), "the writer died"
        continue
      leaves, version = got
      assert version > last
      for leaf, shape in zip(leaves, workers.SHAPES):
        assert leaf.shape == shape
        assert leaf.min() == leaf.max() == version  # One version, whole: never two mixed.
      seen.append(version)
      last = version
    stop.set()
    writer.join(timeout=30)
    assert writer.exitcode == 0
    assert len(seen) == 100 and seen == sorted(seen)
    final = slot.version()
    assert final >= seen[-1] and slot.read(newer_than=final) is None  # Nothing newer: no copy.
  finally:
    stop.set()
    if writer.is_alive():
      writer.kill()
    slot.close()


def test_segments_arrive_once_in_order_through_a_small_ring_and_the_block_outlives_the_child():
  ring = SegmentRing.create(FIELDS, slots=3, mp_context=SPAWN)
  count = 40  # Many more than slots: every slot is reused.
  child = SPAWN.Process(target=workers.produce, args=(ring, count, False))
  child.start()
  try:
    for k in range(count):
      got = ring.take(timeout=30)
      assert got is not None, f"segment {k} never came"
      arrays, meta = got
      assert meta == (k, 2 * k)
      for name, want in workers.segment(k).items():
        np.testing.assert_array_equal(arrays[name], want, err_msg=name)
    child.join(timeout=30)
    assert child.exitcode == 0
    # The child mapped the block and exited: the block is still the parent's, and still works.
    assert shm.leftover_blocks(os.getpid()) == [ring.spec.name]
    assert ring.put(workers.segment(7), (7, 14), timeout=1.0)
    arrays, meta = ring.take(timeout=1.0)
    assert meta == (7, 14) and arrays["obs"][0, 0] == 7
  finally:
    if child.is_alive():
      child.kill()
    ring.close()


def test_a_producer_killed_inside_put_is_noticed_and_its_half_segment_never_arrives():
  """The producer dies after taking a slot and writing half a segment into it. The consumer gets
  every committed segment intact, never the half one; its waits end on their own, so a loop that
  checks the producer between waits (as the learner process checks its parent) sees the death
  within a second; and the owner's close neither hangs on the dead peer nor leaves the block."""
  ring = SegmentRing.create(FIELDS, slots=3, mp_context=SPAWN)
  child = SPAWN.Process(target=workers.produce_then_die_mid_segment, args=(ring, 2))
  child.start()
  try:
    for k in range(2):
      got = ring.take(timeout=30)
      assert got is not None and got[1] == (k, 2 * k)
      np.testing.assert_array_equal(got[0]["obs"], workers.segment(k)["obs"])
    deadline = time.time() + 30
    while not _holds_a_slot(ring, child) and time.time() < deadline:
      time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    killed, noticed = time.time(), None
    while noticed is None and time.time() - killed < 5:
      if ring.get(timeout=0.2) is not None:
        pytest.fail("a segment the producer never committed arrived")
      if not child.is_alive():
        noticed = time.time() - killed
    assert noticed is not None and noticed < 1.0
    assert child.exitcode == -signal.SIGKILL
    t0 = time.time()
    ring.close()
    assert time.time() - t0 < 5.0
  finally:
    if child.is_alive():
      child.kill()
    ring.close()
  assert shm.leftover_blocks(os.getpid()) == []


def _holds_a_slot(ring: SegmentRing, child) -> bool:
  """Whether the producer has taken its third slot (two committed and taken back, one held)."""
  return child.is_alive() and ring._free.empty()  # pylint: disable=protected-access


def test_blocks_of_a_killed_owner_are_removed(tmp_path):
  """The run's main process owns every block; SIGKILLed, its resource tracker (a process of its
  own, which outlives it) removes them, so a crashed run leaves nothing in /dev/shm."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys
  import time

  code = ("import multiprocessing as mp, sys, time, numpy as np\n"
          "from ebrl.transport.param_slot import ParamSlot\n"
          "from ebrl.transport.segment_ring import SegmentRing\n"
          "ring = SegmentRing.create({'obs': ((4,), np.float32)}, 2, mp.get_context('spawn'))\n"
          "slot = ParamSlot.create([np.zeros(3, np.float32)])\n"
          "print(ring.spec.name, slot.spec.name, flush=True)\n"
          "time.sleep(600)\n")
  proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    names = proc.stdout.readline().split()
    assert len(names) == 2 and all(os.path.exists(os.path.join(shm.SHM_DIR, n)) for n in names)
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.time() + 10
    while time.time() < deadline and any(os.path.exists(os.path.join(shm.SHM_DIR, n)) for n in names):
      time.sleep(0.1)
    assert not any(os.path.exists(os.path.join(shm.SHM_DIR, n)) for n in names)
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.communicate(timeout=10)


# -- /dev/shm space ---------------------------------------------------------------------------


def test_a_block_that_does_not_fit_is_one_line_naming_size_free_space_and_fixes(monkeypatch):
  """tmpfs lets a block be created past its size; the first write then dies of SIGBUS. The space
  is checked first: a one-line error with what is needed, what is free and how to fix it."""
  monkeypatch.setattr(shm, "free_bytes", lambda path=shm.SHM_DIR: 3 << 20)
  with pytest.raises(shm.ShmSpaceError) as e:
    ParamSlot.create([np.zeros((1 << 20,), np.float32)])  # 2 buffers of 4 MiB.
  message = str(e.value)
  assert "\n" not in message
  assert "the learner process needs 8.0 MiB of shared memory in /dev/shm, which has 3.0 MiB free" in message
  assert "--shm-size" in message and "--config.placement=threads" in message
  assert shm.leftover_blocks(os.getpid()) == []


def test_space_taken_between_the_check_and_the_block_is_caught_by_the_reservation(monkeypatch):
  """The check can pass and the space go to another process before the block is made: every page
  is allocated when the block is made, so that fails there (ENOSPC), not as SIGBUS later."""
  def no_space(fd, offset, size):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(os, "posix_fallocate", no_space)
  with pytest.raises(shm.ShmSpaceError, match="the learner process needs"):
    SegmentRing.create(FIELDS, slots=2, mp_context=SPAWN)
  assert shm.leftover_blocks(os.getpid()) == []


def test_sizes_are_known_before_anything_is_made():
  template = [np.zeros((1 << 20,), np.float32), np.zeros((3,), np.int32)]
  assert ParamSlot.nbytes(template) >= 2 * 4 * (1 << 20)
  assert SegmentRing.nbytes(FIELDS, 3) == shm.page_rounded(3 * (shm.aligned(96) + shm.aligned(64) + 64))


SMALL_SHM_SCRIPT = """
import numpy as np
from ebrl.transport import shm
from ebrl.transport.param_slot import ParamSlot
try:
  slot = ParamSlot.create([np.zeros((2 << 20,), np.float32)])  # 16 MiB in a 4 MiB tmpfs.
  slot.write([np.ones((2 << 20,), np.float32)], 0)
  print("WROTE")
except shm.ShmSpaceError as e:
  print("ERROR", e)
print("LEFT", shm.leftover_blocks())
"""


def _private_small_shm(size: str) -> list[str] | None:
  """A command prefix that runs a command with a `size` tmpfs on /dev/shm in a private mount
  namespace, or None where this machine does not allow it (no root, no unshare)."""
  import shutil  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top

  if shutil.which("unshare") is None:
    return None
  probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                          f"mount -t tmpfs -o size={size} tmpfs /dev/shm"], capture_output=True)
  if probe.returncode != 0:
    return None
  return ["unshare", "-m", "--propagation", "private", "sh", "-c",
          f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"', "sh"]


def test_a_real_small_dev_shm_gives_the_error_instead_of_a_bus_error():
  """For real: a 4 MiB tmpfs on /dev/shm (Docker's default is 64 MB) in a private mount namespace."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  prefix = _private_small_shm("4m")
  if prefix is None:
    pytest.skip("no private mount namespace here (needs root and unshare); the faked statvfs tests cover the check")
  proc = subprocess.run([*prefix, sys.executable, "-c", SMALL_SHM_SCRIPT], capture_output=True, text=True,
                        timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
  assert proc.returncode == 0, proc.stderr[-2000:]  # Not 135 (SIGBUS).
  assert "ERROR the learner process needs 16.0 MiB of shared memory in /dev/shm, which has 4.0 MiB free" in proc.stdout
  assert "LEFT []" in proc.stdout


def test_names_carry_a_random_token_and_a_taken_name_is_drawn_again(monkeypatch):
  """Two containers sharing /dev/shm can run processes with the same pid: a name that exists is
  never opened as ours (FileExistsError), another is drawn."""
  a, b = shm.create("t", 10), shm.create("t", 10)
  try:
    assert a.name != b.name and a.name.startswith(f"ebrl_{os.getpid()}_")
    names = iter([a.name, f"ebrl_{os.getpid()}_fresh_t_0"])
    monkeypatch.setattr(shm, "_new_name", lambda tag: next(names))
    c = shm.create("t", 10)
    assert c.name == f"ebrl_{os.getpid()}_fresh_t_0"
    shm.release(c, owner=True)
  finally:
    shm.release(a, owner=True)
    shm.release(b, owner=True)


def test_a_read_that_the_counter_passes_but_the_checksum_does_not_is_read_again():
  """On weakly ordered CPUs a reader can see a buffer's counter even and unchanged while its
  leaves are torn. Such a buffer (made here by hand) is never returned: the read waits for a whole
  version."""
  import threading  # pylint: disable=g-import-not-at-top

  slot = ParamSlot.create([np.zeros(4, np.float32), np.zeros(3, np.float32)])
  try:
    slot.write([np.full(4, 1.0, np.float32), np.full(3, 1.0, np.float32)], 1)
    slot._leaves[slot._active[0]][1][:] = 2.0  # pylint: disable=protected-access  # A later write's store.
    timer = threading.Timer(0.3, slot.write, ([np.full(4, 3.0, np.float32), np.full(3, 3.0, np.float32)], 3))
    timer.start()
    leaves, version = slot.read()
    timer.join()
    assert version == 3 and all((leaf == 3.0).all() for leaf in leaves)
  finally:
    slot.close()
