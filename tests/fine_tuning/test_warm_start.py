"""Warm starts: behaviour cloning, params on disk (launch.sft's and the trainer's), launch.bc as launch.sft."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ebrl import warm_start
from ebrl.checkpointing import Checkpointer
from ebrl.learner import Learner, LearnerConfig
from policies.mlp import MLPPolicy
from sim_adapters.base import EnvSpec, ObsSpec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OBS_DIM, ACTION_DIM = 5, 2


def tiny_spec() -> EnvSpec:
  return EnvSpec(name="tiny", obs={"state": ObsSpec((OBS_DIM,), np.float32)}, action_dim=ACTION_DIM,
                 action_low=-np.ones(ACTION_DIM, np.float32), action_high=np.ones(ACTION_DIM, np.float32),
                 max_episode_steps=10, has_success=False)


def linear_demos(m=512, seed=0):
  rng = np.random.default_rng(seed)
  obs = rng.normal(1.0, 2.0, (m, OBS_DIM)).astype(np.float32)  # Off-centre: the normaliser matters.
  w = rng.normal(0.0, 0.2, (OBS_DIM, ACTION_DIM)).astype(np.float32)
  actions = (obs - 1.0) @ w + np.float32(0.3)
  return {"obs": {"state": obs}, "actions": actions.astype(np.float32)}


def tree_equal(a, b) -> bool:
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return (jax.tree.structure(a) == jax.tree.structure(b)
          and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb)))


# ----------------------------------------------------------------------------- behaviour cloning


def test_load_params_round_trip_from_bc_saver(tmp_path):
  policy = MLPPolicy(tiny_spec(), hidden=(16, 16))
  params = policy.update_normalizer(policy.init(jax.random.key(3)), linear_demos()["obs"], jnp.ones(512))
  path = warm_start.save_params(str(tmp_path / "bc"), params, {"note": "test"})
  assert path == str(tmp_path / "bc" / "params")
  assert json.loads((tmp_path / "bc" / "bc.json").read_text()) == {"note": "test"}
  loaded = warm_start.load_params(str(tmp_path / "bc"), policy.init(jax.random.key(4)))
  assert tree_equal(loaded, params)
  with pytest.raises(ValueError, match="never overwritten"):
    warm_start.save_params(str(tmp_path / "bc"), params)


def test_load_params_from_trainer_checkpoint(tmp_path):
  policy = MLPPolicy(tiny_spec(), hidden=(16, 16))
  learner = Learner(policy, LearnerConfig())
  state = learner.init(jax.random.key(5))
  state = state.replace(params=policy.update_normalizer(state.params, linear_demos()["obs"], jnp.ones(512)))
  ckpt = Checkpointer(str(tmp_path / "run" / "checkpoints"), warn=lambda m: None)
  ckpt.save(100, state, {"env_steps": 100})
  ckpt.close()
  template = learner.init(jax.random.key(6)).params
  for path in (tmp_path / "run", tmp_path / "run" / "checkpoints", tmp_path / "run" / "checkpoints" / "100"):
    loaded = warm_start.load_params(str(path), template)
    assert tree_equal(loaded, state.params), path
    # Placed like the template (the learner's replicated sharding).
    assert all(a.sharding == b.sharding for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(template)))


def test_shape_mismatch_names_leaf_and_shapes(tmp_path):
  small = MLPPolicy(tiny_spec(), hidden=(8,))
  warm_start.save_params(str(tmp_path / "bc"), small.init(jax.random.key(0)))
  big = MLPPolicy(tiny_spec(), hidden=(16,))
  with pytest.raises(ValueError) as err:
    warm_start.load_params(str(tmp_path / "bc"), big.init(jax.random.key(0)))
  msg = str(err.value)
  assert "\n" not in msg
  assert "'net/actor/Dense_0/bias' has shape (8,) in the checkpoint but (16,) in the policy" in msg
  deep = MLPPolicy(tiny_spec(), hidden=(8, 8)).init(jax.random.key(0))
  with pytest.raises(ValueError, match=r"'net/actor/Dense_1/bias' has shape \(2,\) in the checkpoint but \(8,\)"):
    warm_start.load_params(str(tmp_path / "bc"), deep)
  more = small.init(jax.random.key(0))
  more = {**more, "net": {**more["net"], "extra": jnp.zeros(3)}}
  with pytest.raises(ValueError, match=r"leaf 'net/extra' \(3,\) is missing from the checkpoint"):
    warm_start.load_params(str(tmp_path / "bc"), more)
  fewer = small.init(jax.random.key(0))
  fewer = {**fewer, "net": {k: v for k, v in fewer["net"].items() if k != "log_std"}}
  with pytest.raises(ValueError, match=r"the checkpoint has leaf 'net/log_std' \(2,\) that the policy does not"):
    warm_start.load_params(str(tmp_path / "bc"), fewer)
  with pytest.raises(ValueError, match="is not a directory"):
    warm_start.load_params(str(tmp_path / "nope"), big.init(jax.random.key(0)))
  with pytest.raises(ValueError, match="no Orbax params found"):
    warm_start.load_params(str(tmp_path), big.init(jax.random.key(0)))


def _run_bc(args):
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "launch.bc", *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)


def test_launch_bc_is_launch_sft(tmp_path):
  proc = _run_bc(["--help"])
  assert proc.returncode == 0 and "--eval_episodes" in proc.stdout + proc.stderr
  (tmp_path / "demos").mkdir()
  proc = _run_bc([f"--demos={tmp_path / 'demos'}", f"--out={tmp_path / 'bc'}", "--steps=5"])
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: ") and "is empty; record one with" in lines[0], proc.stderr
  assert not (tmp_path / "bc" / "params").exists()


def test_critic_of_another_shape_starts_fresh_and_the_actor_loads(tmp_path):
  """Pre-training never trains a critic: a vla pre-trained with a linear value head warm-starts a vla with
  a critic MLP (and back): every actor leaf is the saved one, the critic keeps the template's init; a
  saved TrainState (an RL run's checkpoint) too. An actor leaf of another shape is still an error."""
  from policies.vla import VLAPolicy  # pylint: disable=g-import-not-at-top
  spec = tiny_spec()
  make = lambda **kw: VLAPolicy(spec, bins=8, width=8, depth=1, heads=2, **kw)
  head, mlp = make(), make(critic_hidden=(4,))
  saved = jax.jit(head.init)(jax.random.key(0))
  warm_start.save_params(str(tmp_path / "sft"), saved)
  template = jax.jit(mlp.init)(jax.random.key(1))
  assert warm_start.check_params(str(tmp_path / "sft"), jax.eval_shape(mlp.init, jax.random.key(1)))[3] == [
      "net/critic/Dense_0/bias", "net/critic/Dense_0/kernel", "net/critic/Dense_1/bias", "net/critic/Dense_1/kernel"]
  loaded = warm_start.load_params(str(tmp_path / "sft"), template)
  assert jax.tree.structure(loaded) == jax.tree.structure(template)
  assert tree_equal(loaded["net"]["critic"], template["net"]["critic"])
  actor = lambda p: {k: v for k, v in p["net"].items() if k not in ("critic", "value_head")}
  assert tree_equal(actor(loaded), actor(saved)) and not tree_equal(actor(loaded), actor(template))
  # An RL checkpoint with the critic MLP, read by a vla with the linear head.
  learner = Learner(mlp, LearnerConfig())
  state = learner.init(jax.random.key(2))
  ckpt = Checkpointer(str(tmp_path / "run" / "checkpoints"), warn=lambda m: None)
  ckpt.save(10, state, {"env_steps": 10})
  ckpt.close()
  back = warm_start.load_params(str(tmp_path / "run"), saved)
  assert tree_equal(back["net"]["value_head"], saved["net"]["value_head"])
  assert tree_equal(actor(back), actor(state.params))
  wider = VLAPolicy(spec, bins=16, width=8, depth=1, heads=2)
  with pytest.raises(ValueError, match=r"leaf 'net/action_head/bias' has shape \(8,\) in the checkpoint but \(16,\)"):
    warm_start.load_params(str(tmp_path / "sft"), jax.jit(wider.init)(jax.random.key(0)))
