"""The asynchronous pipeline's contracts: assembly order, the staleness bound,
eta = 0 equals on-policy PPO, clean shutdown and errors that surface."""

from __future__ import annotations

import dataclasses

import heapq
import threading

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from interrupt import interrupt_run
from ebrl.assembler import TrajectoryAssembler
from ebrl.learner import Learner, LearnerConfig
from ebrl.rollout import RolloutBuffer
from ebrl.sampler import Actions
from ebrl.scheduler import make_scheduler
from ebrl.trainer import Trainer
from ebrl.trajectory_queue import TrajectoryQueue, fresh_mask
from launch.configs import default
from policies.mlp import MLPPolicy
from sim_adapters import make_adapter
from sim_adapters.base import EnvSpec, ObsSpec, StepBatch
from sim_adapters.envpool_adapter import gather_all

T, N = 6, 4


def _actions(rng, n, dim) -> Actions:
  a = rng.uniform(-1, 1, (n, dim)).astype(np.float32)
  return Actions(a, a, rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32))


def _rows(b: StepBatch, idx) -> StepBatch:
  return StepBatch({k: v[idx] for k, v in b.obs.items()}, b.reward[idx], b.terminated[idx], b.truncated[idx],
                   b.success[idx], b.env_ids[idx], b.reset_step[idx])


@pytest.mark.parametrize("split", [False, True])
def test_assembler_matches_sync_rollout_on_a_deterministic_env(split):
  """Segments equal the columns of a synchronous [T, N] rollout of the same steps,
  whatever order and grouping the rows arrive in; obs[T] is the bootstrap obs."""
  adapter = make_adapter("MetaWorld/Reach-v3", N, seed=3, max_episode_steps=4)  # Episodes end inside segments.
  spec = adapter.spec
  rng = np.random.default_rng(0)
  segments = []
  asm = TrajectoryAssembler(spec, N, T, segments.append)
  buf = RolloutBuffer(spec, T, N)
  adapter.reset()
  result = gather_all(adapter, N)
  order_rng = np.random.default_rng(1)

  def feed(b: StepBatch, acts: Actions | None):
    parts = np.array_split(order_rng.permutation(N), 3) if split else [np.arange(N)]
    for idx in parts:
      sub = _rows(b, idx)
      asm.complete(sub.env_ids, sub)
      if acts is not None:
        asm.start(sub.env_ids, sub.obs, Actions(*(x[idx] for x in acts)), version=7)

  for step in range(T + 1):
    acts = _actions(rng, N, spec.action_dim)
    feed(result, acts if step < T else None)
    if step == T:
      break
    nxt = adapter.step(acts.env_action)
    buf.store(step, result.obs, acts, 7, nxt)
    result = nxt
  adapter.close()
  assert sorted(s.env_id for s in segments) == list(range(N))
  for seg in segments:
    i = seg.env_id
    np.testing.assert_array_equal(seg.obs["state"][:T], buf.obs["state"][:, i])
    np.testing.assert_array_equal(seg.obs["state"][T], result.obs["state"][i])  # bootstrap obs
    for name in ("actions", "logp", "rewards", "terminated", "done", "valid", "version"):
      np.testing.assert_array_equal(getattr(seg, name), getattr(buf, name)[:, i], err_msg=name)
  assert any(s.done.any() for s in segments) and any((~s.valid).any() for s in segments)


