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


def test_the_childs_environment_carries_its_sm_share_and_cores(monkeypatch):
  """What an MPS split sets per stage process reaches the child before its JAX starts, and what it
  removes (an inherited allocator that would ignore the memory cap) is gone there."""
  monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")  # Inherited by the spawned child.
  env = (("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "40"), ("XLA_CLIENT_MEM_FRACTION", "0.45"))
  local, remote = _learners(env=env, unset_env=("XLA_PYTHON_CLIENT_ALLOCATOR",), cores=(0,))
  try:
    remote.update_segments(local.init(jax.random.PRNGKey(0)), _batch(0))
    assert remote.child_env == {**dict(env), "XLA_PYTHON_CLIENT_ALLOCATOR": None}
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


def test_a_respawn_that_fails_removes_the_ring_and_the_state_slot(monkeypatch):
  """No child holds the shared memory while a respawn starts the next one: if that fails, the
  ring and the slot go at once, not at interpreter exit."""
  local, remote = _learners()
  remote.update_segments(local.init(jax.random.PRNGKey(0)), _batch(0))
  assert len(shm.leftover_blocks(os.getpid())) == 2

  def no_start(self):
    raise OSError("cannot start a process")

  monkeypatch.setattr(RemoteLearner, "_start_child", no_start)
  with pytest.raises(OSError, match="cannot start"):
    remote.respawn(cores=(0,))
  assert shm.leftover_blocks(os.getpid()) == []
  with pytest.raises(StageProcessError, match="closed"):
    remote.check_alive()
  remote.close()


def test_sigterm_to_the_learner_process_is_left_to_its_parent():
  """timeout, scancel and preemption signal the whole process group: the child ignores SIGTERM (and
  SIGINT) and keeps serving updates; the parent stops the run after the current update and then
  stops the child itself."""
  local, remote = _learners()
  try:
    state, _ = remote.update_segments(local.init(jax.random.PRNGKey(0)), _batch(0))
    for sig in (signal.SIGTERM, signal.SIGINT):
      os.kill(remote.pid, sig)
    time.sleep(0.5)
    remote.check_alive()
    state, _ = remote.update_segments(state, _batch(1, version=1))
    assert int(state.version) == 2
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

  from ebrl import stages as stages_lib  # pylint: disable=g-import-not-at-top
  from ebrl import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(stages_lib, "LearnerProcessSpec", functools.partial(LearnerProcessSpec, delay_s=(0.0, 0.06)))
  trainer = trainer_lib.Trainer(_run_config(1_500, eta), str(tmp_path), progress=False)
  assert isinstance(trainer.learner, RemoteLearner)
  pid = trainer.learner.pid
  seen = [report.metrics for report in trainer.run(1_500)]
  summary = trainer.finish()
  assert summary["env_steps"] >= 1_500 and summary["policy_version"] == len(seen) >= 15
  assert max(int(m["staleness_max"]) for m in seen) <= eta
  assert summary["force_started"] == 0 and summary["stale_dropped"] == 0
  assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
  assert (tmp_path / "checkpoints" / str(summary["env_steps"])).is_dir()  # The child's state, saved here.


def _open_files_under(path) -> list[str]:
  """Files under `path` this process still has open (a writer or checkpointer not closed)."""
  out = []
  for fd in os.listdir("/proc/self/fd"):
    try:
      target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
      continue
    if target.startswith(str(path)):
      out.append(target)
  return out


def test_a_learner_process_killed_mid_run_ends_the_run_within_10_s_and_releases_everything(tmp_path, monkeypatch):
  """Through the Python API, as a notebook runs it: the error names the dead child, and every
  resource of the run is released (the autouse fixture: no process, no /dev/shm block)."""
  import ebrl  # pylint: disable=g-import-not-at-top
  from ebrl.recorder import RunRecorder  # pylint: disable=g-import-not-at-top
  from ebrl.trainer import Trainer  # pylint: disable=g-import-not-at-top

  killed_at, record, run, trainers = [], RunRecorder.record, Trainer.run, []

  def run_and_keep(self, *args, **kwargs):
    trainers.append(self)
    return run(self, *args, **kwargs)

  def kill_once(self, report):
    record(self, report)
    if not killed_at and int(report.state.version) >= 3:
      os.kill(trainers[0].learner.pid, signal.SIGKILL)
      killed_at.append(time.time())

  monkeypatch.setattr(Trainer, "run", run_and_keep)
  monkeypatch.setattr(RunRecorder, "record", kill_once)
  with pytest.raises(StageProcessError, match=r"learner process \(pid \d+\) was killed by SIGKILL"):
    ebrl.train(_run_config(10**9), str(tmp_path / "run"), progress=False, log=lambda m: None)
  assert time.time() - killed_at[0] < 10
  assert _open_files_under(tmp_path) == []


def test_an_error_in_a_loop_releases_everything_even_when_closing_the_envs_fails(tmp_path, monkeypatch):
  """An exception in the generation loop ends the run with that exception; the learner process,
  its shared memory, the env pools and the run's open files are all released, and an envs.close()
  that raises does not keep the learner process from being stopped (each in its own guard)."""
  import ebrl  # pylint: disable=g-import-not-at-top
  from ebrl.sampler import Sampler  # pylint: disable=g-import-not-at-top
  from sim_adapters.groups import EnvGroups  # pylint: disable=g-import-not-at-top

  calls, act, close, closed = [0], Sampler.act, EnvGroups.close, []

  def failing_act(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] > 40:
      raise RuntimeError("injected fault in generation")
    return act(self, *args, **kwargs)

  def failing_close(self):
    close(self)
    closed.append(self)
    raise OSError("pool close failed")

  monkeypatch.setattr(Sampler, "act", failing_act)
  monkeypatch.setattr(EnvGroups, "close", failing_close)
  with pytest.raises(RuntimeError, match="injected fault in generation"):
    ebrl.train(_run_config(10**9), str(tmp_path / "run"), progress=False, log=lambda m: None)
  assert len(closed) == 1
  assert _open_files_under(tmp_path) == []


def test_a_bench_entry_that_ends_before_its_warm_up_releases_its_learner_process(tmp_path, monkeypatch):
  from ebrl import benchmark, driver  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(driver.Budget, "spent", lambda self, learns, updates_done, env_steps: updates_done >= 2)
  with pytest.raises(RuntimeError, match="ended before its warm-up finished"):
    benchmark.run_one("ebrl@processes", _run_config(10**9), str(tmp_path / "bench"), warmup_updates=50, seconds=1.0)
  assert _open_files_under(tmp_path) == []


def test_a_dev_shm_too_small_for_the_learner_process_is_one_line_before_anything_is_kept(tmp_path, monkeypatch):
  """placement=processes where /dev/shm cannot hold the ring and the state slot: the one-line error
  comes while the run is built, before the child or a compile; nothing is left, no config.json is
  written, so the same workdir takes the retry (here with the space back)."""
  import ebrl  # pylint: disable=g-import-not-at-top
  from ebrl.learner import Learner  # pylint: disable=g-import-not-at-top

  workdir, real_free = tmp_path / "run", shm.free_bytes
  monkeypatch.setattr(shm, "free_bytes", lambda path=shm.SHM_DIR: 4096)
  inits, init = [], Learner.init  # Concrete inits (compiled and run); shapes taken by tracing do not count.

  def spied_init(self, key):
    if not isinstance(key, jax.core.Tracer):
      inits.append(key)
    return init(self, key)

  monkeypatch.setattr(Learner, "init", spied_init)
  with pytest.raises(ebrl.UserError) as e:
    ebrl.train(_run_config(64), str(workdir), progress=False, log=lambda m: None)
  message = str(e.value)
  assert message.startswith("the learner process (placement=processes) needs ") and "\n" not in message
  assert "which has 0.0 MiB free" in message and "--shm-size" in message and "placement=threads" in message
  assert inits == [] and not (workdir / "config.json").exists()
  assert _open_files_under(tmp_path) == []
  monkeypatch.setattr(shm, "free_bytes", real_free)
  summary = ebrl.train(_run_config(64), str(workdir), progress=False, log=lambda m: None)
  assert summary["env_steps"] >= 64


def _spawned(run: str | None = None) -> set[int]:
  """Pids of live processes started by multiprocessing's spawn: anyone's, or those of the run in
  directory `run` (tests/interrupt.py tags its environment; other tests run in parallel)."""
  from interrupt import RUN_TAG  # pylint: disable=g-import-not-at-top

  tag = None if run is None else f"{RUN_TAG}={run}".encode()
  out = set()
  for pid in os.listdir("/proc"):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if b"multiprocessing.spawn" not in f.read():
          continue
      if tag is not None:
        with open(f"/proc/{pid}/environ", "rb") as f:
          if tag not in f.read().split(b"\0"):
            continue
      out.add(int(pid))
    except (OSError, ValueError):
      continue
  return out


PROCESS_RUN = ["--config.scheduler=ebrl", "--config.placement=processes", "--config.num_envs=8",
               "--config.rollout_length=8", "--config.policy.hidden=(16,16)", "--config.algorithm.num_minibatches=2"]


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM])  # One signal by default.
def test_a_signal_to_the_process_group_stops_a_learner_process_run_cleanly_and_it_resumes(tmp_path, sig):
  """Ctrl-C in a terminal, `timeout`, SLURM's scancel and preemption signal the whole group, the
  learner process included: the run still stops after its update with a checkpoint and
  summary.json, removes its shared memory itself (no "leaked" warning from the resource tracker),
  leaves no process, and a resume continues from that checkpoint."""
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  from interrupt import ROOT, interrupt_run  # pylint: disable=g-import-not-at-top

  run = str(tmp_path / "run")
  before, out, blocks_before = _spawned(run), [], set(shm.leftover_blocks())
  # Each update takes the child 0.3 s longer: the signal finds one in flight, as it would a real run.
  slow = ("import functools\nfrom ebrl import learner_process, stages\nstages.LearnerProcessSpec = "
          "functools.partial(learner_process.LearnerProcessSpec, delay_s=(0.3, 0.3))")
  summary = interrupt_run(tmp_path / "run", PROCESS_RUN, sig=sig, output=out, preamble=slow)
  assert summary["policy_version"] > 0
  assert "killed by" not in out[0] and "Traceback" not in out[0], out[0]
  deadline = time.time() + 10
  while _spawned(run) - before and time.time() < deadline:
    time.sleep(0.1)
  assert _spawned(run) - before == set()
  # Blocks of live owners are other tests' (the suite runs in parallel); every process of this run has exited.
  assert shm.orphaned(set(shm.leftover_blocks()) - blocks_before) == set(), "a shared-memory block outlived its run"
  if sig == signal.SIGINT:
    return
  steps = summary["env_steps"]
  resumed = subprocess.run([sys.executable, "-m", "launch.train", "--progress=false", f"--workdir={tmp_path / 'run'}",
                            *PROCESS_RUN, "--config.resume=True", f"--config.total_env_steps={steps + 256}"],
                           cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                           timeout=300)
  assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
  assert f"resumed from {tmp_path / 'run' / 'checkpoints' / str(steps)} at {steps} env steps" in resumed.stdout
  after = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert after["env_steps"] >= steps + 256 and after["policy_version"] > summary["policy_version"]


