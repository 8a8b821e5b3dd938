"""The asynchronous pipeline's contracts: assembly order, the staleness bound,
eta = 0 equals on-policy PPO, clean shutdown and errors that surface."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import types

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fake_env import FakeAsyncEnv
from interrupt import interrupt_run
from ebrl.trajectories.assembler import TrajectoryAssembler
from ebrl.learner import Learner, LearnerConfig
from ebrl.trajectories.rollout_buffer import RolloutBuffer
from ebrl.sampler import Actions
from ebrl.scheduler import make_scheduler
from ebrl.trainer import Trainer
from ebrl.telemetry.writers import read_jsonl
from ebrl.trajectories.queue import TrajectoryQueue
from tiny_configs import run_to_end, tiny_config
from policies.mlp import MLPPolicy
from sim_adapters import make_adapter
from sim_adapters.base import EnvSpec, ObsSpec, StepBatch
from sim_adapters.groups import EnvGroups
from sim_adapters.base import gather_all

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


# -- the staleness bound, driven through the real scheduler -----------------------------


def _record_batches(q: TrajectoryQueue) -> list:
  """Wraps q.get_batch so every batch the learner takes is recorded as (learner version, segments)."""
  taken, get_batch = [], q.get_batch

  def recording_get_batch(timeout):
    version = q.version
    items = get_batch(timeout)
    if items is not None:
      taken.append((version, items))
    return items

  q.get_batch = recording_get_batch
  return taken


def _ebrl_with_fake_envs(tmp_path, *, eta: int, group_envs: int, recv_batch: int, step_s, seed: int,
                         updates: int, learner_s: float = 0.0, groups: int = 2, jitter: float = 0.5):
  """A real ebrl run (HostAsyncScheduler, queue, assembler, sampler, learner) over FakeAsyncEnv groups.

  Returns the scheduler, the trainer, every batch the learner took as (learner version, segments),
  and the per-update metrics.
  """
  cfg = _tiny_ebrl_config(10**9)
  cfg.num_envs = groups * group_envs
  cfg.rollout_length = 4
  cfg.ebrl.num_groups = groups
  cfg.ebrl.max_staleness = eta
  cfg.ebrl.recv_batch = recv_batch
  cfg.algorithm.num_minibatches = 1
  cfg.total_env_steps = updates * cfg.num_envs * cfg.rollout_length
  trainer = Trainer(cfg, str(tmp_path), progress=False)
  trainer.host_envs.close()
  rng = np.random.default_rng(seed)
  trainer.host_envs = EnvGroups([
      FakeAsyncEnv(trainer.spec, group_envs, recv_batch, rng.uniform(0.2, 1.0, group_envs) * step_s,
                   seed=seed + g, jitter=jitter) for g in range(groups)])
  scheduler = make_scheduler("ebrl", trainer.run_context())
  taken, seen = _record_batches(scheduler.queue), []
  if learner_s:
    update = trainer.learner.update_segments
    delays = np.random.default_rng(seed + 99)

    def slow_update(state, batch):
      time.sleep(learner_s * delays.uniform(0.0, 2.0))
      return update(state, batch)

    trainer.learner.update_segments = slow_update
  seen.extend(dict(report.metrics) for report in trainer.run(scheduler=scheduler))
  trainer.finish()
  assert not _stage_threads()
  return scheduler, trainer, taken, seen


def _check_staleness(taken, seen, eta: int) -> None:
  """Staleness from the behaviour versions, before any masking: regular segments within eta;
  whatever the learner dropped comes from force-started ones; its metrics say the same."""
  assert len(taken) == len(seen)
  for (version, segments), metrics in zip(taken, seen):
    lags = [version - s.version[s.valid] for s in segments]
    regular = [l for l, s in zip(lags, segments) if not s.forced]
    assert all((l <= eta).all() and (l >= 0).all() for l in regular), (version, regular)
    dropped = sum(int((l > eta).sum()) for l in lags)
    assert int(metrics["stale_dropped"]) == dropped
    assert int(metrics["staleness_max"]) == max((int(l.max()) for l in lags if len(l)), default=0)


@hypothesis.settings(max_examples=6, deadline=None, derandomize=True)
@hypothesis.given(eta=st.integers(0, 2), seed=st.integers(0, 2**16), slow_learner=st.booleans())
def test_staleness_bound_over_random_timings(tmp_path_factory, eta, seed, slow_learner):
  """Stragglers (step times up to 5x apart, jittered), a learner that is sometimes the bottleneck,
  and groups whose recv needs most of their envs in flight: no regular sample is ever older than
  eta, and every dropped one was force-started by the deadlock breaker."""
  scheduler, trainer, taken, seen = _ebrl_with_fake_envs(
      tmp_path_factory.mktemp("run"), eta=eta, group_envs=4, recv_batch=3, step_s=0.004, seed=seed, updates=8,
      learner_s=0.02 if slow_learner else 0.0)
  assert len(taken) == 8
  _check_staleness(taken, seen, eta)
  assert trainer.recorder.force_started == scheduler.queue.forced
  assert trainer.recorder.stale_dropped == sum(int(m["stale_dropped"]) for m in seen)


@pytest.mark.parametrize("eta", [1, 2])
def test_a_slow_learner_parks_envs_without_forcing_any(tmp_path, eta):
  """While the learner is the bottleneck, envs wait for room; the breaker stays off, nothing is dropped."""
  scheduler, trainer, taken, seen = _ebrl_with_fake_envs(
      tmp_path, eta=eta, group_envs=8, recv_batch=4, step_s=0.001, seed=1, updates=6, learner_s=0.05, jitter=0.0)
  _check_staleness(taken, seen, eta)
  assert scheduler.queue.forced == 0 and trainer.recorder.force_started == 0
  assert trainer.recorder.stale_dropped == 0
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["force_started"] == 0 and summary["stale_dropped"] == 0


def test_eta_zero_is_on_policy(tmp_path):
  scheduler, _, taken, seen = _ebrl_with_fake_envs(tmp_path, eta=0, group_envs=4, recv_batch=2, step_s=0.002,
                                                   seed=3, updates=5)
  for version, segments in taken:
    assert all((s.version[s.valid] == version).all() for s in segments if not s.forced)
  _check_staleness(taken, seen, 0)


# -- the queue: admission and earliest-deadline batches --------------------------------


def _segment(start_version: int, forced: bool = False):
  return types.SimpleNamespace(start_version=start_version, forced=forced)


def test_queue_takes_finished_segments_without_waiting_for_a_straggler():
  q = TrajectoryQueue(segments_per_update=2, max_staleness=1)
  granted, v = q.try_start(4)
  assert (granted, v) == (4, 0) and q.capacity() == 0
  q.put("a", 0)
  q.put("b", 0)
  assert q.get_batch(timeout=0) == ["a", "b"]  # c and d still run: the learner does not wait for them.
  q.set_version(1)
  assert q.try_start(3) == (2, 1)
  q.put("e", 1)
  q.put("f", 1)
  # At version 1, c and d (started at 0) reach their deadline: e and f cannot pass them.
  assert q.get_batch(timeout=0) is None
  q.put("c", 0)
  assert q.get_batch(timeout=0) is None
  q.put("d", 0)
  assert q.get_batch(timeout=0) == ["c", "d"]


def test_queue_fills_with_forced_segments_only_when_regular_ones_are_missing():
  q = TrajectoryQueue(segments_per_update=2, max_staleness=0)
  q.try_start(2)
  assert q.force_start(1) == 0 and q.forced == 1
  q.put("x", 0, forced=True)
  q.put("a", 0)
  assert q.get_batch(timeout=0) is None  # b (started at 0) must be in this update (eta = 0).
  q.put("b", 0)
  assert q.get_batch(timeout=0) == ["a", "b"]
  q.set_version(1)
  q.try_start(1)
  q.put("c", 1)
  assert q.get_batch(timeout=0) == ["c", "x"]  # x waited; it is the learner's to mask.


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
  return tiny_config(total, scheduler="ebrl", num_envs=8, ebrl__num_groups=2, ebrl__max_staleness=1)


def _stage_threads():
  return [t for t in threading.enumerate() if t.name in ("sampler", "learner") or t.name.startswith("group")]


def test_ebrl_run_trains_bounds_staleness_and_leaves_no_thread(tmp_path):
  trainer = Trainer(_tiny_ebrl_config(2_000), str(tmp_path), progress=False)
  seen = [report.metrics for report in trainer.run(2_000)]
  summary = trainer.finish()
  assert not _stage_threads()
  assert summary["env_steps"] >= 2_000 and summary["policy_version"] >= 20
  for m in seen:
    assert int(m["staleness_max"]) <= 1
  assert (tmp_path / "trace.json").is_file() and (tmp_path / "plots" / "timeline.png").is_file()


def test_resumed_ebrl_run_keeps_the_staleness_bound_without_dropping(tmp_path):
  """A resumed run counts its earlier updates' segments as started: no burst of too-stale segments."""
  _, first = run_to_end(_tiny_ebrl_config(1_000), tmp_path)
  cfg = _tiny_ebrl_config(2_000)
  cfg.resume = True
  trainer = Trainer(cfg, str(tmp_path), progress=False)
  assert int(trainer.state.version) == first["policy_version"] > 0
  scheduler = make_scheduler("ebrl", trainer.run_context())
  seen = [report.metrics for report in trainer.run(2_000, scheduler)]
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
    trainer.train(10**9)
  assert not _stage_threads()
  trainer.envs.close()


