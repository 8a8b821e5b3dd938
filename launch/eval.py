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
task has no success signal), on a multi-task env (MetaWorld/MT10, MT50,
MT:<tasks>) success_rate_by_task (each task's success over its own envs;
--episodes must give every task one), checkpoint_env_steps. A thin absl wrapper over
`ebrl.evaluate` (ebrl/evaluation.py, evaluate_run).
"""

from __future__ import annotations

import json

from absl import flags

from launch import common

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Run workdir holding config.json and checkpoints/.")
_ENV = flags.DEFINE_string("env", None, "Env to evaluate on (default: the env the run trained on).")
_EPISODES = flags.DEFINE_integer("episodes", 32, "Episodes to evaluate (one per env).")
_SEED = flags.DEFINE_integer("seed", 12345, "Seed of the eval envs and action samples.")
_OUT = flags.DEFINE_string("out", None, "Also write the result JSON here.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}")
  if not _CHECKPOINT.value:
    common.fail("--checkpoint=<run workdir> is required")
  from ebrl import evaluation  # pylint: disable=g-import-not-at-top

  evaluation.check_args(_EPISODES.value, _SEED.value)  # Before JAX starts.
  common.enable_compilation_cache()
  print(json.dumps(evaluation.evaluate_run(_CHECKPOINT.value, _ENV.value, _EPISODES.value, _SEED.value, _OUT.value)))


def cli() -> None:
  """The `ebrl-eval` console command (pyproject.toml): the same flags as `python -m launch.eval`."""
  common.run(main)


if __name__ == "__main__":
  cli()
