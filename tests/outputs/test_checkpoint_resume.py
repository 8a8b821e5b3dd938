"""Checkpoints are atomic Orbax saves; resume continues the run where it stopped.

Restored exactly: the train state (params, Adam moments, normaliser, learner
key), the env-step and sampler-call counters (so action keys continue their
sequence) and the episode window. Deliberately not replayed: the envs, whose
resumed launch draws fresh initial states from a seed derived from the run seed
and the env steps it resumes at (tests/outputs/test_run_lifecycle.py checks they differ
from the first launch's and repeat for the same checkpoint).
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ebrl.errors import UserError
from ebrl.trainer import Trainer
from launch.configs import default
from tiny_configs import leaves, run_to_end, tiny_config


def tiny_run_config(total: int = 256, resume: bool = False):
  # These resumes raise the budget, and a linear rate decays over the budget's updates by design:
  # a constant rate lets one update from the restored state be compared with the original's.
  return tiny_config(total, resume=resume, algorithm__epochs=2, algorithm__lr_schedule="constant",
                     log_every_s=0.0,
                     checkpoint_every_s=default.get_config().checkpoint_every_s)


def train(workdir, total, resume=False):
  return run_to_end(tiny_run_config(total, resume), workdir)[0]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("run")
  return workdir, train(workdir, 128)


def test_run_writes_all_outputs(first_run):
  workdir, trainer = first_run
  for name in ("config.json", "metrics.jsonl", "summary.json", "plots/learning_curve.png"):
    assert (workdir / name).is_file(), name
  assert os.listdir(workdir / "tb")
  summary = json.loads((workdir / "summary.json").read_text())
  for key in ("env", "policy", "scheduler", "env_steps", "wall_s", "env_steps_per_s", "final_success_rate",
              "best_success_rate", "time_to_success_s", "env_steps_to_success"):
    assert key in summary
  assert summary["env_steps"] == 128 and summary["policy_version"] == 4
  row = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])
  for key in ("env_steps", "wall_s", "env_steps_per_s", "success_rate", "episode_return", "episode_length",
              "policy_version", "time_sim_s", "time_gen_s", "time_train_s", "time_other_s", "nan_resets"):
    assert key in row
  assert (workdir / "checkpoints" / "128").is_dir()


def test_resume_restores_state_counters_and_rng(first_run, tmp_path):
  workdir, done = first_run
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  resumed = Trainer(tiny_run_config(256, resume=True), str(copy), progress=False)
  assert resumed.env_steps == 128
  assert int(resumed.state.version) == int(done.state.version)
  for a, b in zip(leaves(resumed.state), leaves(done.state)):
    np.testing.assert_array_equal(a, b)  # params, Adam moments, normaliser, learner key
  assert resumed.sampler.calls == done.sampler.calls  # Action keys continue their sequence.
  assert resumed.env_seed != done.env_seed == 0  # Fresh initial states, not the first launch's again.
  assert list(resumed.tracker.recent) == list(done.tracker.recent)
  # The same rollout gives the same update from the restored state as from the original.
  rng = np.random.default_rng(0)
  from ebrl.trajectories.rollout_buffer import RolloutBuffer  # pylint: disable=g-import-not-at-top
  buf = RolloutBuffer(done.spec, 8, 4)
  buf.obs["state"][:] = rng.normal(size=buf.obs["state"].shape)
  buf.actions[:] = rng.normal(size=buf.actions.shape)
  buf.rewards[:] = rng.normal(size=buf.rewards.shape)
  buf.valid[:] = True
  ro = buf.rollout(np.zeros(4, np.float32))
  copy_of = lambda state: jax.tree.map(jnp.copy, state)  # update() donates its input state.
  s1, _ = resumed.learner.update(copy_of(resumed.state), ro)
  s2, _ = done.learner.update(copy_of(done.state), ro)
  for a, b in zip(leaves(s1), leaves(s2)):
    np.testing.assert_array_equal(a, b)
  resumed.train(256)
  summary = resumed.finish()
  assert summary["env_steps"] == 256
  assert summary["policy_version"] == 8  # 4 updates before, 4 after.
  assert sorted(int(s) for s in os.listdir(copy / "checkpoints") if s.isdigit())[-1] == 256


def _corrupt(step_dir):
  """Truncates every data file of a checkpoint step."""
  for root, _, files in os.walk(step_dir):
    for f in files:
      with open(os.path.join(root, f), "w") as fh:
        fh.write("garbage")


def test_corrupt_checkpoint_is_reported_and_older_one_used(first_run, tmp_path, capsys):
  workdir, _ = first_run
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  # A second, older good checkpoint: write one at step 64 from the same state.
  trainer = Trainer(tiny_run_config(256, resume=True), str(copy), progress=False)
  trainer.tracker.env_steps = 64
  trainer.checkpoint()
  trainer.checkpointer.close()
  _corrupt(copy / "checkpoints" / "128")
  before = sorted(os.listdir(copy / "checkpoints" / "128"))
  resumed = Trainer(tiny_run_config(256, resume=True), str(copy), progress=False)
  err = capsys.readouterr()
  assert str(copy / "checkpoints" / "128") in err.out + err.err
  assert resumed.env_steps == 64
  # The corrupt checkpoint is left where it is for inspection.
  assert sorted(os.listdir(copy / "checkpoints" / "128")) == before


def test_all_checkpoints_corrupt_is_a_user_error(first_run, tmp_path):
  workdir, _ = first_run
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  _corrupt(copy / "checkpoints" / "128")
  with pytest.raises(UserError, match=str(copy / "checkpoints" / "128")):
    Trainer(tiny_run_config(256, resume=True), str(copy), progress=False)


def test_existing_step_is_never_overwritten(first_run, tmp_path):
  workdir, _ = first_run
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  trainer = Trainer(tiny_run_config(256, resume=True), str(copy), progress=False)
  stamp = os.path.getmtime(copy / "checkpoints" / "128")
  trainer.state = trainer.state.replace(version=trainer.state.version + 100)
  assert trainer.checkpointer.save(128, trainer.state, {"env_steps": 128, "wall_s": 0.0}) is False
  trainer.checkpointer.close()
  assert os.path.getmtime(copy / "checkpoints" / "128") == stamp
