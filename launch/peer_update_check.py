"""Is EBRL's PPO update the peer's? One Stable-Baselines3 update replayed in EBRL's learner.

  python -m launch.peer_update_check --peer_python=peers-venv/bin/python \
      --peer_dir=../shared/peers --env=MetaWorld/DialTurn-v3 --updates_before=3

The peer (launch/peer_side/sb3_update_dump.py, in its own interpreter) trains `updates_before`
updates, collects a rollout and saves it with its policy and Adam state before and after one
more update. Here the same weights and Adam moments go into EBRL's policy and optimiser, and:

- the forward pass: EBRL's log-probs and values of the peer's observations and actions against
  the ones the peer stored while acting;
- GAE: EBRL's `gae` over the peer's rewards (which carry gamma * V(final obs) on truncated
  steps), values and episode ends, against the peer's advantages;
- the update: EBRL's update function (10 epochs of one full-batch minibatch, clip 0.2, the value
  loss weighted as the peer's, gradients clipped to 0.5, Adam with eps 1e-5) on the peer's
  advantages and returns, against the peer's params after its update.

Differences are float32 rounding (<= 1e-5) if the two updates are the same computation. What
this leaves out is how the runs themselves collect data: how observations are normalised while
acting (VecNormalize counts every step; EBRL does so under `algorithm.obs_norm_update=every_step`,
checked in tests/algorithms/test_step_normalizer.py), EnvPool's reset step and the random numbers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

from absl import flags
import numpy as np

from launch import common


def _define_flags() -> SimpleNamespace:
  """Defined when run as a program, not on import: the test suite imports this module beside
  launch.learning_bench, which has its own --peer_python, and absl flags are process-global."""
  return SimpleNamespace(
      peer_python=flags.DEFINE_string("peer_python", None, "The peer's interpreter (Stable-Baselines3 + torch)."),
      peer_dir=flags.DEFINE_string("peer_dir", None, "Directory of the peer harness (envpool_sb3_vecenv.py)."),
      env=flags.DEFINE_string("env", "MetaWorld/DialTurn-v3", "EnvPool MetaWorld task the rollout comes from."),
      updates_before=flags.DEFINE_integer("updates_before", 3, "Peer updates before the one compared (Adam state)."),
      dump=flags.DEFINE_string("dump", None, "An existing dump to compare (skips running the peer)."))


HIDDEN = (64, 64)
TOLERANCE = 1e-5  # float32 rounding over 10 epochs of Adam steps.


def torch_to_flax(tensors: dict[str, np.ndarray], prefix: str) -> dict:
  """SB3 MlpPolicy names (separate pi / vf MLPs, action_net, value_net) to EBRL's mlp params."""
  g = lambda name: np.asarray(tensors[f"{prefix}{name}"])
  dense = lambda name: {"kernel": g(f"{name}.weight").T, "bias": g(f"{name}.bias")}
  torso = lambda mlp, head: {"Dense_0": dense(f"mlp_extractor.{mlp}.0"), "Dense_1": dense(f"mlp_extractor.{mlp}.2"),
                             "Dense_2": dense(head)}
  return {"actor": torso("policy_net", "action_net"), "critic": torso("value_net", "value_net"), "log_std": g("log_std")}


