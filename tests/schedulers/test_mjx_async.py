"""scheduler=ebrl on a device sim: the run trains within the staleness bound and
stops cleanly; eta = 0 is sync PPO on the same device-collected data; a failing
thread is the run's error."""

from __future__ import annotations

import dataclasses
import json
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from interrupt import interrupt_run
from ebrl.learner import Learner
from ebrl.scheduler import make_scheduler
from ebrl.param_store import with_value_stats
from ebrl.scheduler.device_sync import make_collect
from ebrl.scheduler.device_async import DeviceAsyncScheduler, make_segment_collect
from ebrl.trainer import Trainer
from launch.configs import default

T, N = 8, 8


def _cfg(total: int, eta: int, **ebrl):
  cfg = default.get_config()
  cfg.env.name = "mjx:CartpoleBalance"
  cfg.env.max_episode_steps = 5  # Episodes (all truncated) end inside segments.
  cfg.scheduler = "ebrl"
  cfg.num_envs, cfg.rollout_length, cfg.total_env_steps = N, T, total
  cfg.policy.hidden = (16, 16)
  cfg.algorithm.epochs = 1
  cfg.algorithm.num_minibatches = 2
  cfg.ebrl.num_groups = 2
  cfg.ebrl.max_staleness = eta
  for k, v in ebrl.items():
    cfg.ebrl[k] = v
  cfg.log_every_s = 0.0
  cfg.checkpoint_every_s = 1e9
  return cfg


def _stage_threads():
  return [t for t in threading.enumerate() if t.name == "learner" or t.name.startswith("group")]


def _run(cfg, workdir):
  trainer = Trainer(cfg, str(workdir), progress=False)
  seen = []
  # pylint: disable-next=protected-access
  seen.extend(jax.device_get(report.metrics) for report in trainer.run())
  return trainer, trainer.finish(), seen


@pytest.mark.parametrize("eta", [pytest.param(0, marks=pytest.mark.slow), 2])  # eta=0 on host: test_async_pipeline.py.
def test_ebrl_device_run_trains_within_the_staleness_bound(eta, tmp_path):
  trainer, summary, seen = _run(_cfg(1_024, eta), tmp_path)
  assert isinstance(make_scheduler("ebrl", trainer.run_context()), DeviceAsyncScheduler)
  assert not _stage_threads()
  assert summary["env_steps"] >= 1_024 and summary["policy_version"] >= 12  # 1024 / (8 envs * 8 steps) = 16
  assert len(seen) == summary["policy_version"]
  for m in seen:  # Batches reach the learner in start order: the bound holds and nothing is masked.
    assert int(m["staleness_max"]) <= eta and int(m["stale_dropped"]) == 0
  # The groups fill the capacity while the first update compiles, so the lag reaches eta: overlap happened.
  assert max(int(m["staleness_max"]) for m in seen) == eta
  assert summary["episodes"] >= 8 and 0 < summary["final_episode_return"] <= 5.0
  trace = json.loads((tmp_path / "trace.json").read_text())
  lanes = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
  assert {"group0", "group1", "learner"} <= lanes
  assert (tmp_path / "plots" / "timeline.png").is_file() and (tmp_path / "checkpoints").is_dir()


def test_resources_auto_probes_overlap_on_device_groups_and_a_barrier_holds(tmp_path):
  """resources=auto on a device simulator: the device groups' queue follows the probe's windows
  (admission 0, 2, 0), the probe reports both rates on the timeline and in the metrics, every
  sample stays within eta, and once a barrier has held for a few updates every update trains
  on its own params' data (lag 0: no group collected while an update ran)."""
  cfg = _cfg(10**9, 2)
  cfg.resources, cfg.quotas.overlap_probe_s = "auto", 0.3
  trainer = Trainer(cfg, str(tmp_path), progress=False)
  assert trainer.resources is None and trainer.overlap is not None  # Nothing to place, only the probe.
  scheduler = make_scheduler("ebrl", trainer.run_context())
  admissions, per_update = [], []
  apply = scheduler.apply
  scheduler.apply = lambda knobs: (admissions.append(knobs.admission) if knobs.admission is not None else None,
                                   apply(knobs))
  for report in trainer.run(scheduler=scheduler):
    per_update.append((scheduler.queue.admission, int(report.metrics["staleness_max"])))
    if trainer.overlap.results:
      break
  trainer.finish()
  result = trainer.overlap.results[0]
  assert admissions[:4] == [2, 0, 2, 0]  # The first: the initial knob.
  assert result.overlapped_env_steps_per_s > 0 and result.barrier_env_steps_per_s > 0
  assert scheduler.queue.admission == result.admission
  assert max(lag for _, lag in per_update) <= 2
  # Batches started before the switch drain within eta + 1 updates; after them, a barrier's.
  settled = [lag for i, (_, lag) in enumerate(per_update)
             if i >= 4 and all(a == 0 for a, _ in per_update[i - 4:i])]
  assert settled and max(settled) == 0
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert rows[-1]["overlap_admission"] == result.admission
  trace = json.loads((tmp_path / "trace.json").read_text())
  probes = [e for e in trace["traceEvents"] if e.get("name") == "overlap_probe"]
  assert probes and probes[0]["args"]["admission"] == result.admission


