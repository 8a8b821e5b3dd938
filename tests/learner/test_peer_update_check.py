"""launch.peer_update_check: the SB3 -> EBRL mapping of weights, Adam moments and rollouts.

The real check runs the peer in its own interpreter (BENCHMARKS.md has its figures). Here a dump
in the peer's layout is written from an EBRL update, so every name, transpose and episode-end
convention the tool maps must come back to what was written, and a dump that disagrees must be
reported as a different update.
"""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from ebrl.algorithms.gae import gae
from ebrl.algorithms.ppo import PPOConfig
from ebrl.learner import Learner, LearnerConfig
from ebrl.step_normalizer import identity_stats
from ebrl.types import Rollout
from launch import peer_update_check as check
from policies import make_policy
from sim_adapters.base import EnvSpec, ObsSpec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T, N, DIM, ACT = 8, 4, 5, 2


def _to_torch(net: dict, prefix: str) -> dict[str, np.ndarray]:
  out = {f"{prefix}log_std": np.asarray(net["log_std"])}
  for side, mlp, head in (("actor", "policy_net", "action_net"), ("critic", "value_net", "value_net")):
    for layer, name in (("Dense_0", f"mlp_extractor.{mlp}.0"), ("Dense_1", f"mlp_extractor.{mlp}.2"), ("Dense_2", head)):
      out[f"{prefix}{name}.weight"] = np.asarray(net[side][layer]["kernel"]).T
      out[f"{prefix}{name}.bias"] = np.asarray(net[side][layer]["bias"])
  return out


def _dump() -> dict[str, np.ndarray]:
  """One update made by EBRL, written as the peer's dumper writes one (fresh Adam, step 0)."""
  spec = EnvSpec("toy", {"state": ObsSpec((DIM,), np.dtype(np.float32))}, ACT, -np.ones(ACT, np.float32),
                 np.ones(ACT, np.float32), 10, False)
  policy = make_policy("mlp", spec, ml_collections.ConfigDict(dict(hidden=check.HIDDEN, init_log_std=0.0)))
  cfg = LearnerConfig(gamma=0.99, gae_lambda=0.95, epochs=10, num_minibatches=1, learning_rate=3e-4, max_grad_norm=0.5,
                      ppo=PPOConfig(clip_eps=0.2, vf_coef=1.0))
  learner = Learner(policy, cfg)
  state = learner.init(jax.random.PRNGKey(0))
  ident = identity_stats(DIM)
  state = state.replace(params={**state.params, "obs_norm": ident})
  rng = np.random.default_rng(0)
  obs = rng.normal(size=(T + 1, N, DIM)).astype(np.float32)
  actions, logp, values, _ = policy.sample(state.params, {"state": obs}, jax.random.PRNGKey(1))
  actions, logp, values = (np.asarray(x) for x in (actions, logp, values))
  rewards = rng.normal(size=(T, N)).astype(np.float32)
  ended = np.zeros((T, N), bool)
  ended[3, 1] = ended[5, 2] = True  # Episodes end inside the rollout, never on its last step.
  adv, ret = gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(ended), jnp.asarray(ended), 0.99, 0.95)
  ro = jax.tree.map(jnp.asarray, Rollout(obs={"state": obs[:T]}, actions=actions[:T], logp=logp[:T], values=values,
                                         rewards=rewards, terminated=ended, done=ended, valid=np.ones((T, N), bool),
                                         version=np.zeros((T, N), np.int32)))
  new, _ = learner._update_fn(jax.tree.map(jnp.copy, state), ro, targets=(adv, ret))  # pylint: disable=protected-access
  starts = np.concatenate([np.zeros((1, N), bool), ended[:-1]]).astype(np.float32)
  return {"observations": obs[:T], "actions": actions[:T], "rewards": rewards, "episode_starts": starts,
          "values": values[:T], "log_probs": logp[:T], "advantages": np.asarray(adv), "returns": np.asarray(ret),
          "adam_step": np.array(0), **_to_torch(state.params["net"], "before/"), **_to_torch(new.params["net"], "after/")}


def test_a_dump_of_the_same_update_compares_equal_and_a_changed_one_does_not():
  dump = _dump()
  got = check.compare(dump)
  for name in ("log_prob", "value", "advantage", "params_after_update"):
    assert got[name] <= check.TOLERANCE, (name, got)
  assert got["largest_param_move"] > 100 * check.TOLERANCE  # The update moved the params: not vacuous.
  changed = dict(dump)
  changed["after/action_net.bias"] = dump["after/action_net.bias"] + 1e-3
  assert check.compare(changed)["params_after_update"] > 5e-4


def test_it_needs_the_peer_or_a_dump_in_one_line():
  proc = subprocess.run([sys.executable, "-m", "launch.peer_update_check"], cwd=ROOT, capture_output=True, text=True,
                        timeout=120, check=False)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert "give --peer_python and --peer_dir" in proc.stderr
