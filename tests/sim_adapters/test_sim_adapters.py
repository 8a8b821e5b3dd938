"""The SimAdapter contract (sim_adapters/base.py) for every env family EBRL drives.

Every adapter comes from `sim_adapters.make_adapter`, with 2-4 envs (10-20 for
MT10, 50 for MT50: one per task). Async tests drive the raw EnvPool through `_PoolGuard`, which checks
EnvPool's own rule (never send to or reset an env that is still in flight) and
raises where a raw `recv` could only block forever, so a misuse fails the test
instead of hanging or crashing the test process. The same guard injects NaN
into one raw row (observation or reward) to exercise the non-finite guard.
"""

from __future__ import annotations

import time

import envpool
import numpy as np
import pytest

from sim_adapters import UnknownEnvError, check_env_name, make_adapter
from sim_adapters.base import gather_all

F32 = np.dtype(np.float32)

# name, num_envs, action_dim, state_dim, extra obs keys, has_success
FAMILIES = [
    ("MetaWorld/Reach-v3", 3, 4, 39, (), True),
    ("MetaWorld/Push-v3", 3, 4, 39, (), True),
    ("MetaWorld/MT10", 10, 4, 39, ("task",), True),
    ("MetaWorld/MT50", 50, 4, 39, ("task",), True),
    ("MetaWorld/MT:Reach-v3,Push-v3,DialTurn-v3", 4, 4, 39, ("task",), True),
    ("PandaPickCube-v1", 2, 8, 66, (), True),
    ("PandaOpenCabinet-v1", 2, 8, 55, (), True),
    ("LeapCubeReorient-v1", 2, 16, 57, ("privileged_state",), True),
    ("Go1JoystickFlatTerrain-v1", 2, 12, 48, ("privileged_state",), False),
    ("Ant-v4", 2, 8, 27, (), False),
    ("HalfCheetah-v4", 2, 6, 17, (), False),
    ("CartpoleBalance-v1", 2, 1, 5, (), False),
    ("WalkerWalk-v1", 2, 6, 24, (), False),
]


def random_actions(spec, n, rng):
  return rng.uniform(spec.action_low, spec.action_high, size=(n, spec.action_dim)).astype(np.float32)


def check_batch(spec, batch, n):
  """Types and shapes of a StepBatch with n rows, and the success convention."""
  assert len(batch) == n
  assert set(batch.obs) == set(spec.obs)
  for key, obs_spec in spec.obs.items():
    v = batch.obs[key]
    assert v.dtype == F32, key
    assert v.shape == (n, *obs_spec.shape), key
    assert np.isfinite(v).all(), key
  assert batch.reward.dtype == F32 and batch.reward.shape == (n,)
  assert np.isfinite(batch.reward).all()
  for field in (batch.terminated, batch.truncated, batch.reset_step):
    assert field.dtype == np.bool_ and field.shape == (n,)
  assert batch.env_ids.dtype == np.int32 and batch.env_ids.shape == (n,)
  assert batch.success.dtype == F32 and batch.success.shape == (n,)
  if spec.has_success:
    assert np.isin(batch.success, (0.0, 1.0)).all(), batch.success
  else:
    assert np.isnan(batch.success).all(), batch.success