def compare(dump: dict[str, np.ndarray]) -> dict[str, float]:
  """Largest absolute differences between EBRL and the peer on the dump's rollout: log-probs,
  values, advantages and params after the update; plus the largest move of any param."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from ebrl.algorithms.gae import gae  # pylint: disable=g-import-not-at-top
  from ebrl.algorithms.ppo import PPOConfig  # pylint: disable=g-import-not-at-top
  from ebrl.learner import Learner, LearnerConfig  # pylint: disable=g-import-not-at-top
  from ebrl.step_normalizer import identity_stats  # pylint: disable=g-import-not-at-top
  from ebrl.types import Rollout  # pylint: disable=g-import-not-at-top
  from policies import make_policy  # pylint: disable=g-import-not-at-top
  from sim_adapters.base import EnvSpec, ObsSpec  # pylint: disable=g-import-not-at-top

  obs, actions = dump["observations"], dump["actions"]
  t, n, dim = obs.shape
  spec = EnvSpec("peer", {"state": ObsSpec((dim,), np.dtype(np.float32))}, actions.shape[-1],
                 -np.ones(actions.shape[-1], np.float32), np.ones(actions.shape[-1], np.float32), 500, False)
  policy = make_policy("mlp", spec, ml_collections.ConfigDict(dict(hidden=HIDDEN, init_log_std=0.0)))
  cfg = LearnerConfig(gamma=0.99, gae_lambda=0.95, epochs=10, num_minibatches=1, learning_rate=3e-4, max_grad_norm=0.5,
                      ppo=PPOConfig(clip_eps=0.2, vf_coef=1.0, ent_coef=0.0, normalize_advantages=True))
  learner = Learner(policy, cfg)
  # The peer's observations are already normalised: EBRL's normaliser is the identity here.
  identity = identity_stats(dim)
  params = {"net": jax.tree.map(jnp.asarray, torch_to_flax(dump, "before/")), "obs_norm": identity}
  opt = learner._optimizer.init(params["net"])  # pylint: disable=protected-access
  if int(dump["adam_step"]):
    moments = {k[len("adam/"):]: v for k, v in dump.items() if k.startswith("adam/")}
    mu = torch_to_flax({k[:-2]: v for k, v in moments.items() if k.endswith(".m")}, "")
    nu = torch_to_flax({k[:-2]: v for k, v in moments.items() if k.endswith(".v")}, "")
    inner = opt[1].inner_state
    adam = inner[0]._replace(count=jnp.asarray(int(dump["adam_step"]), jnp.int32),
                             mu=jax.tree.map(jnp.asarray, mu), nu=jax.tree.map(jnp.asarray, nu))
    opt = (opt[0], opt[1]._replace(inner_state=(adam,) + tuple(inner[1:]))) + tuple(opt[2:])
  state = learner.init(jax.random.PRNGKey(0)).replace(params=params, opt_state=opt)

  logp, _, values = policy.evaluate(params, {"state": obs}, actions)
  # An episode start at t + 1 is the end of step t; the peer already added gamma * V(final obs) to
  # that step's reward, so EBRL bootstraps nothing more there (terminated) and cuts the trace.
  rewards, v, starts = dump["rewards"], dump["values"], dump["episode_starts"]
  ended = np.concatenate([starts[1:], np.zeros((1, n), np.float32)]).astype(bool)
  if ended[-1].any():
    raise ValueError("the rollout's last step ends an episode: its bootstrap value is not in the dump")
  # The last step's next value, from the peer's own last advantage (one TD step there).
  v_last = (dump["advantages"][-1] + v[-1] - rewards[-1]) / cfg.gamma
  values_ext = np.concatenate([v, v_last[None]]).astype(np.float32)
  adv, _ = gae(jnp.asarray(rewards), jnp.asarray(values_ext), jnp.asarray(ended), jnp.asarray(ended), cfg.gamma,
               cfg.gae_lambda)
  ro = jax.tree.map(jnp.asarray, Rollout(
      obs={"state": obs}, actions=actions, logp=dump["log_probs"], values=values_ext, rewards=rewards,
      terminated=ended, done=ended, valid=np.ones((t, n), bool), version=np.zeros((t, n), np.int32)))
  new, _ = learner._update_fn(state, ro, targets=(jnp.asarray(dump["advantages"]), jnp.asarray(dump["returns"])))  # pylint: disable=protected-access
  want = torch_to_flax(dump, "after/")
  diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - b))), new.params["net"], want)
  moved = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))), new.params["net"], params["net"])
  return {"log_prob": float(np.max(np.abs(np.asarray(logp) - dump["log_probs"]))),
          "value": float(np.max(np.abs(np.asarray(values) - v))),
          "advantage": float(np.max(np.abs(np.asarray(adv) - dump["advantages"]))),
          "params_after_update": max(jax.tree.leaves(diffs)),
          "largest_param_move": max(jax.tree.leaves(moved))}


def _load(path: str) -> dict[str, np.ndarray]:
  with np.load(path) as f:
    return {k: f[k] for k in f.files}


def main(argv: list[str], f: SimpleNamespace) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}")
  if f.dump.value is None and not (f.peer_python.value and f.peer_dir.value):
    common.fail("give --peer_python and --peer_dir (to run the peer's update), or --dump=<an earlier dump.npz>")
  if f.updates_before.value < 0:
    common.fail(f"--updates_before={f.updates_before.value} must be >= 0")
  if f.dump.value is not None:
    dump = _load(f.dump.value)
  else:
    with tempfile.TemporaryDirectory(prefix="peer_update_") as tmp:  # Removed on every exit, errors too.
      path = os.path.join(tmp, "update.npz")
      script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_side", "sb3_update_dump.py")
      proc = subprocess.run([f.peer_python.value, script, f"--peer_dir={f.peer_dir.value}", f"--env={f.env.value}",
                             f"--updates_before={f.updates_before.value}", f"--out={path}"],
                            capture_output=True, text=True, check=False)
      if proc.returncode:
        common.fail(f"the peer's update failed: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
      dump = _load(path)
  got = compare(dump)
  logged = {k[len("logged/"):]: float(v) for k, v in dump.items() if k.startswith("logged/")}
  print(f"| {f.env.value}, update {f.updates_before.value + 1} | largest difference |")
  print("| --- | ---: |")
  for name, value in got.items():
    print(f"| {name} | {value:.2e} |")
  print(f"peer logged: {logged}")
  same = all(got[k] <= TOLERANCE for k in ("log_prob", "value", "advantage", "params_after_update"))
  print("the same update" if same else "NOT the same update")
  if not same:
    sys.exit(1)


if __name__ == "__main__":
  _flags = _define_flags()
  common.run(lambda argv: main(argv, _flags))
