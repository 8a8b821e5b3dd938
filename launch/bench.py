"""Side-by-side throughput benchmark: every named scheduler, same envs, same cores, one run.

  python -m launch.bench --env=MetaWorld/Reach-v3 --policy=mlp \
      --schedulers=random,sync --seconds=30 --out=bench.json

A thin absl wrapper over `ebrl.bench` (ebrl/benchmark.py, which documents
what is timed and what bench.json reports). Every flag is checked, and every
output path proved writable, before the first scheduler runs.

  python -m launch.bench --processes=1,2 --schedulers=sync,ebrl --num_envs=32 --seconds=20 --rounds=2

compares instead one run over 1 process against the same run over 2 processes
(ebrl/process_bench.py: each a real training run through launch.multiprocess).
"""

from __future__ import annotations

from absl import flags

from launch import common

_ENV = flags.DEFINE_string("env", "MetaWorld/Reach-v3", "Env name.")
_POLICY = flags.DEFINE_string("policy", "mlp", "Policy name.")
_SCHEDULERS = flags.DEFINE_list("schedulers", ["random", "sync"], "Schedulers to compare, in run order.")
_SECONDS = flags.DEFINE_float("seconds", 30.0, "Timed seconds per scheduler.")
_WARMUP = flags.DEFINE_integer("warmup_updates", 3, "Untimed updates before the window opens.")
_NUM_ENVS = flags.DEFINE_integer("num_envs", None, "Envs (default: the config's).")
_OUT = flags.DEFINE_string("out", "bench.json", "Where to write the JSON results.")
_STRAGGLER_FRACTION = flags.DEFINE_float("straggler_fraction", 0.0, "Fraction of envs made slow.")
_STRAGGLER_SLOWDOWN = flags.DEFINE_float("straggler_slowdown", 1.0, "How many times longer a slow env's step takes.")
_RESOURCES = flags.DEFINE_list(
    "resources", [], "Resource modes to run the ebrl scheduler under, each as its own entry "
    "'ebrl+<mode>' (e.g. naive,auto); empty = the config's resources only.")
_PLACEMENTS = flags.DEFINE_list(
    "placements", [], "Placements of the ebrl learner (threads, processes, auto), each as its own entry "
    "'ebrl[+<mode>]@<placement>'; empty = the config's placement only.")
_ROUNDS = flags.DEFINE_integer(
    "rounds", 1, "Timed runs of every entry, interleaved (A B A B ...): slow drifts of the machine (CPU stolen "
    "by the hypervisor) hit every entry alike; rates are over all rounds, each round's ratio is printed.")
_TIMELINE = flags.DEFINE_string("timeline", None, "PNG with every scheduler's stage timeline (default: beside --out).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Keep each scheduler's run outputs (summary.json, metrics.jsonl, "
                               "trace.json) in <workdir>/<scheduler> (default: a temporary directory, removed).")
_PROCESSES = flags.DEFINE_list(
    "processes", [], "Process counts to compare, each entry '<scheduler>@<n>p' a training run over n processes "
    "with the same --num_envs in all (ebrl/process_bench.py); empty = the schedulers in this process.")
_SLOW_SHARE = flags.DEFINE_float(
    "slow_share", 1.0, "With --processes: below 1, also each count above 1 with its last process running only this "
    "share of the time (a slow host; entry '<scheduler>@<n>p+slow').")
_CONFIG = common.define_config(help_text="Base run config; --config.<key>=<value> overrides apply to every scheduler.")
common.define_process_flags()


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}; use --<flag>=<value> and --config.<key>=<value> flags")
  if _PROCESSES.value:
    _process_bench()
    return
  from ebrl.benchmark import BenchSpec, run_bench  # pylint: disable=g-import-not-at-top

  spec = BenchSpec(env=_ENV.value, policy=_POLICY.value, schedulers=tuple(_SCHEDULERS.value), seconds=_SECONDS.value,
                   warmup_updates=_WARMUP.value, num_envs=_NUM_ENVS.value, resources=tuple(_RESOURCES.value),
                   placements=tuple(_PLACEMENTS.value), rounds=_ROUNDS.value,
                   straggler_fraction=_STRAGGLER_FRACTION.value, straggler_slowdown=_STRAGGLER_SLOWDOWN.value,
                   out=_OUT.value, timeline=_TIMELINE.value, workdir=_WORKDIR.value)
  spec.check()  # Before the config file's values are read.
  common.join_run(max_processes=1)
  run_bench(spec, common.config_value(_CONFIG), log=lambda line: print(line, flush=True))


def _process_bench() -> None:
  import os  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from ebrl import runtime  # pylint: disable=g-import-not-at-top
  from ebrl.process_bench import ProcessBenchSpec, config_flags, run_process_bench  # pylint: disable=g-import-not-at-top

  try:
    processes = tuple(int(n) for n in _PROCESSES.value)
  except ValueError:
    common.fail(f"--processes={','.join(_PROCESSES.value)} must be process counts, e.g. 1,2")
  spec = ProcessBenchSpec(env=_ENV.value, policy=_POLICY.value, schedulers=tuple(_SCHEDULERS.value),
                          processes=processes, num_envs=_NUM_ENVS.value or common.config_value(_CONFIG).num_envs,
                          seconds=_SECONDS.value, rounds=_ROUNDS.value, out=_OUT.value,
                          config_flags=config_flags(sys.argv[1:]), slow_share=_SLOW_SHARE.value)
  spec.check()
  common.check_output_file("out", spec.out)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  run_process_bench(spec, root, runtime.machine_info(), log=lambda line: print(line, flush=True))


def cli() -> None:
  """The `ebrl-bench` console command (pyproject.toml): the same flags as `python -m launch.bench`."""
  common.run(main)


if __name__ == "__main__":
  cli()
