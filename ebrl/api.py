"""The Python API: configure and train from a notebook or a script, without absl flags.

  import ebrl
  summary = ebrl.train(overrides={"total_env_steps": 100_000})
  summary["final_success_rate"], summary.paths["learning_curve"]

`python -m launch.train` is a thin wrapper over `train`. Bad input raises
`ebrl.UserError` carrying the one-line message the CLI prints (which prints
"error: <message>" and exits 2), before anything is built or compiled.
A notebook's stop button (SIGINT to the kernel) asks the run to stop at its
next update, as Ctrl-C does on the command line: a checkpoint and summary.json
are written and `train` returns the summary.
"""

from __future__ import annotations

import datetime
import os
import time
from typing import Any, Callable, Mapping

import ml_collections

from ebrl import defaults
from ebrl.errors import UserError, one_line


class Summary(dict):
  """summary.json's fields, plus `paths`: where the run's outputs are."""

  def __init__(self, fields: Mapping[str, Any], paths: Mapping[str, str]):
    super().__init__(fields)
    self.paths = dict(paths)

  @property
  def workdir(self) -> str:
    return self.paths["workdir"]


def default_config() -> ml_collections.ConfigDict:
  """The default run (ebrl/defaults.py): a fresh copy to change and pass to `train`."""
  return defaults.get_config()


def _flat(cfg, prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in cfg.items():
    if isinstance(value, ml_collections.ConfigDict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def _unknown_key(dotted: str) -> UserError:
  """The CLI's message for a key the default config does not have (ml_collections' own suggestion)."""
  node = defaults.get_config()
  try:
    for part in dotted.split("."):
      node = getattr(node, part)
  except (AttributeError, KeyError) as e:
    return UserError(f"unknown config key: {one_line(e)}")
  return UserError(f"unknown config key: '{dotted}'")


def make_config(config: ml_collections.ConfigDict | Mapping | None = None,
                overrides: Mapping[str, Any] | None = None) -> ml_collections.ConfigDict:
  """A run config: the default (ebrl/defaults.py) with every value of `config` (a ConfigDict or a
  nested dict, whole or partial) and then `overrides` ({"env.name": ..., "algorithm.learning_rate":
  ...}) set on it. A key the default config does not have raises UserError with the CLI's message;
  values are checked by `train` before anything is built."""
  cfg = defaults.get_config()
  known = _flat(cfg)
  given = {} if config is None else _flat(config if isinstance(config, ml_collections.ConfigDict)
                                           else ml_collections.ConfigDict(dict(config)))
  for key, value in [*given.items(), *(overrides or {}).items()]:
    if key not in known:
      raise _unknown_key(key)
    *parents, leaf = key.split(".")
    node = cfg
    for part in parents:
      node = node[part]
    node[leaf] = value
  return cfg


def default_workdir(cfg) -> str:
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  return os.path.join("runs", f"{cfg.env.name.replace('/', '_')}-{cfg.scheduler}-{stamp}")


def _paths(workdir: str) -> dict[str, str]:
  join = lambda *p: os.path.join(workdir, *p)
  return {"workdir": workdir, "config": join("config.json"), "summary": join("summary.json"),
          "metrics": join("metrics.jsonl"), "checkpoints": join("checkpoints"), "tensorboard": join("tb"),
          "trace": join("trace.json"), "learning_curve": join("plots", "learning_curve.png"),
          "timeline": join("plots", "timeline.png")}


def train(config: ml_collections.ConfigDict | Mapping | None = None, workdir: str | None = None, *,
          overrides: Mapping[str, Any] | None = None, progress: bool = True, launch_time: float | None = None,
          log: Callable[[str], None] = print) -> Summary:
  """Trains `config` (see `make_config`) in `workdir` (default: runs/<env>-<scheduler>-<time>) and
  returns its Summary. With config.resume the run continues from the workdir's last checkpoint."""
  launch_time = launch_time or time.time()
  cfg = make_config(config, overrides)
  if cfg.resume and not workdir:
    raise UserError("resume=True continues the run in its workdir; pass workdir=<the run's directory>")
  from ebrl import interrupts, runtime  # pylint: disable=g-import-not-at-top
  from ebrl.trainer import Trainer  # pylint: disable=g-import-not-at-top

  runtime.limit_xla_threads()  # No effect once JAX has started (a notebook that used it already).
  runtime.enable_compilation_cache()
  trainer = Trainer(cfg, workdir or default_workdir(cfg), launch_time=launch_time, progress=progress)
  log(f"training {cfg.env.name} ({cfg.policy.name}, {cfg.scheduler}) in {trainer.workdir}")
  with interrupts.stop_on_signals(trainer.stop_requested):
    try:
      trainer.train()
    except KeyboardInterrupt:  # Only where no signal handler could be installed.
      log("interrupted; saving a checkpoint and the summary")
    summary = trainer.finish()
  return Summary(summary, _paths(trainer.workdir))
