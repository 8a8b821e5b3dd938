"""The learner in a spawned process: the same update as in this process on the same segments,
a state handed over when the caller switches states, a killed or failing child that surfaces
at once, its environment (an MPS share) applied, and no process or shared memory left."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from ebrl.learner import Learner, LearnerConfig
from ebrl.learner_process import LearnerProcessSpec, RemoteLearner, StageProcessError
from ebrl.transport import shm
from ebrl.types import SegmentBatch
from policies import make_policy
from sim_adapters.base import EnvSpec, ObsSpec

T, B = 6, 4
SPEC = EnvSpec("toy", {"state": ObsSpec((3,), np.dtype(np.float32))}, 2, -np.ones(2, np.float32),
               np.ones(2, np.float32), 10, False)
POLICY_CFG = ml_collections.ConfigDict(dict(hidden=(16,), init_log_std=-0.5))
LEARNER_CFG = LearnerConfig(epochs=2, num_minibatches=2, max_staleness=2)


def _batch(seed: int, version: int = 0) -> SegmentBatch:
  rng = np.random.default_rng(seed)
  done = rng.random((T, B)) < 0.2
  return SegmentBatch(obs={"state": rng.normal(size=(T + 1, B, 3)).astype(np.float32)},
                      actions=rng.uniform(-1, 1, (T, B, 2)).astype(np.float32),
                      logp=rng.normal(-2, 0.3, (T, B)).astype(np.float32),
                      rewards=rng.normal(size=(T, B)).astype(np.float32),
                      terminated=done & (rng.random((T, B)) < 0.5), done=done, valid=rng.random((T, B)) < 0.9,
                      version=np.full((T, B), version, np.int32))


def _learners(**spec_changes):
  policy = make_policy("mlp", SPEC, POLICY_CFG)
  local = Learner(policy, LEARNER_CFG)
  spec = LearnerProcessSpec(policy_name="mlp", policy_cfg=POLICY_CFG, env_spec=SPEC, learner_cfg=LEARNER_CFG,
                            rollout_length=T, segments_per_update=B, action_size=2, **spec_changes)
  return local, RemoteLearner(Learner(policy, LEARNER_CFG), spec)


def _children() -> list[int]:
  """Pids of this process's live children (zombies excluded)."""
  out = []
  for pid in os.listdir("/proc"):
    if not pid.isdigit():
      continue
    try:
      with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if int(fields[1]) != os.getpid() or fields[0] == "Z":
      continue
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if b"resource_tracker" in f.read():  # multiprocessing's own, one per parent for its lifetime.
          continue
    except OSError:
      continue
    out.append(int(pid))
  return out


@pytest.fixture(autouse=True)
def nothing_left_behind():
  before = set(_children())
  yield
  deadline = time.time() + 10
  while set(_children()) - before and time.time() < deadline:
    time.sleep(0.1)
  assert set(_children()) - before == set(), "a learner process outlived its test"
  assert shm.leftover_blocks(os.getpid()) == []


def _assert_same_state(a, b) -> None:
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_processes_and_threads_give_the_same_updates_on_the_same_segments():
  local, remote = _learners()
  try:
    state = local.init(jax.random.PRNGKey(3))
    copy = lambda s: jax.tree.map(jnp.copy, s)
    here, there = copy(state), copy(state)
    for i in range(3):  # Off-policy segments: behaviour versions behind the learner's.
      batch = _batch(i, version=max(0, i - 1))
      here, m_here = local.update_segments(here, batch)
      there, m_there = remote.update_segments(there, batch)
      _assert_same_state(here, there)
      assert int(there.version) == i + 1
      for k in ("loss", "staleness_max", "stale_dropped"):
        np.testing.assert_allclose(np.asarray(m_here[k]), m_there[k], rtol=1e-6, atol=1e-7)
    assert isinstance(jax.tree.leaves(there)[0], jax.Array)
    # The bench counts the child's CPU (its updates run there, not in this process).
    from ebrl.benchmark import _cpu_seconds  # pylint: disable=g-import-not-at-top
    assert _cpu_seconds(remote.pid) > 0.05
    # The caller switches to another state (a resume): the child starts from that one.
    other = copy(state)
    here, _ = local.update_segments(copy(state), _batch(9))
    there, _ = remote.update_segments(other, _batch(9))
    _assert_same_state(here, there)
  finally:
    remote.close()