class _PoolGuard:
  """Wraps an adapter's raw EnvPool: in-flight bookkeeping plus one-shot NaN injection."""

  def __init__(self, adapter):
    self.pool = adapter._pool  # pylint: disable=protected-access
    self.num_envs = adapter.num_envs
    self.batch_size = adapter.batch_size
    self.is_async = adapter.is_async
    self.in_flight: set[int] = set()
    self.poisoned: list[int] = []  # env ids whose raw row got a NaN
    self._poison_next = None
    self._orig = {k: getattr(self.pool, k) for k in ("_reset", "send", "recv")}
    self.pool._reset = self._reset
    self.pool.send = self._send
    self.pool.recv = self._recv

  def _start(self, env_ids, what):
    ids = [int(i) for i in np.asarray(env_ids).reshape(-1)]
    busy = sorted(set(ids) & self.in_flight)
    assert not busy, f"EnvPool {what} for envs {busy} that are still in flight"
    self.in_flight.update(ids)

  def _reset(self, env_ids):
    self._start(env_ids, "reset")
    return self._orig["_reset"](env_ids)

  def _send(self, action, env_id=None):
    self._start(np.arange(self.num_envs) if env_id is None else env_id, "send")
    return self._orig["send"](action, env_id)

  def _recv(self, *args, **kwargs):
    need = self.batch_size if self.is_async else 1
    assert len(self.in_flight) >= need, (
        f"raw recv would block forever: it waits for {need} envs, {len(self.in_flight)} in flight")
    out = self._orig["recv"](*args, **kwargs)
    ids = [int(i) for i in out[-1]["env_id"]]
    assert set(ids) <= self.in_flight, (ids, self.in_flight)
    self.in_flight.difference_update(ids)
    if self._poison_next == "reward":
      self._poison_next = None
      self.poisoned.append(ids[0])
      reward = np.array(out[1], np.float32)
      reward[0] = np.nan
      out = (out[0], reward, *out[2:])
    elif self._poison_next == "obs":
      self._poison_next = None
      self.poisoned.append(ids[0])
      obs = out[0]
      if isinstance(obs, dict):
        obs = dict(obs)
        key = "state" if "state" in obs else next(iter(obs))
        obs[key] = np.array(obs[key], np.float64)
        obs[key].reshape(len(ids), -1)[0, 0] = np.nan
      else:
        obs = np.array(obs, np.float64)
        obs.reshape(len(ids), -1)[0, 0] = np.nan
      out = (obs, *out[1:])
    return out

  def poison_next_recv(self, field="obs"):
    """The next raw batch gets a NaN in its first row's observation (or reward)."""
    self._poison_next = field


# -- every family --------------------------------------------------------------


@pytest.mark.parametrize("name,n,action_dim,state_dim,extra_keys,has_success", FAMILIES,
                         ids=[f[0] for f in FAMILIES])
def test_contract(make, name, n, action_dim, state_dim, extra_keys, has_success):
  adapter = make(name, n)
  spec = adapter.spec
  assert adapter.num_envs == n
  assert spec.name == name
  assert set(spec.obs) == {"state", *extra_keys}
  assert spec.obs["state"].shape == (state_dim,)
  assert spec.obs["state"].dtype == F32
  for obs_spec in spec.obs.values():
    assert len(obs_spec.shape) == 1 and obs_spec.shape[0] > 0
  assert spec.action_dim == action_dim
  for bound in (spec.action_low, spec.action_high):
    assert bound.shape == (action_dim,) and bound.dtype == F32 and np.isfinite(bound).all()
  assert (spec.action_low < spec.action_high).all()
  assert spec.max_episode_steps > 0
  assert spec.has_success is has_success

  adapter.reset()
  first = gather_all(adapter, n)
  check_batch(spec, first, n)
  np.testing.assert_array_equal(first.env_ids, np.arange(n))
  assert first.reset_step.all()
  assert not first.done.any()

  rng = np.random.default_rng(0)
  prev = first
  for _ in range(3):
    batch = adapter.step(random_actions(spec, n, rng))
    check_batch(spec, batch, n)
    np.testing.assert_array_equal(batch.env_ids, np.arange(n))
    # A row is a reset exactly when that env's previous row ended its episode.
    np.testing.assert_array_equal(batch.reset_step, prev.done)
    prev = batch
  assert not np.array_equal(prev.obs["state"], first.obs["state"]), "the simulation did not move"


