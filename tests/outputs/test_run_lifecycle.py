"""A run's life across launches: workdirs, resume, warm start, seeds, schedules and checkpoints.

Each test names the silent failure it guards against: a warm start dropped by
resume=True, a used workdir overwritten, a resume with another config, a
preempted run replaying its first episodes, a learning-rate schedule that ends
early or late, a checkpoint whose directory and metadata disagree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ebrl.checkpointing import Checkpointer
from ebrl.errors import UserError
from ebrl.learner import learning_rate_schedule
from ebrl.recorder import RunRecorder
from ebrl.trainer import Trainer
from tiny_configs import leaves, run_to_end, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny(total: int = 128, scheduler: str = "sync", resume: bool = False):
  return tiny_config(total, scheduler=scheduler, resume=resume)


def run(cfg, workdir) -> Trainer:
  return run_to_end(cfg, workdir)[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """A finished 128-step sync run (4 updates) to resume, copy and warm-start from."""
  workdir = tmp_path_factory.mktemp("finished")
  return workdir, run(tiny(128), workdir)


def copy_of(workdir, tmp_path):
  dst = tmp_path / "copy"
  shutil.copytree(workdir, dst)
  return dst


# -- warm start and resume ----------------------------------------------------------


def test_warm_start_applies_on_a_first_launch_with_resume_true(finished, tmp_path, capsys):
  """The preemptible-job pattern passes resume=True and warm_start=DIR on every launch."""
  source, done = finished
  cfg = tiny(256, resume=True)
  cfg.warm_start = str(source)
  trainer = Trainer(cfg, str(tmp_path / "rl"), progress=False)
  for a, b in zip(leaves(trainer.state.params), leaves(done.state.params)):
    np.testing.assert_array_equal(a, b)
  assert int(trainer.state.version) == 0  # Params only: a fresh run's optimiser and counters.
  trainer.train(128)
  trainer.finish()
  # The next launch restores its own checkpoint; the warm start no longer applies, and says so.
  capsys.readouterr()
  again = Trainer(cfg, str(tmp_path / "rl"), progress=False)
  assert again.env_steps == 128 and int(again.state.version) == 4
  for a, b in zip(leaves(again.state.params), leaves(trainer.state.params)):
    np.testing.assert_array_equal(a, b)
  assert "not applied" in capsys.readouterr().out
  again.envs.close()


# -- workdirs ------------------------------------------------------------------------


def test_a_fresh_run_refuses_a_used_workdir(finished):
  workdir, _ = finished
  before = (workdir / "metrics.jsonl").read_text()
  with pytest.raises(UserError, match=f"workdir '{workdir}' already holds a run.*resume=True"):
    Trainer(tiny(128), str(workdir), progress=False)
  assert (workdir / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("key,value,shown", [
    ("env.name", "MetaWorld/Push-v3", "env.name: 'MetaWorld/Reach-v3' -> 'MetaWorld/Push-v3'"),
    ("policy.hidden", (32, 32), "policy.hidden: [16, 16] -> [32, 32]"),
    ("num_envs", 8, "num_envs: 4 -> 8"),
    ("algorithm.gamma", 0.9, "algorithm.gamma: 0.99 -> 0.9"),
])
def test_resume_with_another_config_names_the_keys_and_keeps_config_json(finished, tmp_path, key, value, shown):
  workdir = copy_of(finished[0], tmp_path)
  saved = (workdir / "config.json").read_text()
  cfg = tiny(256, resume=True)
  section, _, name = key.rpartition(".")
  (cfg[section] if section else cfg)[name] = value
  with pytest.raises(UserError, match="differs from the run") as err:
    Trainer(cfg, str(workdir), progress=False)
  assert shown in str(err.value)
  assert (workdir / "config.json").read_text() == saved


def test_resume_may_change_the_budget_and_logging(finished, tmp_path):
  workdir = copy_of(finished[0], tmp_path)
  cfg = tiny(512, resume=True)
  cfg.log_every_s, cfg.keep_checkpoints, cfg.target_success = 0.5, 5, 0.5
  trainer = Trainer(cfg, str(workdir), progress=False)
  assert trainer.env_steps == 128
  trainer.envs.close()


@pytest.mark.parametrize("args,expected", [
    (["--config.resume=True"], "--config.resume=True continues the run in --workdir"),
])
def test_resume_without_a_workdir_is_one_line(args, expected):
  proc = subprocess.run([sys.executable, "-m", "launch.train", "--progress=false", *args], cwd=ROOT,
                        env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=120)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr


def test_used_workdir_on_the_command_line_is_one_line(finished):
  workdir, _ = finished
  proc = subprocess.run([sys.executable, "-m", "launch.train", "--progress=false", f"--workdir={workdir}"],
                        cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=120)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2 and len(lines) == 1 and "already holds a run" in lines[0], proc.stderr


# -- resumed launches draw fresh, reproducible env seeds -------------------------------


def _first_obs(trainer) -> np.ndarray:
  from sim_adapters.base import gather_all  # pylint: disable=g-import-not-at-top
  trainer.host_envs[0].reset()
  obs = gather_all(trainer.host_envs[0], trainer.run_spec.num_envs).obs["state"]
  trainer.envs.close()
  return obs


def test_a_resumed_launch_draws_fresh_reproducible_initial_states(finished, tmp_path):
  source, done = finished
  assert done.env_seed == 0  # A first launch uses the run seed.
  resumed = [Trainer(tiny(256, resume=True), str(copy_of(source, tmp_path / str(i))), progress=False)
             for i in range(2)]
  assert resumed[0].env_seed == resumed[1].env_seed != 0
  first = _first_obs(Trainer(tiny(128), str(tmp_path / "fresh"), progress=False))
  again = [_first_obs(t) for t in resumed]
  np.testing.assert_array_equal(again[0], again[1])  # The same launch from the same checkpoint.
  assert not np.allclose(first, again[0])  # Not the first launch's goals and initial states again.
  # The seed goes into the checkpoint metadata of the launch that used it.
  ckpt = Checkpointer(str(source / "checkpoints"))
  assert ckpt.latest_meta()["env_seed"] == 0
  ckpt.close()


def test_best_success_of_zero_survives_resume(finished, tmp_path):
  workdir = copy_of(finished[0], tmp_path)
  trainer = Trainer(tiny(256, resume=True), str(workdir), progress=False)
  trainer.recorder.best_success_rate = 0.0
  trainer.tracker.env_steps = 200
  trainer.checkpoint()
  trainer.checkpointer.close()
  trainer.envs.close()
  again = Trainer(tiny(256, resume=True), str(workdir), progress=False)
  assert again.env_steps == 200 and again.recorder.best_success_rate == 0.0
  again.envs.close()


def test_checkpoint_reads_env_steps_once(finished, tmp_path):
  """The sampler thread adds env steps while the learner thread checkpoints: the directory
  name and the metadata must be one reading."""
  workdir = copy_of(finished[0], tmp_path)
  trainer = Trainer(tiny(256, resume=True), str(workdir), progress=False)

  class Moving(RunRecorder):
    reads = 0

    @property
    def env_steps(self):
      Moving.reads += 1
      return 300 + Moving.reads

    @env_steps.setter
    def env_steps(self, value):
      pass

  trainer.recorder.__class__ = Moving
  trainer.checkpoint()
  trainer.checkpointer.close()
  trainer.envs.close()
  steps = sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())
  restored = Trainer(tiny(256, resume=True), str(workdir), progress=False)
  assert restored.env_steps == steps[-1] > 300
  restored.envs.close()


# -- the learning-rate schedule ends with the run's last update ----------------------


LR_RUNS = {
    "sync": dict(scheduler="sync"),
    "pipelined": dict(scheduler="pipelined"),
    "ebrl": dict(scheduler="ebrl", segments=2),
    "device sync": dict(scheduler="sync", env="mjx:CartpoleBalance"),
    "device ebrl": dict(scheduler="ebrl", env="mjx:CartpoleBalance", segments=4),
}


# The budget and the schedule are the driver's and the learner's, the same for every scheduler: the
# device schedulers' runs (a minute or more of MJX compiles each on CPU) are opt-in.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n.startswith("device") else n
                                  for n in sorted(LR_RUNS)])
def test_linear_schedule_reaches_its_last_value_on_the_last_update(name, tmp_path):
  spec = LR_RUNS[name]
  cfg = tiny(0, scheduler=spec["scheduler"])
  cfg.algorithm.lr_schedule = "linear"
  cfg.ebrl.num_groups = 2
  cfg.ebrl.segments_per_update = spec.get("segments", 0)
  cfg.ebrl.max_staleness = 1
  if "env" in spec:
    cfg.env.name = spec["env"]
  per_update = (spec.get("segments") or cfg.num_envs) * cfg.rollout_length
  cfg.total_env_steps = 5 * per_update - 3  # Pays for 5 updates (the last one partly).
  seen = []
  trainer = Trainer(cfg, str(tmp_path / "run"), progress=False)
  seen.extend(float(report.metrics["learning_rate"]) for report in trainer.run())
  summary = trainer.finish()
  lc = trainer.learner.cfg
  assert lc.total_updates == 5 and summary["policy_version"] == 5 and len(seen) == 5
  # Start-up is reported in order: imports, built, first env steps, first update.
  marks = summary["startup_s"]
  assert list(marks) == ["imports", "built", "first_env_steps", "first_update"]
  assert 0 <= marks["imports"] <= marks["built"] <= marks["first_env_steps"] <= marks["first_update"]
  schedule = learning_rate_schedule(lc)
  np.testing.assert_allclose(seen, [float(schedule(u)) for u in range(5)], rtol=1e-6)
  # The last update has the schedule's last non-zero rate: not 0 early, not above it late.
  assert seen[-1] == pytest.approx(cfg.algorithm.learning_rate / 5) and seen[-1] > 0
  assert float(schedule(5)) == 0.0


# -- checkpoints kept -----------------------------------------------------------------


@pytest.mark.parametrize("keep", [1, 2])
def test_keep_checkpoints_keeps_the_newest(tmp_path, keep):
  cfg = tiny(160)
  cfg.keep_checkpoints = keep
  cfg.checkpoint_every_s = 0.0  # After every update.
  run(cfg, tmp_path)
  steps = sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit())
  assert steps == [160 - 32 * i for i in range(keep)][::-1]


# -- the pipelined baseline -------------------------------------------------------------


def test_pipelined_run_trains_over_its_stages_and_writes_the_outputs(tmp_path):
  cfg = tiny(256, scheduler="pipelined")
  cfg.pipelined.num_partitions = 2
  cfg.env.max_episode_steps = 20  # Episodes end within the run.
  cfg.log_every_s = 0.0
  trainer = run(cfg, tmp_path)
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["scheduler"] == "pipelined" and summary["env_steps"] == 256 and summary["policy_version"] == 8
  assert summary["episodes"] > 0 and summary["skipped_updates"] == 0
  lanes = {s.lane for s in trainer.tracer.spans()}
  assert {"partition0", "partition1"} <= lanes
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["policy_version"] for r in rows] == sorted(r["policy_version"] for r in rows)
  assert all(r["staleness"] == 0 for r in rows if "staleness" in r)