def test_a_killed_learner_process_surfaces_within_a_second_naming_it():
  local, remote = _learners()
  try:
    state, _ = remote.update_segments(local.init(jax.random.PRNGKey(0)), _batch(0))
    os.kill(remote.pid, signal.SIGKILL)
    t0 = time.time()
    with pytest.raises(StageProcessError, match=rf"learner process \(pid {remote.pid}\) was killed by SIGKILL"):
      while time.time() - t0 < 10:
        remote.check_alive()
        time.sleep(0.02)
    assert time.time() - t0 < 1.0
    with pytest.raises(StageProcessError, match="killed by SIGKILL"):
      remote.update_segments(state, _batch(1))
  finally:
    remote.close()


def test_a_learner_process_killed_mid_update_ends_the_wait():
  local, remote = _learners(delay_s=(3.0, 3.0))
  try:
    import threading  # pylint: disable=g-import-not-at-top
    threading.Timer(1.0, os.kill, (remote.pid, signal.SIGKILL)).start()
    t0 = time.time()
    with pytest.raises(StageProcessError, match="killed by SIGKILL"):
      remote.update_segments(local.init(jax.random.PRNGKey(0)), _batch(0))
    assert time.time() - t0 < 2.5
  finally:
    remote.close()


def test_an_error_in_the_child_is_reported_with_its_message():
  bad = dataclasses.replace(LEARNER_CFG, algorithm="grpo", group_size=2)  # update_segments rejects grpo.
  policy = make_policy("mlp", SPEC, POLICY_CFG)
  spec = LearnerProcessSpec(policy_name="mlp", policy_cfg=POLICY_CFG, env_spec=SPEC, learner_cfg=bad,
                            rollout_length=T, segments_per_update=B, action_size=2)
  remote = RemoteLearner(Learner(policy, LEARNER_CFG), spec)
  try:
    with pytest.raises(StageProcessError, match=r"failed: ValueError: grpo compares the envs"):
      remote.update_segments(remote.init(jax.random.PRNGKey(0)), _batch(0))
  finally:
    remote.close()


def test_the_childs_environment_carries_its_sm_share_and_cores():
  """What an MPS split sets per stage process reaches the child before its JAX starts."""
  env = (("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "40"), ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45"))
  local, remote = _learners(env=env, cores=(0,))
  try:
    remote.update_segments(local.init(jax.random.PRNGKey(0)), _batch(0))
    assert remote.child_env == dict(env)
    with open(f"/proc/{remote.pid}/status") as f:
      allowed = next(l.split(":")[1].strip() for l in f if l.startswith("Cpus_allowed_list"))
    assert allowed == "0"
  finally:
    remote.close()


def test_an_idle_learner_process_runs_every_thread_under_sched_idle():
  """priority=idle: the child and every thread it starts (XLA's pools) only get the cycles the
  rollout leaves; normal leaves the scheduler's default."""
  local, remote = _learners(priority="idle")
  _, plain = _learners()
  try:
    state = local.init(jax.random.PRNGKey(0))
    remote.update_segments(state, _batch(0))
    plain.update_segments(state, _batch(0))
    tids = os.listdir(f"/proc/{remote.pid}/task")
    assert len(tids) > 1  # XLA's threads exist by now.
    assert {os.sched_getscheduler(int(t)) for t in tids} == {os.SCHED_IDLE}
    assert os.sched_getscheduler(plain.pid) == os.SCHED_OTHER
  finally:
    remote.close()
    plain.close()


def test_resolve_priority_is_idle_on_cpu_and_normal_on_an_accelerator():
  from ebrl.learner_process import resolve_priority  # pylint: disable=g-import-not-at-top

  assert resolve_priority("auto", "cpu") == "idle"
  assert resolve_priority("auto", "gpu") == "normal"
  assert resolve_priority("normal", "cpu") == "normal" and resolve_priority("idle", "gpu") == "idle"