@pytest.mark.parametrize("name", ["MetaWorld/Reach-v3", "MetaWorld/Push-v3"])
def test_metaworld_goal_observable(make, name):
  adapter = make(name, 4)
  adapter.reset()
  goal = gather_all(adapter, 4).obs["state"][:, -3:]
  assert (goal != 0).all(), goal
  # Each env is seeded differently, so goals are not all equal.
  assert len(np.unique(goal[:, :2], axis=0)) > 1, goal


@pytest.mark.parametrize("name,keys", [
    ("CartpoleBalance-v1", ("position", "velocity")),
    ("WalkerWalk-v1", ("orientations", "height", "velocity")),  # the space's order, not sorted
])
def test_dmc_dict_obs_flattened_in_space_order(make, name, keys):
  raw = envpool.make(name, env_type="gymnasium", num_envs=2, seed=0)
  try:
    assert tuple(raw.observation_space.spaces) == keys
    raw_obs, info = raw.reset()
  finally:
    raw.close()
  order = np.argsort(info["env_id"])
  expected = np.concatenate(
      [np.asarray(raw_obs[k], np.float32).reshape(2, -1)[order] for k in keys], axis=1)
  adapter = make(name, 2, seed=0)
  assert adapter.spec.obs["state"].shape == (expected.shape[1],)
  adapter.reset()
  state = gather_all(adapter, 2).obs["state"]
  assert state.dtype == F32
  np.testing.assert_array_equal(state, expected)
  if name == "CartpoleBalance-v1":
    assert expected.shape == (2, 5)  # position(3) + velocity(2)


@pytest.mark.parametrize("name,n,batch_size", [("MetaWorld/Reach-v3", 6, 2), ("MetaWorld/MT10", 20, 10)])
def test_construction_steps_no_env(make, monkeypatch, name, n, batch_size):
  """No reset/send/recv before `reset()`: an async pool left with envs in flight breaks EnvPool."""
  calls = []
  real_make = envpool.make

  def recording_make(*args, **kwargs):
    pool = real_make(*args, **kwargs)
    for method in ("_reset", "send", "recv"):
      orig = getattr(pool, method)
      setattr(pool, method, lambda *a, _m=method, _f=orig, **k: (calls.append(_m), _f(*a, **k))[1])
    return pool

  monkeypatch.setattr(envpool, "make", recording_make)
  adapter = make(name, n, batch_size=batch_size)
  assert calls == []
  adapter.reset()
  assert len(adapter.recv()) >= 1
  if name.endswith("MT10"):
    # Ten pools reset; their receiver threads then wait on every pool at once.
    assert calls[:10] == ["_reset"] * 10 and set(calls[10:]) == {"recv"} and len(calls) <= 10 + n
  else:
    assert calls == ["_reset", "recv"]


# -- MT10 -------------------------------------------------------------------------


def test_mt10_one_env_per_task(make):
  adapter = make("MetaWorld/MT10", 10)
  assert adapter.spec.num_tasks == 10
  assert adapter.spec.obs["task"].shape == (10,)
  np.testing.assert_array_equal(np.sort(adapter.task_ids), np.arange(10))
  assert len(adapter.instructions) == 10
  assert all(isinstance(s, str) and s.strip() for s in adapter.instructions)
  assert len(set(adapter.instructions)) == 10

  adapter.reset()
  first = gather_all(adapter, 10)
  batch = adapter.step(random_actions(adapter.spec, 10, np.random.default_rng(0)))
  for b in (first, batch):
    task = b.obs["task"]
    assert ((task == 0) | (task == 1)).all() and (task.sum(axis=1) == 1).all()
    np.testing.assert_array_equal(task.argmax(axis=1), adapter.task_ids[b.env_ids])
  # Goal-observable for every task (WindowClose's goal has x == 0, so not every entry).
  assert (np.abs(first.obs["state"][:, -3:]).sum(axis=1) > 0).all()
  # Ten different tasks: ten different initial observations.
  assert len(np.unique(first.obs["state"], axis=0)) == 10