def _simulate(durations: list[float], eta: int, b: int, updates: int, seed: int, jitter: float = 0.5):
  """Event-driven run of the real assembler and queue: env i takes durations[i] per step
  (times a uniform factor in [1 - jitter, 1 + jitter]); the learner consumes b segments whenever available. Returns, per update,
  the learner version and the versions of the samples it received."""
  spec = EnvSpec("toy", {"state": ObsSpec((1,), np.dtype(np.float32))}, 1, -np.ones(1, np.float32),
                 np.ones(1, np.float32), 100, False)
  n = len(durations)
  q = TrajectoryQueue(b, eta)
  asm = TrajectoryAssembler(spec, n, T, q.put)
  rng = np.random.default_rng(seed)
  parked: list[int] = []
  events = [(0.0, i) for i in range(n)]  # (time, env): the env's row is ready
  heapq.heapify(events)
  used = []
  now = 0.0

  def serve(i):
    if asm.needs_new_segment(np.array([i]))[0] and not q.try_start(1):
      parked.append(i)
      return
    zero = np.zeros((1, 1), np.float32)
    asm.start(np.array([i]), {"state": zero}, Actions(zero, zero, np.zeros(1, np.float32), np.zeros(1, np.float32)),
              q.version)
    heapq.heappush(events, (now + durations[i] * rng.uniform(1.0 - jitter, 1.0 + jitter), i))

  while len(used) < updates:
    now, i = heapq.heappop(events)
    row = StepBatch({"state": np.zeros((1, 1), np.float32)}, np.zeros(1, np.float32), np.zeros(1, bool),
                    np.zeros(1, bool), np.full(1, np.nan, np.float32), np.array([i], np.int32), np.zeros(1, bool))
    asm.complete(row.env_ids, row)
    serve(i)
    while True:
      batch = q.get_batch(timeout=0)
      if batch is None:
        break
      used.append((q.version, np.stack([s.version for s in batch])))
      q.set_version(q.version + 1)
      waiting, parked[:] = list(parked), []
      for j in waiting:
        serve(j)
    assert events or parked, "deadlock: no env can make progress"
  return used


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    durations=st.lists(st.floats(0.1, 10.0), min_size=2, max_size=8),
    eta=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_staleness_bound_over_random_timings(durations, eta, seed):
  n = len(durations)
  used = _simulate(durations, eta, b=n, updates=6, seed=seed)
  for version, versions in used:
    fresh = fresh_mask(version, versions, eta)
    # What the learner keeps is never more than eta versions old ...
    assert ((version - versions)[fresh] <= eta).all()
    assert (versions <= version).all()  # ... and never from the future.


@pytest.mark.parametrize("n", [2, 5, 8])
@pytest.mark.parametrize("eta", [0, 1, 3])
def test_equal_speed_envs_need_no_masking(n, eta):
  """The capacity rule alone keeps envs of one fixed speed within eta: the learner drops nothing.

  (With jitter, a segment started at version v can still be running when the
  learner reaches v + eta + 1; those samples are masked, which the test above covers.)
  """
  used = _simulate([1.0] * n, eta, b=n, updates=6, seed=0, jitter=0.0)
  for version, versions in used:
    assert fresh_mask(version, versions, eta).all()


@pytest.mark.parametrize("durations", [[1.0, 1.0, 1.0], [1.0, 5.0, 0.5, 2.0]])
def test_eta_zero_is_on_policy(durations):
  for version, versions in _simulate(durations, 0, b=len(durations), updates=5, seed=0):
    assert (versions == version).all()