def test_a_respawned_learner_process_has_its_new_share_and_trains_on_from_the_same_state():
  """A new SM share needs a new process: the child is replaced between updates and the next update
  hands it the state, so the updates are those of a learner that never restarted."""
  share = lambda p: (("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(p)),)
  local, remote = _learners(env=share(40))
  try:
    here = local.init(jax.random.PRNGKey(5))
    there = jax.tree.map(jnp.copy, here)
    here, _ = local.update_segments(here, _batch(0))
    there, _ = remote.update_segments(there, _batch(0))
    first = remote.pid
    remote.respawn(env=share(70), cores=(0,))
    assert remote.pid != first and not os.path.exists(f"/proc/{first}/cmdline") or \
        open(f"/proc/{first}/stat").read().split()[2] == "Z"
    for i in (1, 2):
      here, _ = local.update_segments(here, _batch(i, version=i - 1))
      there, _ = remote.update_segments(there, _batch(i, version=i - 1))
      _assert_same_state(here, there)
    assert int(there.version) == 3
    assert remote.child_env == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "70"}
    with open(f"/proc/{remote.pid}/status") as f:
      assert next(l.split(":")[1].strip() for l in f if l.startswith("Cpus_allowed_list")) == "0"
    assert len(shm.leftover_blocks(os.getpid())) == 2  # The same ring and state slot, no new blocks.
  finally:
    remote.close()


def test_close_stops_the_child_and_removes_its_shared_memory():
  _, remote = _learners()
  pid = remote.pid
  assert len(shm.leftover_blocks(os.getpid())) == 2  # The state slot and the segment ring.
  remote.close()
  remote.close()  # Twice is harmless.
  assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
  with pytest.raises(StageProcessError, match="closed"):
    remote.check_alive()


# -- whole runs with placement=processes ----------------------------------------------------------


def _run_config(total: int, eta: int = 1):
  from launch.configs import default  # pylint: disable=g-import-not-at-top

  cfg = default.get_config()
  cfg.scheduler, cfg.placement = "ebrl", "processes"
  cfg.num_envs, cfg.rollout_length, cfg.total_env_steps = 8, 8, total
  cfg.policy.hidden, cfg.algorithm.epochs, cfg.algorithm.num_minibatches = (16, 16), 1, 2
  cfg.ebrl.num_groups, cfg.ebrl.max_staleness, cfg.checkpoint_every_s = 2, eta, 1e9
  return cfg


@pytest.mark.parametrize("eta", [0, 2])
def test_a_run_with_a_learner_process_keeps_the_staleness_bound_under_random_delays(tmp_path, monkeypatch, eta):
  """The child sleeps a random 0-60 ms before each update (as a loaded or preempted learner does):
  every sample an update takes is at most eta versions old, and the run ends with nothing left."""
  import functools  # pylint: disable=g-import-not-at-top

  from ebrl import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  from ebrl.scheduler import make_scheduler  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(trainer_lib, "LearnerProcessSpec", functools.partial(LearnerProcessSpec, delay_s=(0.0, 0.06)))
  trainer = trainer_lib.Trainer(_run_config(1_500, eta), str(tmp_path), progress=False)
  assert isinstance(trainer.learner, RemoteLearner)
  pid, seen = trainer.learner.pid, []
  trainer.update_hooks.append(lambda t: seen.append(t._last_metrics))  # pylint: disable=protected-access
  make_scheduler("ebrl", trainer.run_context()).run(trainer.state, 1_500)
  summary = trainer.finish()
  assert summary["env_steps"] >= 1_500 and summary["policy_version"] == len(seen) >= 15
  assert max(int(m["staleness_max"]) for m in seen) <= eta
  assert summary["force_started"] == 0 and summary["stale_dropped"] == 0
  assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
  assert (tmp_path / "checkpoints" / str(summary["env_steps"])).is_dir()  # The child's state, saved here.


def test_a_learner_process_killed_mid_run_ends_the_run_within_10_s(tmp_path):
  from ebrl.scheduler import make_scheduler  # pylint: disable=g-import-not-at-top
  from ebrl.trainer import Trainer  # pylint: disable=g-import-not-at-top

  trainer = Trainer(_run_config(10**9), str(tmp_path), progress=False)
  killed_at = []

  def kill_once(t):
    if not killed_at and int(t.state.version) >= 3:
      os.kill(t.learner.pid, signal.SIGKILL)
      killed_at.append(time.time())

  trainer.update_hooks.append(kill_once)
  with pytest.raises(StageProcessError, match=r"learner process \(pid \d+\) was killed by SIGKILL"):
    make_scheduler("ebrl", trainer.run_context()).run(trainer.state, 10**9)
  assert time.time() - killed_at[0] < 10
  trainer.abort()


def _spawned() -> set[int]:
  """Pids of live processes started by multiprocessing's spawn (anyone's)."""
  out = set()
  for pid in os.listdir("/proc"):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if b"multiprocessing.spawn" in f.read():
          out.add(int(pid))
    except (OSError, ValueError):
      continue
  return out


def test_ctrl_c_with_a_learner_process_leaves_no_process_and_no_shared_memory(tmp_path):
  from interrupt import interrupt_run  # pylint: disable=g-import-not-at-top

  before = _spawned()
  summary = interrupt_run(tmp_path / "run", [
      "--config.scheduler=ebrl", "--config.placement=processes", "--config.num_envs=8",
      "--config.rollout_length=8", "--config.policy.hidden=(16,16)", "--config.algorithm.num_minibatches=2"])
  assert summary["policy_version"] > 0
  deadline = time.time() + 10
  while _spawned() - before and time.time() < deadline:
    time.sleep(0.1)
  assert _spawned() - before == set()
  assert shm.leftover_blocks() == [], "a shared-memory block outlived its run"


def test_under_mps_the_trainer_gives_the_learner_process_its_sm_share(tmp_path, monkeypatch):
  """With MPS running (faked: no GPU here), the learner process of a run starts with the config's
  SM share and memory cap in its environment; this process keeps every SM."""
  from ebrl.resources import gpu_sharing  # pylint: disable=g-import-not-at-top
  from ebrl.trainer import Trainer  # pylint: disable=g-import-not-at-top

  daemon = type("Daemon", (), {"pipe_dir": str(tmp_path / "mps-pipe"), "stop": lambda self: None})()
  monkeypatch.setattr(gpu_sharing, "_current", gpu_sharing.GpuSharing("mps", "[placement] MPS (test)", daemon))
  cfg = _run_config(10**9)
  cfg.quotas.learner_sm_percent = 30
  trainer = Trainer(cfg, str(tmp_path / "run"), progress=False)
  try:
    remote = trainer.learner
    remote.update_segments(trainer.state, _run_batch(trainer))
    assert remote.child_env == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
                                "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps-pipe"),
                                "XLA_PYTHON_CLIENT_MEM_FRACTION": str(gpu_sharing.LEARNER_MEM_FRACTION),
                                "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in os.environ
  finally:
    trainer.abort()


