"""Records MetaWorld expert demonstrations through EBRL's adapters, for supervised pre-training.

  python -m launch.demos --env=MetaWorld/MT10 --episodes_per_task=100 --out=demos/mt10
  python -m launch.demos --env=MetaWorld/Reach-v3 --episodes_per_task=50 --from_pixels --out=demos/reach-px

Each task's scripted expert (the metaworld package's Sawyer*V3Policy) acts on the observations a
run sees; --action_noise adds Gaussian noise to its actions for coverage. Successful episodes are
kept (--keep_failed keeps all); every episode counts in the expert's success per task, printed at
the end and kept in the manifest. The format, and how to read it shard by shard, is
ebrl/demos/__init__.py's; `ebrl.demos.open_demos(DIR)` reads it. The same flags and --seed write
the same bytes.
"""

from __future__ import annotations

from absl import flags

from launch import common

_ENV = flags.DEFINE_string("env", "MetaWorld/MT10", "MetaWorld/<Task>-v3, MetaWorld/MT10, MetaWorld/MT50 or "
                           "MetaWorld/MT:<task>,<task>.")
_EPISODES = flags.DEFINE_integer("episodes_per_task", 100, "Episodes recorded per task (kept or not).")
_OUT = flags.DEFINE_string("out", None, "Directory to write the demos to (manifest.json, shards/).")
_SEED = flags.DEFINE_integer("seed", 0, "Env seed (as a run's env seed) and noise seed.")
_ENVS = flags.DEFINE_integer("envs_per_task", 0, "Envs stepping each task at once (0: min(episodes_per_task, 10)).")
_NOISE = flags.DEFINE_float("action_noise", 0.0, "Std of Gaussian noise added to each expert action "
                            "(the executed action is recorded, clipped to the bounds).")
_KEEP_FAILED = flags.DEFINE_bool("keep_failed", False, "Keep failed episodes too (default: successful only).")
_MAX_STEPS = flags.DEFINE_integer("max_episode_steps", 0, "Episode length limit (0: the task's own, 500).")
_PIXELS = flags.DEFINE_bool("from_pixels", False, "Record the render stage's frames beside the state "
                            "(obs 'pixels'; single tasks).")
_RENDER_SIZE = flags.DEFINE_integer("render_size", 64, "Frame size with --from_pixels.")
_PER_SHARD = flags.DEFINE_integer("episodes_per_shard", 0, "Episodes per shard file (0: about 64 MiB of "
                                  "arrays each).")
_THREADS = flags.DEFINE_integer("num_threads", 0, "EnvPool worker threads (0: EnvPool's default; one per task "
                                "pool on multi-task envs).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace the demos already in --out.")
_QUIET = flags.DEFINE_bool("quiet", False, "No progress bar.")


def _table(manifest: dict) -> str:
  rows = [f"{'task':<28} {'success':>7} {'episodes':>8} {'kept':>5}"]
  for task, row in manifest["by_task"].items():
    rows.append(f"{task:<28} {row['expert_success']:>7.2f} {row['episodes']:>8} {row['kept']:>5}")
  return "\n".join(rows)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}; use --<flag>=<value> flags")
  from ebrl.demos import recorder  # pylint: disable=g-import-not-at-top

  req = recorder.RecordRequest(
      env=_ENV.value, episodes_per_task=_EPISODES.value, out=_OUT.value or "", seed=_SEED.value,
      envs_per_task=_ENVS.value, action_noise=_NOISE.value, keep_failed=_KEEP_FAILED.value,
      max_episode_steps=_MAX_STEPS.value, from_pixels=_PIXELS.value, render_size=_RENDER_SIZE.value,
      episodes_per_shard=_PER_SHARD.value, num_threads=_THREADS.value, overwrite=_OVERWRITE.value)
  result = recorder.record(req, progress=not _QUIET.value)
  m = result.manifest
  print(_table(m))
  attempted = sum(r["episodes"] for r in m["by_task"].values())
  print(f"{attempted} episodes, {result.env_steps} env steps in {result.loop_s:.0f} s of stepping "
        f"({result.env_steps_per_s:.0f} env steps/s; {result.wall_s:.0f} s with building the envs), "
        f"{m['episodes']} kept ({m['steps']} steps) in {len(m['shards'])} shard(s) under {req.out}")
  weak = [t for t, r in m["by_task"].items() if r["expert_success"] < 0.9]
  if weak:
    print(f"expert success below 0.9 on {len(weak)} task(s): {', '.join(weak)}")


def cli() -> None:
  """The `ebrl-demos` console command (pyproject.toml): the same flags as `python -m launch.demos`."""
  common.run(main)


if __name__ == "__main__":
  cli()