def test_ctrl_c_stops_threads_saves_checkpoint_and_summary(tmp_path):
  """SIGINT mid-run: the run ends within 10 s with a checkpoint and summary.json."""
  summary = interrupt_run(tmp_path / "run", [
      "--config.scheduler=ebrl", "--config.num_envs=8", "--config.rollout_length=8",
      "--config.policy.hidden=(16,16)", "--config.algorithm.num_minibatches=2"])
  assert summary["scheduler"] == "ebrl"


def test_mt10_receiver_error_ends_an_ebrl_run(tmp_path):
  from ebrl.trainer import Trainer
  from launch.configs import default

  cfg = default.get_config()
  cfg.env.name, cfg.scheduler, cfg.num_envs, cfg.rollout_length = "MetaWorld/MT10", "ebrl", 20, 8
  cfg.policy.hidden, cfg.algorithm.epochs, cfg.algorithm.num_minibatches = (16, 16), 1, 2
  cfg.total_env_steps, cfg.checkpoint_every_s = 10**9, 1e9
  trainer = Trainer(cfg, str(tmp_path), progress=False)
  sub = trainer.host_envs[0]._subs[5]  # pylint: disable=protected-access
  recv, failed_at = sub.recv, []

  def flaky():
    # After the first update: a stop waits for a step in progress, and a first compile on a loaded
    # machine (a parallel suite) can take longer than the 10 s this test allows the stop itself.
    if len(failed_at) or (sub.calls > 20 and trainer.recorder.updates_done >= 1):
      failed_at.append(time.time())
      raise ValueError("simulated EnvPool failure")
    sub.calls += 1
    return recv()

  sub.calls, sub.recv = 0, flaky
  with pytest.raises(RuntimeError, match="DrawerClose-v3 failed: ValueError: simulated EnvPool failure"):
    trainer.train()
  assert time.time() - failed_at[0] < 10  # The run ended with the receiver's error within 10 s.
  close_start = time.time()
  trainer.envs.close()
  assert time.time() - close_start < 2.0