def test_mt10_keeps_its_tasks_order_instructions_and_seeds(make):
  """MT10 as it always was: task k is MT10's k-th task, seeded seed + 1000 k, with its instruction."""
  from sim_adapters.multitask import MT10_TASKS
  assert list(MT10_TASKS) == ["Reach-v3", "Push-v3", "PickPlace-v3", "DoorOpen-v3", "DrawerOpen-v3",
                              "DrawerClose-v3", "ButtonPressTopdown-v3", "PegInsertSide-v3", "WindowOpen-v3",
                              "WindowClose-v3"]
  assert MT10_TASKS["Reach-v3"] == "reach the goal position"
  assert MT10_TASKS["ButtonPressTopdown-v3"] == "press the button from the top"
  assert MT10_TASKS["WindowClose-v3"] == "slide the window closed"
  adapter = make("MetaWorld/MT10", 10, seed=3)
  assert adapter.tasks == tuple(MT10_TASKS)
  assert adapter.instructions == list(MT10_TASKS.values())
  adapter.reset()
  mt10 = gather_all(adapter, 10).obs["state"]
  for k in (0, 7):  # A task's pool is that task alone, seeded seed + 1000 k.
    single = make(f"MetaWorld/{adapter.tasks[k]}", 1, seed=3 + 1000 * k)
    single.reset()
    np.testing.assert_array_equal(gather_all(single, 1).obs["state"][0], mt10[k])


def test_mt50_is_every_metaworld_task_envpool_registers_each_with_an_instruction(make):
  from sim_adapters import tasks
  registered = tuple(n.split("/", 1)[1] for n in envpool.list_all_envs() if n.startswith("MetaWorld/"))
  assert tasks.MT50 == registered and len(tasks.MT50) == 50
  assert set(tasks.MT10) <= set(tasks.MT50)
  texts = list(tasks.METAWORLD_INSTRUCTIONS.values())
  assert len(set(texts)) == 50 and all(t == t.strip().lower() and len(t.split()) >= 2 for t in texts)
  adapter = make("MetaWorld/MT50", 50)
  assert adapter.spec.num_tasks == 50 and adapter.spec.obs["task"].shape == (50,)
  assert adapter.tasks == tasks.MT50
  assert adapter.instructions == [tasks.METAWORLD_INSTRUCTIONS[t] for t in tasks.MT50]
  np.testing.assert_array_equal(adapter.task_ids, np.arange(50))


def test_a_users_task_list_in_its_own_order(make):
  adapter = make("MetaWorld/MT:DialTurn-v3, Reach-v3", 5)
  assert adapter.tasks == ("DialTurn-v3", "Reach-v3")
  assert adapter.spec.name == "MetaWorld/MT:DialTurn-v3, Reach-v3"
  assert adapter.spec.num_tasks == 2 and adapter.spec.obs["task"].shape == (2,)
  np.testing.assert_array_equal(adapter.task_ids, [0, 0, 0, 1, 1])
  assert adapter.instructions == ["turn the dial"] * 3 + ["reach the goal position"] * 2
  adapter.reset()
  first = gather_all(adapter, 5)
  np.testing.assert_array_equal(first.obs["task"], np.eye(2, dtype=np.float32)[[0, 0, 0, 1, 1]])
  reach = make("MetaWorld/Reach-v3", 2, seed=1000)  # Task 1's pool: seed + 1000.
  reach.reset()
  np.testing.assert_array_equal(gather_all(reach, 2).obs["state"], first.obs["state"][3:])


@pytest.mark.parametrize("name,message", [
    ("MetaWorld/MT:Reach-v3,Bogus-v3", "unknown MetaWorld task 'Bogus-v3'"),
    ("MetaWorld/MT:", "names no task"),
    ("MetaWorld/MT:Reach-v3,Reach-v3", "lists task 'Reach-v3' 2 times"),
    ("MetaWorld/MT:Reach-v3,,Push-v3", "an empty name"),
])
def test_a_bad_task_list_is_an_unknown_env(name, message):
  with pytest.raises(UnknownEnvError, match=message) as err:
    check_env_name(name)
  assert "\n" not in str(err.value)
  if "times" not in message:
    assert "valid tasks: Assembly-v3, " in str(err.value) and "WindowClose-v3" in str(err.value)


