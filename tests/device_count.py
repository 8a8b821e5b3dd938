"""Start-up of the multi-device check scripts, which the tests run in fresh processes.

JAX fixes its device count when it starts, so 1-device and 4-device runs need
their own processes; each shares the test suite's compilation cache and checks
it really got the devices it was started for.
"""

from __future__ import annotations

import os

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(expected: int) -> int:
  """Enables the persistent compile cache, prints and checks the local device count."""
  cache = os.environ.get("EBRL_JAX_CACHE", os.path.join(ROOT, ".jax_cache"))
  jax.config.update("jax_compilation_cache_dir", cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
  count = jax.local_device_count()
  print(f"local_device_count={count}")
  assert count == expected, (count, expected)
  return count
