"""Profiles every stage on this machine and prints the plan, the bound and the bottleneck.

  python -m launch.profile --env=MetaWorld/MT10 --policy=mlp --num_envs=160 --out=profile.json

A thin absl wrapper over `ebrl.profile` (ebrl/profiling.py, which documents
profile.json). Pass its output to a run with --config.quotas.profile=profile.json.
"""

from __future__ import annotations

from absl import flags

from launch import common

_ENV = flags.DEFINE_string("env", "MetaWorld/Reach-v3", "Env name.")
_POLICY = flags.DEFINE_string("policy", "mlp", "Policy name.")
_NUM_ENVS = flags.DEFINE_integer("num_envs", None, "Envs (default: the config's).")
_OUT = flags.DEFINE_string("out", "profile.json", "Where to write the profile and plan.")
_SECONDS = flags.DEFINE_float("seconds", 0.5, "Timed seconds per measurement point.")
_CONFIG = common.define_config(help_text="Base run config; --config.<key>=<value> overrides apply.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}; use --<flag>=<value> and --config.<key>=<value> flags")
  from ebrl import profiling  # pylint: disable=g-import-not-at-top

  profiling.check(_SECONDS.value, _NUM_ENVS.value)  # Before the config file's values are read.
  profiling.run_profile(common.config_value(_CONFIG), env=_ENV.value, policy=_POLICY.value,
                        num_envs=_NUM_ENVS.value, seconds=_SECONDS.value, out=_OUT.value)


def cli() -> None:
  """The `ebrl-profile` console command (pyproject.toml): the same flags as `python -m launch.profile`."""
  common.run(main)


if __name__ == "__main__":
  cli()
