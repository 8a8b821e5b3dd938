"""Train a policy: `python -m launch.train` (no flags) trains the embedded default.

  python -m launch.train --config=launch/configs/default.py \
      --config.env.name=MetaWorld/Reach-v3 --config.policy.name=mlp \
      --config.scheduler=sync --config.num_envs=32 --config.total_env_steps=1000000 \
      --config.target_success=0.9 --config.resume=True --workdir=runs/reach
"""

from __future__ import annotations

import time

LAUNCH_TIME = time.time()  # Wall clock starts at launch: imports and compiles count.

import datetime  # pylint: disable=g-import-not-at-top
import json
import os

from absl import flags

from launch import common

_CONFIG = common.define_config()
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<env>-<scheduler>-<time>).")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show the progress bar.")


def default_workdir(cfg) -> str:
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  return os.path.join("runs", f"{cfg.env.name.replace('/', '_')}-{cfg.scheduler}-{stamp}")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}; use --config.<key>=<value> flags")
  cfg = common.config_value(_CONFIG)
  if cfg.resume and not _WORKDIR.value:
    common.fail("--config.resume=True continues the run in --workdir; pass --workdir=<the run's directory>")
  common.enable_compilation_cache()
  from ebrl import interrupts  # pylint: disable=g-import-not-at-top
  from ebrl.trainer import Trainer

  workdir = _WORKDIR.value or default_workdir(cfg)
  trainer = Trainer(cfg, workdir, launch_time=LAUNCH_TIME, progress=_PROGRESS.value)
  print(f"training {cfg.env.name} ({cfg.policy.name}, {cfg.scheduler}) in {trainer.workdir}", flush=True)
  with interrupts.stop_on_signals(trainer.stop_requested):
    try:
      trainer.train()
    except KeyboardInterrupt:  # Only where no signal handler could be installed.
      print("interrupted; saving a checkpoint and the summary")
    summary = trainer.finish()
  print(json.dumps({k: summary[k] for k in (
      "env", "env_steps", "wall_s", "env_steps_per_s", "final_success_rate", "time_to_success_s")}))
  print(f"outputs in {trainer.workdir}")


def cli() -> None:
  """The `ebrl-train` console command (pyproject.toml): the same flags as `python -m launch.train`."""
  common.run(main)


if __name__ == "__main__":
  cli()