@pytest.mark.slow  # A resumed ebrl run on host envs keeps it in test_async_pipeline.py.
def test_resumed_run_keeps_the_bound(tmp_path):
  """Capacity counts from the resumed version, not from 0: no burst of stale batches."""
  _run(_cfg(256, 1), tmp_path)
  cfg = _cfg(768, 1)
  cfg.resume = True
  _, summary, seen = _run(cfg, tmp_path)
  assert summary["env_steps"] >= 768 and seen
  for m in seen:
    assert int(m["staleness_max"]) <= 1 and int(m["stale_dropped"]) == 0


@pytest.mark.parametrize("correction,lam", [
    pytest.param("decoupled_ppo", 0.95, marks=pytest.mark.slow),  # Host data: test_async_pipeline.py, both.
    ("vtrace", 1.0)])
def test_eta_zero_update_equals_sync_ppo_on_device_data(correction, lam, tmp_path):
  """One collect of the segment scan and of the sync device scan from the same state and key
  gives the same data; update_segments on it equals the sync update (V-trace at lambda = 1)."""
  trainer = Trainer(_cfg(64, 0, num_groups=1), str(tmp_path), progress=False)
  sim, policy, lc = trainer.device_sim, trainer.policy, trainer.learner.cfg
  lc = dataclasses.replace(lc, gae_lambda=lam)
  sync_collect = make_collect(sim, policy, T, lc.gamma)
  seg_collect = make_segment_collect(sim, policy, T, lc.gamma)
  state = trainer.state
  copy = lambda tree: jax.tree.map(jnp.copy, tree)
  sim_state = sim.reset(jax.random.PRNGKey(3))
  key = jax.random.PRNGKey(4)
  after, rollout, _ = sync_collect(with_value_stats(state), copy(sim_state), key, jnp.int32(0))
  _, batch, _ = seg_collect(with_value_stats(state), copy(sim_state), key, jnp.int32(0))
  assert bool(rollout.done.any())  # Truncations inside the segment: the value fold is exercised.
  np.testing.assert_array_equal(batch.obs["state"][:T], rollout.obs["state"])
  np.testing.assert_array_equal(batch.obs["state"][T], after.obs["state"])  # The bootstrap row.
  for name in ("actions", "logp", "rewards", "bootstrap", "terminated", "done", "valid", "version"):
    np.testing.assert_array_equal(getattr(batch, name), getattr(rollout, name), err_msg=name)

  sync_state, _ = Learner(policy, lc).update(copy(state), rollout)
  async_state, metrics = Learner(policy, dataclasses.replace(lc, correction=correction)).update_segments(
      copy(state), batch)
  for a, b in zip(jax.tree.leaves(sync_state.params), jax.tree.leaves(async_state.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  assert int(metrics["stale_dropped"]) == 0 and int(metrics["staleness_max"]) == 0
  trainer.finish()


@pytest.mark.parametrize("stage", ["collect", "learner"])
def test_thread_exception_is_the_runs_error(stage, tmp_path):
  trainer = Trainer(_cfg(10**9, 1), str(tmp_path), progress=False)
  scheduler = make_scheduler("ebrl", trainer.run_context())

  def broken(*_):
    raise FloatingPointError(f"{stage} exploded")

  if stage == "collect":
    scheduler.collect = broken
  else:
    trainer.learner.update_segments = broken
  with pytest.raises(FloatingPointError, match=f"{stage} exploded"):
    trainer.train(10**9, scheduler)
  assert not _stage_threads()
  trainer.envs.close()


def test_segments_per_update_must_take_whole_groups(tmp_path):
  from ebrl.errors import UserError  # pylint: disable=g-import-not-at-top

  with pytest.raises(UserError, match="multiple of the 4 envs per group"):
    Trainer(_cfg(64, 1, segments_per_update=2), str(tmp_path), progress=False)


@pytest.mark.slow  # The stop is LoopThreads', as on host envs (tests/schedulers/test_async_pipeline.py, tests/end_to_end/test_interrupts.py).
def test_ctrl_c_stops_threads_saves_checkpoint_and_summary(tmp_path):
  """SIGINT mid-run: every thread stops within 10 s, then the checkpoint and summary.json are written."""
  summary = interrupt_run(tmp_path / "run", [
      "--config.env.name=mjx:CartpoleBalance", "--config.scheduler=ebrl", f"--config.num_envs={N}",
      f"--config.rollout_length={T}", "--config.policy.hidden=(16,16)", "--config.algorithm.num_minibatches=2"])
  assert summary["scheduler"] == "ebrl"