@pytest.mark.parametrize("env_name,eta", [("CartpoleBalance-v1", 0), ("CartpoleBalance-v1", 1), ("MetaWorld/MT10", 1)])
def test_fully_batched_layout_steps_every_env_together_within_the_bound(tmp_path, env_name, eta):
  """recv_batch = envs per group: sync-mode pools take one send per recv, so envs parked by the
  staleness bound (half of them here: an update takes half the envs' segments) go out with the
  next reply. Every recv returns each env in flight once, the run reaches its budget, and no
  regular sample is older than eta."""
  cfg = _tiny_ebrl_config(10**9)
  multitask = env_name == "MetaWorld/MT10"
  cfg.env.name, cfg.num_envs, cfg.rollout_length = env_name, 20 if multitask else 8, 4
  if multitask:  # Episodes of 5 steps: every task finishes a few, for its success rate.
    cfg.env.max_episode_steps = 5
  cfg.ebrl.num_groups, cfg.ebrl.recv_batch, cfg.ebrl.max_staleness = 1, cfg.num_envs, eta
  cfg.ebrl.segments_per_update = cfg.num_envs // 2
  cfg.total_env_steps = 8 * cfg.ebrl.segments_per_update * cfg.rollout_length
  trainer = Trainer(cfg, str(tmp_path), progress=False)
  adapter = trainer.host_envs[0]
  assert not adapter.is_async  # Sync-mode pools: the fully batched layout.
  recv, received = adapter.recv, []

  def recording_recv():
    b = recv()
    received.append(b.env_ids.copy())
    return b

  adapter.recv = recording_recv
  scheduler = make_scheduler("ebrl", trainer.run_context())
  assert scheduler.inline  # One lockstep group generates on its own thread.
  taken, seen, threads = _record_batches(scheduler.queue), [], set()
  for report in trainer.run(scheduler=scheduler):
    seen.append(dict(report.metrics))
    threads.update(th.name for th in _stage_threads())
  summary = trainer.finish()
  assert not _stage_threads() and threads == {"group0", "learner"}  # No sampler thread.
  assert summary["env_steps"] >= cfg.total_env_steps and len(taken) >= 8
  ids = np.concatenate(received)
  assert len(received) > 8 and ids.min() >= 0 and ids.max() < cfg.num_envs
  # Between two sends no env is received twice (a second send before a recv would mix rows up).
  assert all(len(np.unique(r)) == len(r) for r in received)
  _check_staleness(taken, seen, eta)
  assert scheduler.queue.forced == 0
  if multitask:
    _check_success_by_task(trainer, summary)


