"""The Python API: configure, train, evaluate, bench and profile from a notebook or a script.

  import ebrl
  summary = ebrl.train(overrides={"total_env_steps": 100_000})
  summary["final_success_rate"], summary.paths["learning_curve"]
  ebrl.evaluate(summary.workdir, episodes=16)["success_rate"]
  ebrl.bench(schedulers=("sync", "ebrl"), seconds=10)["ratios"]["ebrl_over_sync"]

`python -m launch.{train,eval,bench,profile}` are thin absl wrappers over these
functions; their keyword arguments are the launchers' flag names. Bad input
raises `ebrl.UserError` carrying the one-line message the CLI prints (which
prints "error: <message>" and exits 2), before anything is built or compiled.
A notebook's stop button (SIGINT to the kernel) asks a training run to stop at
its next update, as Ctrl-C does on the command line: a checkpoint and
summary.json are written and `train` returns the summary. A second press stops
at once with the kernel's KeyboardInterrupt (the last checkpoint is kept),
where the command line's second Ctrl-C ends the process.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from typing import Any, Callable, Mapping, Sequence

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
  known = defaults.flatten(cfg)
  given = {} if config is None else defaults.flatten(config if isinstance(config, ml_collections.ConfigDict)
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
  env = cfg.env.name.replace("/", "_").replace(",", "+").replace(" ", "")  # A task list: MT:Reach-v3+Push-v3.
  return os.path.join("runs", f"{env}-{cfg.scheduler}-{stamp}")


def _paths(workdir: str) -> dict[str, str]:
  """Where a run's outputs are; a multi-task run's per-task bar chart too (`success_by_task`)."""
  join = lambda *p: os.path.join(workdir, *p)
  paths = {"workdir": workdir, "config": join("config.json"), "summary": join("summary.json"),
           "metrics": join("metrics.jsonl"), "checkpoints": join("checkpoints"), "tensorboard": join("tb"),
           "trace": join("trace.json"), "learning_curve": join("plots", "learning_curve.png"),
           "timeline": join("plots", "timeline.png")}
  if os.path.exists(join("plots", "success_by_task.png")):
    paths["success_by_task"] = join("plots", "success_by_task.png")
  return paths


def train(config: ml_collections.ConfigDict | Mapping | None = None, workdir: str | None = None, *,
          overrides: Mapping[str, Any] | None = None, progress: bool = True, launch_time: float | None = None,
          log: Callable[[str], None] = print, second_interrupt: str = "previous",
          coordinator_address: str | None = None, num_processes: int | None = None,
          process_id: int | None = None, local_device_ids: Sequence[int] | None = None,
          coordinator_bind: str | None = None) -> Summary:
  """Trains `config` (see `make_config`) in `workdir` (default: runs/<env>-<scheduler>-<time>) and
  returns its Summary. With config.resume the run continues from the workdir's last checkpoint.

  A run over several processes: every process calls it with the same config and workdir and
  `coordinator_address`, `num_processes` and its own `process_id` (the launchers' flags of the same
  names; README "Several processes and hosts"; `coordinator_bind` as --coordinator_bind), before
  anything in the process has used JAX; a
  process that joined through `jax.distributed.initialize` itself needs none of them.
  The first SIGINT/SIGTERM stops the run at its next update (checkpoint and summary written); a
  second has the effect of the handler there before (second_interrupt="previous": in a notebook or
  a script, KeyboardInterrupt) or ends the process ("default": the command line's).

  Every way out - the summary, an error, a second interrupt - releases what the run holds: its
  learner process and shared memory, env pools, open files."""
  if second_interrupt not in ("default", "previous"):
    raise UserError(f"second_interrupt={second_interrupt!r}; valid: 'default', 'previous'")
  launch_time = launch_time or time.time()
  cfg = make_config(config, overrides)
  if cfg.resume and not workdir:
    raise UserError("resume=True continues the run in its workdir; pass workdir=<the run's directory>")
  from ebrl import distributed, interrupts, runtime  # pylint: disable=g-import-not-at-top
  from ebrl.process_group import joined  # pylint: disable=g-import-not-at-top
  from ebrl import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from ebrl.resources import gpu_sharing  # pylint: disable=g-import-not-at-top
  from ebrl.validation import check_processes, resolve  # pylint: disable=g-import-not-at-top

  # The config and the workdir first: nothing is started (no MPS daemon, no JAX backend) for a
  # request that cannot run, and the training stack is imported only for one that can (a mistake
  # is told in a second, not after the seconds JAX, MuJoCo and the plots take to import). The
  # checks that need the device count follow in the Trainer.
  run = resolve(cfg)
  identity = distributed.ProcessIdentity(coordinator_address, num_processes, process_id,
                                         tuple(local_device_ids) if local_device_ids is not None else None,
                                         coordinator_bind=coordinator_bind)
  if identity.given or local_device_ids is not None:
    distributed.initialize(identity)
  group = joined()
  run = check_processes(run, group.count, group.index)  # This process's share of a run over several.
  from ebrl.trainer import Trainer  # pylint: disable=g-import-not-at-top
  workdir = os.path.abspath(workdir or default_workdir(cfg))
  if group.count > 1:  # Process 0's: a default workdir's time stamp may differ between processes.
    workdir = group.gather_json(workdir)[0]
  if group.leader:  # Over several processes, process 0's (the Trainer tells the others).
    workdir_lib.prepare(workdir, run.config, run.outputs.resume)
  runtime.limit_xla_threads()  # No effect once JAX has started (a notebook that used it already).
  runtime.enable_compilation_cache()
  stop = threading.Event()
  # Signals from here on: a SIGTERM while the run is built (a calibration takes seconds) stops it too.
  with interrupts.stop_on_signals(stop, log=log, second=second_interrupt):
    gpu_sharing.begin(run)  # Before JAX's backend starts: an MPS daemon for stage processes on a GPU.
    try:
      trainer = Trainer(run, workdir, launch_time=launch_time, progress=progress, stop_requested=stop)
    except BaseException:
      gpu_sharing.abandon()
      raise
    log(f"training {cfg.env.name} ({cfg.policy.name}, {cfg.scheduler}) in {trainer.workdir}")
    try:
      try:
        trainer.train()
      except KeyboardInterrupt:
        if stop.is_set():  # A second interrupt: stop now, keep the last checkpoint.
          raise
        log("interrupted; saving a checkpoint and the summary")  # No handler could be installed here.
      summary = trainer.finish()  # A second interrupt during it is held until it is done.
    except BaseException as e:
      if trainer.watch is not None and isinstance(e, Exception) and not isinstance(e, UserError):
        lost = trainer.watch.lost(wait_s=5.0)  # A collective failed: is another process gone?
        if lost:
          trainer.watch.report(lost, f"a collective failed ({type(e).__name__})")  # Ends this process.
      trainer.abort()  # Releases everything; the last checkpoint on disk stays the run's.
      raise
  return Summary(summary, _paths(trainer.workdir))


def evaluate(checkpoint: str, env: str | None = None, *, episodes: int = 32, seed: int = 1_000_003,
             out: str | None = None, actions: str = "sample") -> dict:
  """Evaluates the newest checkpoint of a run (`checkpoint` is its workdir, e.g. `summary.workdir`) or
  the params of a launch.sft --out directory on `env` (default: the env it trained on; the same task
  on the other backend works too), one episode in each of `episodes` envs, sampling as in training
  (actions="sample") or with the policy's deterministic mean action (actions="mean"); the default
  seed is the held-out one (ebrl.evaluation.HELD_OUT_SEED). Returns env, trained_on, source, actions,
  episodes, episode_return, episode_length, success_rate, success_ci95 (its 95% Wilson interval),
  per task on a multi-task env, and checkpoint_env_steps (`python -m launch.eval` prints the same as
  one JSON line)."""
  from ebrl import evaluation, runtime  # pylint: disable=g-import-not-at-top

  evaluation.check_args(episodes, seed, actions)
  runtime.limit_xla_threads()
  runtime.enable_compilation_cache()
  return evaluation.evaluate_run(checkpoint, env, episodes, seed, out, actions)


def bench(config: ml_collections.ConfigDict | Mapping | None = None, *, overrides: Mapping[str, Any] | None = None,
          env: str = "MetaWorld/Reach-v3", policy: str = "mlp", schedulers: Sequence[str] = ("random", "sync"),
          seconds: float = 30.0, warmup_updates: int = 3, num_envs: int | None = None,
          resources: Sequence[str] = (), placements: Sequence[str] = (), rounds: int = 1,
          straggler_fraction: float = 0.0, straggler_slowdown: float = 1.0, out: str | None = None,
          timeline: str | None = None, workdir: str | None = None, log: Callable[[str], None] = print) -> dict:
  """Runs each of `schedulers` in turn on the same envs and cores for `seconds` after `warmup_updates`
  untimed updates, and returns what `python -m launch.bench` writes to bench.json: per-scheduler
  results (e2e_env_steps_per_s, stage_busy, cpu_us_per_env_step, ...) and `ratios` such as
  ebrl_over_sync (ebrl/benchmark.py documents every field). `config`/`overrides` as for `train`;
  bench.json and the timelines PNG are written only when `out` (or `timeline`) is given."""
  from ebrl import runtime  # pylint: disable=g-import-not-at-top
  from ebrl.benchmark import BenchSpec, run_bench

  spec = BenchSpec(env=env, policy=policy, schedulers=tuple(schedulers), seconds=seconds,
                   warmup_updates=warmup_updates, num_envs=num_envs, resources=tuple(resources),
                   placements=tuple(placements), rounds=rounds, straggler_fraction=straggler_fraction,
                   straggler_slowdown=straggler_slowdown, out=out, timeline=timeline, workdir=workdir)
  spec.check()
  cfg = make_config(config, overrides)
  runtime.limit_xla_threads()
  return run_bench(spec, cfg, log=log)


def profile(config: ml_collections.ConfigDict | Mapping | None = None, *, overrides: Mapping[str, Any] | None = None,
            env: str = "MetaWorld/Reach-v3", policy: str = "mlp", num_envs: int | None = None,
            seconds: float = 0.5, out: str | None = None, log: Callable[[str], None] = print) -> dict:
  """Measures every stage of `env` with `policy` on this machine and returns what `python -m
  launch.profile` writes: the stage costs, the plan resources=auto would run, the work-conserving
  bound and the bottleneck (ebrl/profiling.py). Written to `out` when given; a run plans from that
  file with quotas.profile=<out>."""
  from ebrl import profiling, runtime  # pylint: disable=g-import-not-at-top

  profiling.check(seconds, num_envs)
  cfg = make_config(config, overrides)
  runtime.limit_xla_threads()
  return profiling.run_profile(cfg, env=env, policy=policy, num_envs=num_envs, seconds=seconds, out=out, log=log)