def test_a_new_plan_share_restarts_the_learner_process_under_mps(tmp_path, monkeypatch):
  """A re-plan whose SM share differs (a demand shift under MPS) restarts the learner process
  with it, and the run's updates go on; a plan with the same share only moves the cores."""
  from ebrl.resources import gpu_sharing  # pylint: disable=g-import-not-at-top
  from ebrl.trainer import Trainer  # pylint: disable=g-import-not-at-top

  daemon = type("Daemon", (), {"pipe_dir": str(tmp_path / "mps-pipe"), "stop": lambda self: None})()
  monkeypatch.setattr(gpu_sharing, "_current", gpu_sharing.GpuSharing("mps", "[placement] MPS (test)", daemon))
  cfg = _run_config(10**9)
  cfg.resources = "naive"  # A plan and its listeners, without a calibration.
  trainer = Trainer(cfg, str(tmp_path / "run"), progress=False)
  try:
    remote = trainer.learner
    state, _ = remote.update_segments(trainer.state, _run_batch(trainer))
    first = remote.pid
    plan = trainer.resources.plan
    for listener in trainer.resources.listeners:
      listener(plan)  # Same plan: the same process.
    assert remote.pid == first
    for listener in trainer.resources.listeners:
      listener(plan.replace(learner_sm_percent=65))
    assert remote.pid != first
    state, _ = remote.update_segments(state, _run_batch(trainer))
    assert int(state.version) == 2
    assert remote.child_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "65"
    assert any(e["label"] == "learner 65% SMs" for e in trainer.resources.events)
  finally:
    trainer.abort()


def _run_batch(trainer) -> SegmentBatch:
  """A batch of the run's own shapes (what its scheduler would hand the learner)."""
  t, b = trainer.layout.rollout_length, trainer.layout.segments_per_update
  spec = trainer.spec
  return SegmentBatch(obs={k: np.zeros((t + 1, b) + v.shape, v.dtype) for k, v in spec.obs.items()},
                      actions=np.zeros((t, b, trainer.action_size), np.float32), logp=np.zeros((t, b), np.float32),
                      rewards=np.zeros((t, b), np.float32), terminated=np.zeros((t, b), bool),
                      done=np.zeros((t, b), bool), valid=np.ones((t, b), bool), version=np.zeros((t, b), np.int32))