@pytest.mark.parametrize("correction,lam", [("decoupled_ppo", 0.95), ("vtrace", 1.0)])
def test_eta_zero_update_equals_sync_ppo(correction, lam):
  """Segments of on-policy data give the update sync PPO gives on the same data.

  V-trace's advantage r_t + gamma * vs_{t+1} - V_t equals GAE's only at lambda = 1
  (IMPALA's definition), so that correction is compared there.
  """
  spec = EnvSpec("toy", {"state": ObsSpec((3,), np.dtype(np.float32))}, 2, -np.ones(2, np.float32),
                 np.ones(2, np.float32), 10, False)
  policy = MLPPolicy(spec, hidden=(16,))
  cfg = LearnerConfig(epochs=2, num_minibatches=2, max_staleness=0, gae_lambda=lam)
  learner = Learner(policy, dataclasses.replace(cfg, correction=correction))
  sync_learner = Learner(policy, cfg)
  state = learner.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  obs = rng.normal(size=(T + 1, N, 3)).astype(np.float32)
  actions = rng.normal(size=(T, N, 2)).astype(np.float32)
  logp, _, values = jax.jit(policy.evaluate)(state.params, {"state": obs},
                                             np.concatenate([actions, np.zeros((1, N, 2), np.float32)]))
  done = rng.random((T, N)) < 0.2
  common = dict(actions=actions, logp=np.asarray(logp)[:T], rewards=rng.normal(size=(T, N)).astype(np.float32),
                terminated=done & (rng.random((T, N)) < 0.5), done=done, valid=np.ones((T, N), bool),
                version=np.zeros((T, N), np.int32))
  from ebrl.types import Rollout, SegmentBatch  # pylint: disable=g-import-not-at-top
  copy = lambda s: jax.tree.map(jnp.copy, s)
  sync_state, _ = sync_learner.update(copy(state), Rollout(obs={"state": obs[:T]}, values=np.asarray(values), **common))
  async_state, metrics = learner.update_segments(copy(state), SegmentBatch(obs={"state": obs}, **common))
  for a, b in zip(jax.tree.leaves(sync_state.params), jax.tree.leaves(async_state.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  assert int(metrics["stale_dropped"]) == 0


def _tiny_ebrl_config(total: int):
  cfg = default.get_config()
  cfg.scheduler = "ebrl"
  cfg.num_envs = 8
  cfg.rollout_length = 8
  cfg.total_env_steps = total
  cfg.policy.hidden = (16, 16)
  cfg.algorithm.epochs = 1
  cfg.algorithm.num_minibatches = 2
  cfg.ebrl.num_groups = 2
  cfg.ebrl.max_staleness = 1
  cfg.checkpoint_every_s = 1e9
  return cfg


def _stage_threads():
  return [t for t in threading.enumerate() if t.name in ("sampler", "learner") or t.name.startswith("group")]


def test_ebrl_run_trains_bounds_staleness_and_leaves_no_thread(tmp_path):
  trainer = Trainer(_tiny_ebrl_config(2_000), str(tmp_path), progress=False)
  seen = []
  trainer.update_hooks.append(lambda t: seen.append(t._last_metrics))  # pylint: disable=protected-access
  make_scheduler("ebrl", trainer).run(2_000)
  summary = trainer.finish()
  assert not _stage_threads()
  assert summary["env_steps"] >= 2_000 and summary["policy_version"] >= 20
  for m in seen:
    assert int(m["staleness_max"]) <= 1
  assert (tmp_path / "trace.json").is_file() and (tmp_path / "plots" / "timeline.png").is_file()


def test_resumed_ebrl_run_keeps_the_staleness_bound_without_dropping(tmp_path):
  """A resumed run counts its earlier updates' segments as started: no burst of too-stale segments."""
  trainer = Trainer(_tiny_ebrl_config(1_000), str(tmp_path), progress=False)
  make_scheduler("ebrl", trainer).run(1_000)
  first = trainer.finish()
  cfg = _tiny_ebrl_config(2_000)
  cfg.resume = True
  trainer = Trainer(cfg, str(tmp_path), progress=False)
  assert int(trainer.state.version) == first["policy_version"] > 0
  seen = []
  trainer.update_hooks.append(lambda t: seen.append(t._last_metrics))  # pylint: disable=protected-access
  scheduler = make_scheduler("ebrl", trainer)
  scheduler.run(2_000)
  trainer.finish()
  assert len(seen) >= 5
  for m in seen:
    assert int(m["staleness_max"]) <= 1, m
  # Every dropped sample comes from a segment the deadlock breaker started beyond capacity (on a
  # loaded machine a starved group may need one); none from the resume itself, which would drop
  # the earlier updates' segments in a burst.
  dropped = sum(int(m["stale_dropped"]) for m in seen)
  assert dropped <= scheduler.queue.forced * cfg.rollout_length, (dropped, scheduler.queue.forced)


def test_queue_resume_counts_earlier_updates_as_started():
  q = TrajectoryQueue(segments_per_update=4, max_staleness=2)
  q.resume_at(10)
  assert q.version == 10 and q.capacity() == (2 + 1) * 4


def test_stage_exception_surfaces_as_the_runs_error(tmp_path):
  trainer = Trainer(_tiny_ebrl_config(10**9), str(tmp_path), progress=False)

  def broken(*_):
    raise FloatingPointError("learner exploded")

  trainer.learner.update_segments = broken
  with pytest.raises(FloatingPointError, match="learner exploded"):
    make_scheduler("ebrl", trainer).run(10**9)
  assert not _stage_threads()
  trainer.adapter.close()


def test_ctrl_c_stops_threads_saves_checkpoint_and_summary(tmp_path):
  """SIGINT mid-run: the run ends within 10 s with a checkpoint and summary.json."""
  summary = interrupt_run(tmp_path / "run", [
      "--config.scheduler=ebrl", "--config.num_envs=8", "--config.rollout_length=8",
      "--config.policy.hidden=(16,16)", "--config.algorithm.num_minibatches=2"])
  assert summary["scheduler"] == "ebrl"