def test_under_mps_the_trainer_gives_the_learner_process_its_sm_share(tmp_path, monkeypatch):
  """With MPS running (faked: no GPU here), the learner process of a run starts with the config's
  SM share and memory cap in its environment; this process keeps every SM."""
  from ebrl.resources import gpu_sharing  # pylint: disable=g-import-not-at-top
  from ebrl.trainer import Trainer  # pylint: disable=g-import-not-at-top

  daemon = type("Daemon", (), {"pipe_dir": str(tmp_path / "mps-pipe"), "stop": lambda self: None})()
  monkeypatch.setattr(gpu_sharing, "_current", gpu_sharing.GpuSharing("mps", "[placement] MPS (test)", daemon))
  monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")  # Would make the child ignore its cap.
  cfg = _run_config(10**9)
  cfg.quotas.learner_sm_percent = 30
  trainer = Trainer(cfg, str(tmp_path / "run"), progress=False)
  try:
    remote = trainer.learner
    remote.update_segments(trainer.state, _run_batch(trainer))
    assert remote.child_env == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
                                "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps-pipe"),
                                "XLA_CLIENT_MEM_FRACTION": str(gpu_sharing.LEARNER_MEM_FRACTION),
                                "XLA_PYTHON_CLIENT_PREALLOCATE": "true",
                                "XLA_PYTHON_CLIENT_ALLOCATOR": None}  # Inherited, and dropped there.
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
  cfg.resources = "naive"  # A plan and its learner process placement, without a calibration.
  trainer = Trainer(cfg, str(tmp_path / "run"), progress=False)
  try:
    remote = trainer.learner
    state, _ = remote.update_segments(trainer.state, _run_batch(trainer))
    first = remote.pid
    plan, placement = trainer.resources.plan, trainer.resources.learner_process
    assert placement.follow(plan) == []  # Same plan: the same process.
    assert remote.pid == first
    marks = placement.follow(plan.replace(learner_sm_percent=65))
    assert remote.pid != first
    state, _ = remote.update_segments(state, _run_batch(trainer))
    assert int(state.version) == 2
    assert remote.child_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "65"
    assert [m.label for m in marks] == ["learner 65% SMs"]
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


