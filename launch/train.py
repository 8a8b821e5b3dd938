"""Train a policy: `python -m launch.train` (no flags) trains the embedded default.

  python -m launch.train --config=launch/configs/default.py \
      --config.env.name=MetaWorld/Reach-v3 --config.policy.name=mlp \
      --config.scheduler=sync --config.num_envs=32 --config.total_env_steps=1000000 \
      --config.target_success=0.9 --config.resume=True --workdir=runs/reach
"""

from __future__ import annotations

import time

LAUNCH_TIME = time.time()  # Wall clock starts at launch: imports and compiles count.

import json  # pylint: disable=g-import-not-at-top

from absl import flags

from launch import common

_CONFIG = common.define_config()
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<env>-<scheduler>-<time>).")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show the progress bar.")
common.define_process_flags()


def main(argv: list[str]) -> None:
  """The flags' config through ebrl.api.train (the Python API), its summary printed as one line."""
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}; use --config.<key>=<value> flags")
  cfg = common.config_value(_CONFIG)
  if cfg.resume and not _WORKDIR.value:
    common.fail("--config.resume=True continues the run in --workdir; pass --workdir=<the run's directory>")
  common.check_process_share(cfg)  # Sizes that do not split over --num_processes: before anyone is contacted.
  common.join_run()
  from ebrl import api  # pylint: disable=g-import-not-at-top

  summary = api.train(cfg, _WORKDIR.value, progress=_PROGRESS.value, launch_time=LAUNCH_TIME,
                      log=lambda m: print(m, flush=True), second_interrupt="default")
  print(json.dumps({k: summary[k] for k in (
      "env", "env_steps", "wall_s", "env_steps_per_s", "final_success_rate", "time_to_success_s")}))
  print(f"outputs in {summary.workdir}")


def cli() -> None:
  """The `ebrl-train` console command (pyproject.toml): the same flags as `python -m launch.train`."""
  common.run(main)


if __name__ == "__main__":
  cli()