def test_mt10_needs_one_env_per_task():
  with pytest.raises(ValueError, match="at least 10"):
    make_adapter("MetaWorld/MT10", 7)


def test_mt10_uneven_task_shares(make):
  adapter = make("MetaWorld/MT10", 15)
  np.testing.assert_array_equal(np.bincount(adapter.task_ids), [2] * 5 + [1] * 5)
  adapter.reset()
  first = gather_all(adapter, 15)
  np.testing.assert_array_equal(first.obs["task"].argmax(axis=1), adapter.task_ids)
  batch = adapter.step(random_actions(adapter.spec, 15, np.random.default_rng(0)))
  np.testing.assert_array_equal(batch.env_ids, np.arange(15))


def test_mt10_async_recv_returns_a_whole_batch_from_any_pools(make):
  """Async MT10: each env comes back exactly once per send, from any pool, at least batch_size at a
  time while every env is in flight (what a generation call then serves)."""
  adapter = make("MetaWorld/MT10", 40, batch_size=20)
  assert adapter.is_async
  adapter.reset()
  rng = np.random.default_rng(0)
  owed = np.ones(40, np.int64)
  tasks_per_batch, returned = [], 0
  while returned < 400:
    assert adapter.can_recv()
    b = adapter.recv()
    assert len(b) >= 20
    assert (owed[b.env_ids] == 1).all() and len(np.unique(b.env_ids)) == len(b)
    np.testing.assert_array_equal(b.obs["task"].argmax(axis=1), adapter.task_ids[b.env_ids])
    owed[b.env_ids] -= 1
    returned += len(b)
    tasks_per_batch.append(len(np.unique(adapter.task_ids[b.env_ids])))
    adapter.send(random_actions(adapter.spec, len(b), rng), b.env_ids)
    owed[b.env_ids] += 1
  assert max(tasks_per_batch) > 1  # a recv merges rows of several tasks' pools
  adapter.close()


def test_mt10_an_env_sent_while_its_pool_steps_goes_with_the_next_step(make):
  """A scheduler sends a pool's envs in two parts (some held back, then released): the second part
  waits for the pool's step in flight (a sync-mode pool takes one request per recv) and every env
  comes back once, none lost or mixed up."""
  adapter = make("MetaWorld/MT10", 20, batch_size=10)
  guards = [_PoolGuard(sub) for sub in adapter._subs]  # pylint: disable=protected-access
  adapter.reset()
  rng = np.random.default_rng(0)
  first = gather_all(adapter, 20)
  pool0 = first.env_ids[adapter.task_ids[first.env_ids] == 0]
  assert len(pool0) == 2
  adapter.send(random_actions(adapter.spec, 1, rng), pool0[:1])
  adapter.send(random_actions(adapter.spec, 1, rng), pool0[1:])  # Pool 0 is stepping: deferred.
  assert sum(len(g.in_flight) for g in guards) <= 1
  got = gather_all(adapter, 2)
  np.testing.assert_array_equal(np.sort(got.env_ids), np.sort(pool0))
  assert sum(len(g.in_flight) for g in guards) == 0 and not adapter.can_recv()
  adapter.close()


def test_mt10_async_recv_is_short_only_when_no_more_can_come(make):
  """Envs a scheduler holds back (parked) leave less than a batch in flight: recv then returns what
  can come instead of waiting for rows that never will."""
  adapter = make("MetaWorld/MT10", 40, batch_size=20)
  adapter.reset()
  sizes, start = [], time.time()
  while adapter.can_recv():  # Nothing is sent back: every recv drains what is in flight.
    sizes.append(len(adapter.recv()))
    assert time.time() - start < 30
  assert sum(sizes) == 40 and all(n >= 20 for n in sizes[:-1])
  adapter.close()


