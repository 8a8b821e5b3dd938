"""Shared launcher plumbing: one-line errors with exit code 2, no tracebacks.

absl's own flag parser prints usage and exits 1 on a bad flag; users of these
launchers get a single line naming the bad value and exit code 2 instead, for
flag errors and for every UserError raised while the run is set up.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from absl import app, flags, logging

from ebrl.errors import UserError


def fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def _one_line(e: Exception) -> str:
  text = str(e)
  while len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
    text = text[1:-1]
  return " ".join(text.replace("\\n", "\n").replace("\\'", "'").split())


def define_config(name: str = "config", default: str | None = None, help_text: str = "Run config file."):
  """config_flags.DEFINE_config_file, with a mistyped override key as a one-line error.

  config_flags resolves --config.<key> overrides while the flag is defined (at
  import), so an unknown key raises there rather than in the flag parser.
  """
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  default = default or os.path.join(os.path.dirname(__file__), "configs", "default.py")
  try:
    return config_flags.DEFINE_config_file(name, default, help_text)
  except (KeyError, AttributeError) as e:
    fail(f"unknown config key: {_one_line(e)}")


def config_value(holder):
  """The parsed config, or a one-line error when its file cannot be loaded."""
  cfg = holder.value
  try:
    cfg.keys()  # config_flags defers a load failure to the first attribute access.
  except OSError as e:
    first = str(e).splitlines()
    missing = next((l.strip() for l in first if "Errno" in l), first[0] if first else "")
    fail(f"cannot load --{holder.name}: {missing}")
  return cfg


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(str(e).splitlines()[0])
  except (KeyError, AttributeError, ValueError, TypeError) as e:  # Raised by config overrides.
    fail(_one_line(e))
  return []


def enable_compilation_cache() -> None:
  """JAX's persistent compilation cache: a second launch skips most compiles."""
  import jax

  path = os.environ.get("EBRL_JAX_CACHE", os.path.expanduser("~/.cache/ebrl/jax"))
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def limit_xla_threads(small_machine_cores: int = 4) -> None:
  """On a machine of a few cores, XLA's CPU compute runs on the calling thread.

  XLA's Eigen pool takes a thread per core and spins between calls; next to a
  simulator that needs every core, the policy's small matmuls gain nothing from
  it and the spinning takes CPU from the simulator (MT10, 2 cores: 147 -> 138 µs
  of CPU per env step). Must run before JAX starts its backend; a user's own
  XLA_FLAGS setting of it wins.
  """
  flags_now = os.environ.get("XLA_FLAGS", "")
  if len(os.sched_getaffinity(0)) <= small_machine_cores and "xla_cpu_multi_thread_eigen" not in flags_now:
    os.environ["XLA_FLAGS"] = (flags_now + " --xla_cpu_multi_thread_eigen=false").strip()


def run(main: Callable[[list[str]], None]) -> None:
  """app.run with our flag parser and UserError -> one line, exit 2."""
  limit_xla_threads()

  def guarded(argv):
    logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO.
    try:
      main(argv)
    except UserError as e:
      fail(str(e))

  app.run(guarded, flags_parser=_parse_flags)