def _check_success_by_task(trainer, summary: dict) -> None:
  """A multi-task run's success per task: every task's, in metrics.jsonl, summary.json and a bar chart."""
  tasks = list(trainer.host_envs[0].tasks)
  np.testing.assert_array_equal(trainer.tracker._env_task, trainer.host_envs[0].task_ids)  # pylint: disable=protected-access
  rows = read_jsonl(os.path.join(trainer.workdir, "metrics.jsonl"))
  assert rows and all(list(r["success_rate_by_task"]) == tasks for r in rows)
  with open(os.path.join(trainer.workdir, "summary.json")) as f:
    written = json.load(f)
  final, best = written["success_rate_by_task"], written["best_success_rate_by_task"]
  assert final == summary["success_rate_by_task"] == rows[-1]["success_rate_by_task"]
  assert list(final) == list(best) == tasks
  for t in tasks:  # A task's window, once it has an episode, never empties.
    assert (final[t] is None) == (best[t] is None)
    assert final[t] is None or 0.0 <= final[t] <= best[t] <= 1.0
  # Every finished episode went to its env's task (no window has filled yet).
  by_task = trainer.tracker.state_dict()["recent_by_task"]
  assert sum(len(w) for w in by_task.values()) == trainer.tracker.episodes == written["episodes"] > 0
  assert os.path.getsize(os.path.join(trainer.workdir, "plots", "success_by_task.png")) > 1000