# -- automatic resets --------------------------------------------------------------


def test_time_limit_truncates_then_resets(make):
  adapter = make("MetaWorld/Reach-v3", 2, max_episode_steps=3)
  assert adapter.spec.max_episode_steps == 3
  adapter.reset()
  first = gather_all(adapter, 2)
  actions = np.zeros((2, 4), np.float32)
  rows = [adapter.step(actions) for _ in range(5)]
  for t in (0, 1):
    assert not rows[t].done.any() and not rows[t].reset_step.any()
  assert rows[2].truncated.all() and not rows[2].terminated.any()
  assert not rows[2].reset_step.any()
  assert rows[3].reset_step.all() and not rows[3].done.any()
  assert not rows[4].reset_step.any() and not rows[4].done.any()
  # Row 3 starts a new episode: a freshly sampled goal.
  np.testing.assert_array_equal(rows[2].obs["state"][:, -3:], first.obs["state"][:, -3:])
  assert not np.allclose(rows[3].obs["state"][:, -3:], rows[2].obs["state"][:, -3:])


@pytest.mark.parametrize("name,n,env", [("MetaWorld/Reach-v3", 3, 1), ("MetaWorld/MT10", 10, 7)])
def test_reset_envs(make, name, n, env):
  adapter = make(name, n)
  adapter.reset()
  gather_all(adapter, n)
  actions = np.zeros((n, adapter.spec.action_dim), np.float32)
  adapter.step(actions)
  adapter.reset_envs(np.array([env]))
  batch = adapter.step(actions)
  check_batch(adapter.spec, batch, n)
  np.testing.assert_array_equal(batch.reset_step, np.arange(n) == env)
  assert not adapter.step(actions).reset_step.any()
  assert adapter.nan_resets == 0


# -- async mode ------------------------------------------------------------------------


def _drive_async(adapter, rounds, rng, row_count=None):
  """send/recv rounds that return what was received; checks in-flight bookkeeping.

  `owed[i]` counts the rows env i still owes (one per reset or send); no env may
  return a row it does not owe. Returns every received batch.
  """
  n = adapter.num_envs
  owed = np.ones(n, np.int64)  # reset() puts every env in flight once
  fresh = np.ones(n, bool)  # next row of the env is the first of an episode
  batches = []
  batch = None
  for _ in range(rounds):
    if batch is not None:
      adapter.send(random_actions(adapter.spec, len(batch), rng), batch.env_ids)
      owed[batch.env_ids] += 1
    batch = adapter.recv()
    if row_count is not None:
      assert len(batch) == row_count
    check_batch(adapter.spec, batch, len(batch))
    ids = batch.env_ids
    assert len(np.unique(ids)) == len(ids), ids
    assert (owed[ids] > 0).all(), f"received {ids} but owed {owed}"
    owed[ids] -= 1
    np.testing.assert_array_equal(batch.reset_step, fresh[ids])
    fresh[ids] = batch.done
    batches.append(batch)
  return batches


def test_async_recv_returns_only_in_flight_envs(make):
  adapter = make("MetaWorld/Reach-v3", 6, batch_size=2)
  assert adapter.is_async
  guard = _PoolGuard(adapter)
  adapter.reset()
  _drive_async(adapter, 20, np.random.default_rng(0), row_count=2)
  assert len(guard.in_flight) == 4  # envs sent but not received: 6 - the 2 just received