def test_a_real_small_dev_shm_one_line_for_processes_and_auto_keeps_the_learner_here(tmp_path):
  """For real: a 1 MiB tmpfs on /dev/shm in a private mount namespace (Docker's default is 64 MB),
  too small for this policy's state slot. placement=processes stops with the one line (exit 2, no
  "Bus error"); resources=auto's calibration does not start a learner process it cannot give the
  space to, says so, and the run trains with the learner in its process."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  from interrupt import ROOT  # pylint: disable=g-import-not-at-top
  from test_transport import _private_small_shm  # pylint: disable=g-import-not-at-top

  prefix = _private_small_shm("1m")
  if prefix is None:
    pytest.skip("no private mount namespace here (needs root and unshare); the faked statvfs tests cover the check")
  run = [sys.executable, "-m", "launch.train", "--progress=false", "--config.scheduler=ebrl", "--config.num_envs=8",
         "--config.rollout_length=8", "--config.policy.hidden=(256,256)", "--config.algorithm.num_minibatches=2",
         "--config.total_env_steps=128"]
  env = {**os.environ, "PYTHONPATH": ROOT, "EBRL_PROFILE_CACHE": str(tmp_path / "profiles")}
  refused = subprocess.run([*prefix, *run, f"--workdir={tmp_path / 'a'}", "--config.placement=processes"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert refused.returncode == 2, refused.stderr[-2000:]
  line = refused.stderr.strip().splitlines()[-1]
  assert line.startswith("error: the learner process (placement=processes) needs "), refused.stderr[-2000:]
  assert "of shared memory in /dev/shm, which has" in line and "--shm-size" in line
  auto = subprocess.run([*prefix, *run, f"--workdir={tmp_path / 'b'}", "--config.resources=auto"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert auto.returncode == 0, auto.stdout[-2000:] + auto.stderr[-2000:]
  assert "[profile] placement: not measured: a learner process needs" in auto.stdout + auto.stderr
  assert (tmp_path / "b" / "summary.json").is_file()
