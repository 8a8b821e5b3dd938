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


def test_a_killed_producer_is_noticed_and_its_ring_is_removed():
  ring = SegmentRing.create(FIELDS, slots=2, mp_context=SPAWN)
  child = SPAWN.Process(target=workers.produce, args=(ring, 2, True))  # Then sleeps until killed.
  child.start()
  try:
    for _ in range(2):
      assert ring.get(timeout=30) is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join(timeout=10)
    assert child.exitcode == -signal.SIGKILL
    assert ring.get(timeout=0.2) is None  # Nothing more comes, and the wait ends on its own.
  finally:
    if child.is_alive():
      child.kill()
    ring.close()
  assert shm.leftover_blocks(os.getpid()) == []


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
