"""Evaluate a trained policy on a host (EnvPool) or device (mjx:, brax:) env.

  python -m launch.eval --checkpoint=runs/panda --env=PandaPickCube-v1 --episodes=64
  python -m launch.eval --checkpoint=runs/panda --env=mjx:PandaPickCube
  python -m launch.eval --checkpoint=runs/sft-vla --episodes=100 --actions=mean

--checkpoint is a run's workdir (its config.json names the policy and how the
run built its envs: pixels, render stage, action chunks; the eval envs are
built the same way; the newest readable checkpoint is loaded) or a launch.sft
--out directory (its params/, built as sft.json's "config" says). --env defaults to the env it was trained on
and may name the same task on the other backend (their observations and
actions correspond; see README, "Device simulators"). Every one of
`--episodes` envs runs exactly one episode, so short episodes are not
over-counted, with the policy sampling as in training (--actions=sample) or
acting with its deterministic mean action (--actions=mean: a Gaussian's mean, a
vla's greedy tokens). The default --seed is the held-out one a fine-tuning run
and launch.sft evaluate on, so every checkpoint compared starts from the same
initial states. Prints one JSON line: env, trained_on, source (train, sft),
actions, episodes, episode_return, episode_length, success_rate and its 95%
Wilson interval success_ci95 (null when the task has no success signal), on a
multi-task env (MetaWorld/MT10, MT50, MT:<tasks>) success_rate_by_task and
success_ci95_by_task (each task's over its own envs; --episodes must give every
task one), checkpoint_env_steps (null for sft params). A thin absl wrapper over
`ebrl.evaluate` (ebrl/evaluation.py, evaluate_run).
"""

from __future__ import annotations

import json

from absl import flags

from launch import common

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Run workdir holding config.json and checkpoints/, or a "
                                  "launch.sft --out directory (params/, sft.json).")
_ENV = flags.DEFINE_string("env", None, "Env to evaluate on (default: the env the run trained on).")
_EPISODES = flags.DEFINE_integer("episodes", 32, "Episodes to evaluate (one per env).")
_SEED = flags.DEFINE_integer("seed", 1_000_003, "Seed of the eval envs and action samples (default: the held-out "
                             "seed, ebrl.evaluation.HELD_OUT_SEED, apart from training's and the demos').")
_ACTIONS = flags.DEFINE_string("actions", "sample", "sample: act as in training; mean: the policy's deterministic "
                               "mean action (greedy tokens for vla).")
_OUT = flags.DEFINE_string("out", None, "Also write the result JSON here.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}")
  if not _CHECKPOINT.value:
    common.fail("--checkpoint=<run workdir> is required (or a launch.sft --out directory)")
  from ebrl import evaluation  # pylint: disable=g-import-not-at-top

  evaluation.check_args(_EPISODES.value, _SEED.value, _ACTIONS.value)  # Before JAX starts.
  common.enable_compilation_cache()
  print(json.dumps(evaluation.evaluate_run(_CHECKPOINT.value, _ENV.value, _EPISODES.value, _SEED.value, _OUT.value,
                                           _ACTIONS.value)))


def cli() -> None:
  """The `ebrl-eval` console command (pyproject.toml): the same flags as `python -m launch.eval`."""
  common.run(main)


if __name__ == "__main__":
  cli()
