"""Evaluate a trained policy on a host (EnvPool) or device (mjx:, brax:) env.

  python -m launch.eval --checkpoint=runs/panda --env=PandaPickCube-v1 --episodes=64
  python -m launch.eval --checkpoint=runs/panda --env=mjx:PandaPickCube

--checkpoint is a run's workdir (its config.json names the policy and how the
run built its envs: pixels, render stage, action chunks; the eval envs are
built the same way; the newest readable checkpoint is loaded). --env defaults to the env it was trained on
and may name the same task on the other backend (their observations and
actions correspond; see README, "Device simulators"). Every one of
`--episodes` envs runs exactly one episode with the policy sampling as in
training, so short episodes are not over-counted. Prints one JSON line:
env, episodes, episode_return, episode_length, success_rate (null when the
task has no success signal), checkpoint_env_steps.
"""

from __future__ import annotations

import json
import os

from absl import flags

from launch import common

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Run workdir holding config.json and checkpoints/.")
_ENV = flags.DEFINE_string("env", None, "Env to evaluate on (default: the env the run trained on).")
_EPISODES = flags.DEFINE_integer("episodes", 32, "Episodes to evaluate (one per env).")
_SEED = flags.DEFINE_integer("seed", 12345, "Seed of the eval envs and action samples.")
_OUT = flags.DEFINE_string("out", None, "Also write the result JSON here.")


def _load_run_config(workdir: str):
  import ml_collections

  from ebrl.errors import UserError

  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise UserError(f"--checkpoint={workdir} is not a run workdir (no config.json)")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def _restore(workdir: str, cfg, policy):
  import jax

  from ebrl.checkpointing import Checkpointer
  from ebrl.errors import UserError
  from ebrl.learner import init_train_state
  from ebrl.layout import RunLayout
  from ebrl.learner import LearnerConfig

  template = init_train_state(policy, LearnerConfig.from_config(cfg, RunLayout.from_config(cfg)), jax.random.PRNGKey(0))
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), warn=lambda m: None)
  try:
    restored = ckpt.restore_latest(template)
  finally:
    ckpt.close()
  if restored is None:
    raise UserError(f"no checkpoint in {os.path.join(workdir, 'checkpoints')}")
  return restored


def _check_flags() -> None:
  """The flags, before the run is read or any env built."""
  from ebrl.validation import SEED_MAX  # pylint: disable=g-import-not-at-top

  if not _CHECKPOINT.value:
    common.fail("--checkpoint=<run workdir> is required")
  if _EPISODES.value <= 0:
    common.fail(f"--episodes={_EPISODES.value} must be a positive integer (one episode per env)")
  if not 0 <= _SEED.value <= SEED_MAX:
    common.fail(f"--seed={_SEED.value} must be an integer in [0, {SEED_MAX}] (EnvPool takes int32 seeds)")


def _make_policy(cfg, spec):
  from ebrl.errors import UserError  # pylint: disable=g-import-not-at-top
  from policies import IncompatibleObservationError, make_policy

  try:
    return make_policy(cfg.policy.name, spec, cfg.policy)
  except (IncompatibleObservationError, ValueError) as e:
    raise UserError(f"--checkpoint={_CHECKPOINT.value}: {e}") from None


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}")
  _check_flags()
  common.enable_compilation_cache()
  from ebrl.errors import UserError
  from ebrl import evaluation
  from sim_adapters import UnknownEnvError, check_env_name

  workdir = os.path.abspath(_CHECKPOINT.value)
  cfg = _load_run_config(workdir)
  env_name = _ENV.value or cfg.env.name
  try:
    check_env_name(env_name)
  except UnknownEnvError as e:
    raise UserError(str(e)) from None
  if _OUT.value:  # Before the episodes run: an unwritable --out would lose them.
    common.check_output_file("out", _OUT.value)
  run_env = evaluation.RunEnv.of_run(cfg)
  runner = evaluation.make_runner(env_name, _EPISODES.value, _SEED.value, run_env)
  train_spec = evaluation.spec_of(cfg.env.name, run_env) if env_name != cfg.env.name else runner.spec
  evaluation.check_same_observations(train_spec, runner.spec)
  policy = _make_policy(cfg, runner.spec)
  state, meta = _restore(workdir, cfg, policy)
  result = {"env": env_name, "trained_on": cfg.env.name, **runner.run(policy, state.params),
            "checkpoint_env_steps": int(meta["env_steps"])}
  line = json.dumps(result)
  print(line)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      f.write(line + "\n")


def cli() -> None:
  """The `ebrl-eval` console command (pyproject.toml): the same flags as `python -m launch.eval`."""
  common.run(main)


if __name__ == "__main__":
  cli()