def test_mt10_async_recv_returns_only_in_flight_envs(make):
  adapter = make("MetaWorld/MT10", 20, batch_size=10)
  guards = [_PoolGuard(sub) for sub in adapter._subs]  # pylint: disable=protected-access
  assert not any(g.is_async for g in guards)  # Each task's pool steps the envs sent to it together.
  np.testing.assert_array_equal(adapter.task_ids, np.repeat(np.arange(10), 2))
  assert adapter.instructions[::2] == adapter.instructions[1::2]
  adapter.reset()
  batches = _drive_async(adapter, 200, np.random.default_rng(0))
  for b in batches:
    np.testing.assert_array_equal(b.obs["task"].argmax(axis=1), adapter.task_ids[b.env_ids])
  # Every pool is waited on at once: no task starves, however slow its steps and resets.
  assert {int(i) for b in batches for i in adapter.task_ids[b.env_ids]} == set(range(10))
  # Rows not yet received are in their pools or queued by the receivers, none lost.
  owed = 20 - len(batches[-1])
  assert sum(len(g.in_flight) for g in guards) <= owed
  while owed > sum(len(g.in_flight) for g in guards) or adapter.can_recv():
    b = adapter.recv()
    assert not np.isin(b.env_ids, batches[-1].env_ids).any()
    owed -= len(b)
  assert owed == sum(len(g.in_flight) for g in guards)


# -- non-finite guard --------------------------------------------------------------------


def test_nan_guard_sync(make):
  adapter = make("MetaWorld/Reach-v3", 3)
  guard = _PoolGuard(adapter)
  adapter.reset()
  first = gather_all(adapter, 3)
  actions = np.zeros((3, 4), np.float32)
  guard.poison_next_recv()
  batch = adapter.step(actions)
  (bad,) = guard.poisoned
  others = np.arange(3) != bad
  check_batch(adapter.spec, batch, 3)  # finite everywhere
  assert adapter.nan_resets == 1
  assert (batch.obs["state"][bad] == 0).all()
  assert batch.reward[bad] == 0
  assert batch.truncated[bad] and batch.reset_step[bad]
  assert not batch.truncated[others].any() and not batch.reset_step[others].any()

  batch = adapter.step(actions)
  check_batch(adapter.spec, batch, 3)
  np.testing.assert_array_equal(batch.reset_step, ~others)
  assert not batch.done.any()
  state = batch.obs["state"][bad]
  assert state.shape == first.obs["state"][bad].shape
  assert (state[-3:] != 0).all()  # a real first observation, goal included
  np.testing.assert_allclose(state[:3], first.obs["state"][bad, :3], atol=0.02)  # hand at its start
  assert adapter.nan_resets == 1

  batch = adapter.step(actions)
  assert not batch.reset_step.any() and not batch.done.any()
  assert adapter.nan_resets == 1


@pytest.mark.parametrize("num_envs,batch_size", [
    (6, 2),
    (4, 3),  # More envs per batch than idle ones: a reset must not wait for a batch.
])
def test_nan_guard_async(make, num_envs, batch_size):
  adapter = make("MetaWorld/Reach-v3", num_envs, batch_size=batch_size)
  guard = _PoolGuard(adapter)
  adapter.reset()
  rng = np.random.default_rng(0)
  batch = adapter.recv()
  owed = np.ones(num_envs, np.int64)
  owed[batch.env_ids] -= 1
  fresh = np.ones(num_envs, bool)
  fresh[batch.env_ids] = False
  guard.poison_next_recv()
  bad = None
  recovered = False
  extra_rounds = 6  # keep going a little after the bad env is back
  # EnvPool returns whichever envs finish first and a MetaWorld reset is slower than a step,
  # so the reset env may be overtaken for a while: bound by rounds, not by a small count.
  for _ in range(500):
    if recovered:
      extra_rounds -= 1
      if not extra_rounds:
        break
    adapter.send(random_actions(adapter.spec, len(batch), rng), batch.env_ids)
    owed[batch.env_ids] += 1
    batch = adapter.recv()
    check_batch(adapter.spec, batch, len(batch))
    ids = batch.env_ids
    assert (owed[ids] > 0).all(), f"received {ids} but owed {owed}"
    owed[ids] -= 1
    if bad is None:  # the poisoned batch
      (bad,) = guard.poisoned
      row = int(np.flatnonzero(ids == bad)[0])
      assert (batch.obs["state"][row] == 0).all()
      assert batch.truncated[row] and batch.reset_step[row]
      assert adapter.nan_resets == 1
      rest = np.arange(len(ids)) != row
      np.testing.assert_array_equal(batch.reset_step[rest], fresh[ids[rest]])
      assert not batch.truncated[rest].any()
      fresh[ids] = batch.done
      continue
    # Every later row: resets exactly where expected, the bad env's next row included.
    np.testing.assert_array_equal(batch.reset_step, fresh[ids])
    if bad in ids and not recovered:  # its first row after the non-finite one
      row = int(np.flatnonzero(ids == bad)[0])
      assert batch.reset_step[row] and not batch.done[row]
      assert (batch.obs["state"][row, -3:] != 0).all()
      recovered = True
    fresh[ids] = batch.done
  assert recovered, "the env with non-finite physics never came back"
  assert adapter.nan_resets == 1


