"""The Admission object both async schedulers share: grants, parked envs, the deadlock breaker."""

from __future__ import annotations

import threading
import time

import numpy as np

from ebrl.scheduler.admission import Admission
from ebrl.trajectories.queue import TrajectoryQueue


def _obs(ids):
  return {"state": np.asarray(ids, np.float32)[:, None]}


def test_parked_envs_are_released_oldest_first_as_room_comes_back():
  q = TrajectoryQueue(segments_per_update=2, max_staleness=0)  # Room for 2 starts per version.
  adm = Admission(q, num_groups=2)
  assert adm.grant(3) == (2, 0)  # Capacity 2: one of the 3 is not granted.
  adm.park(1, np.array([7]), _obs([7]))
  adm.park(0, np.array([3, 4]), _obs([3, 4]))
  assert adm.release_parked() == []  # No room: all stay parked.
  q.put("a", 0)
  q.put("b", 0)
  assert len(q.get_batch(timeout=0.0)) == 2
  adm.published(1)  # Room for 2 more, at version 1.
  released = adm.release_parked()
  assert [(r.group, r.ids.tolist(), r.start_version, r.forced) for r in released] == [(1, [7], 1, False),
                                                                                   (0, [3], 1, False)]
  np.testing.assert_array_equal(released[1].obs["state"][:, 0], [3.0])  # Each env keeps its own row.
  assert q.forced == 0


def test_the_breaker_starts_one_parked_env_beyond_capacity_only_when_deadlocked():
  q = TrajectoryQueue(segments_per_update=2, max_staleness=0)
  adm = Admission(q, num_groups=2)
  assert adm.grant(2) == (2, 0)
  adm.park(0, np.array([1, 2]), _obs([1, 2]))
  adm.starved[0].set()
  adm.starved[1].set()
  assert not adm.deadlocked() and adm.release_parked() == []  # The learner is not waiting.
  waiting = threading.Thread(target=q.get_batch, args=(1.0,))
  waiting.start()
  deadline = time.time() + 5
  while not q.learner_waiting and time.time() < deadline:
    time.sleep(0.005)
  adm.starved[1].clear()
  assert not adm.deadlocked() and adm.release_parked() == []  # Group 1 can still return envs.
  adm.starved[1].set()
  assert adm.deadlocked()
  released = adm.release_parked()
  assert [(r.ids.tolist(), r.forced) for r in released] == [([1], True)]  # One env, beyond capacity.
  assert q.forced == 1
  adm.close()
  waiting.join()


def test_reserve_numbers_grants_in_order_and_waits_for_room():
  q = TrajectoryQueue(segments_per_update=1, max_staleness=1)  # Room for 2 starts.
  adm = Admission(q, num_groups=1)
  assert adm.reserve(0.0) == (0, 0) and adm.reserve(0.0) == (1, 0)
  t0 = time.perf_counter()
  assert adm.reserve(0.05) is None and time.perf_counter() - t0 >= 0.04  # Full: waited, nothing granted.
  woke = []
  waiter = threading.Thread(target=lambda: woke.append(adm.reserve(5.0)))
  waiter.start()
  time.sleep(0.05)
  q.put("a", 0)
  assert q.get_batch(timeout=0.0) == ["a"]
  adm.published(1)  # Wakes the waiter long before its 5 s; it retries on its next call.
  waiter.join(timeout=2.0)
  assert not waiter.is_alive() and woke == [None]
  assert adm.reserve(0.0) == (2, 1)
