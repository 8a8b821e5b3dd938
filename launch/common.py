"""Shared launcher plumbing: one-line errors with exit code 2, no tracebacks.

absl's own flag parser prints usage and exits 1 on a bad flag; users of these
launchers get a single line naming the bad value and exit code 2 instead, for
flag errors and for every UserError raised while the run is set up.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from absl import app, flags

from ebrl.errors import UserError


def fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(str(e).splitlines()[0])
  except (KeyError, AttributeError, ValueError, TypeError) as e:  # Raised by config overrides.
    fail(str(e).strip("'\"").splitlines()[0])
  return []


def enable_compilation_cache() -> None:
  """JAX's persistent compilation cache: a second launch skips most compiles."""
  import jax

  path = os.environ.get("EBRL_JAX_CACHE", os.path.expanduser("~/.cache/ebrl/jax"))
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def run(main: Callable[[list[str]], None]) -> None:
  """app.run with our flag parser and UserError -> one line, exit 2."""

  def guarded(argv):
    try:
      main(argv)
    except UserError as e:
      fail(str(e))

  app.run(guarded, flags_parser=_parse_flags)