def test_nan_guard_keeps_success_nan_without_success_signal(make):
  adapter = make("HalfCheetah-v4", 2)
  guard = _PoolGuard(adapter)
  adapter.reset()
  gather_all(adapter, 2)
  guard.poison_next_recv()
  batch = adapter.step(np.zeros((2, 6), np.float32))
  assert adapter.nan_resets == 1
  assert batch.truncated[guard.poisoned[0]]
  assert np.isnan(batch.success).all(), batch.success


def test_reset_row_reward_is_not_physics(make):
  adapter = make("CartpoleBalance-v1", 2)
  guard = _PoolGuard(adapter)
  guard.poison_next_recv("reward")  # what EnvPool's uninitialised reward sometimes holds
  adapter.reset()
  first = gather_all(adapter, 2)
  assert guard.poisoned
  assert first.reset_step.all()
  assert adapter.nan_resets == 0
  assert not first.done.any()
  assert (first.obs["state"] != 0).any(axis=1).all()  # the real first observation survives
  assert np.isfinite(first.reward).all()


# -- names ---------------------------------------------------------------------------------


def test_unknown_env_suggests_close_names():
  with pytest.raises(UnknownEnvError, match="MetaWorld/Reach-v3") as err:
    check_env_name("MetaWorld/Reach-v2")
  assert isinstance(err.value, ValueError)
  assert "MetaWorld/Reach-v2" in str(err.value)
  check_env_name("MetaWorld/Reach-v3")
  check_env_name("MetaWorld/MT10")
  check_env_name("MetaWorld/MT50")
  check_env_name("MetaWorld/MT:Reach-v3,Push-v3")
  with pytest.raises(UnknownEnvError):
    make_adapter("MetaWorld/Reach-v2", 2)


# -- MT10 receivers: a dead one is an error, close never waits on envs not sent ----------


def test_mt10_dead_receiver_is_raised_by_recv(make):
  adapter = make("MetaWorld/MT10", 20, batch_size=10)
  broken = adapter._subs[3]  # pylint: disable=protected-access

  def fail():
    raise OSError("pool 3 lost its simulator")

  broken.recv = fail
  adapter.reset()
  deadline = time.time() + 10
  with pytest.raises(RuntimeError, match="receiver of task DoorOpen-v3 failed: OSError: pool 3 lost"):
    while time.time() < deadline:  # Rows from healthy pools come first; the error within 10 s.
      b = adapter.recv()
      adapter.send(np.zeros((len(b), 4), np.float32), b.env_ids)
  assert adapter.can_recv()  # So a scheduler waiting to recv goes to recv and meets the error.


def test_mt10_close_is_quick_with_envs_left_unsent(make):
  """Envs parked by a scheduler leave pools without a whole batch in flight; close must not wait on them."""
  adapter = make("MetaWorld/MT10", 40, batch_size=20)
  adapter.reset()
  first = adapter.recv()  # Received and never sent again: their pools stay short of a batch.
  assert len(first)
  start = time.time()
  adapter.close()
  assert time.time() - start < 2.0
