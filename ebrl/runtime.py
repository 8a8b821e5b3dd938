"""Process-wide JAX settings every entry point (CLI or Python API) applies before it builds a run."""

from __future__ import annotations

import datetime
import os
import platform


def enable_compilation_cache() -> None:
  """JAX's persistent compilation cache: a second launch skips most compiles.

  Not in a run over several processes: on CPU (gloo, this JAX) a learner update read back from the
  cache waits forever in its first collective (a fresh compile of the same update runs; measured
  with two processes on one machine: the second launch of the same run hung in its first update).
  """
  import jax
  from ebrl.process_group import joined  # pylint: disable=g-import-not-at-top

  if joined().count > 1:
    return

  path = os.environ.get("EBRL_JAX_CACHE", os.path.expanduser("~/.cache/ebrl/jax"))
  jax.config.update("jax_compilation_cache_dir", path)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:  # JAX's own variable wins.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def limit_xla_threads(small_machine_cores: int = 4) -> None:
  """On a machine of a few cores, XLA's CPU compute runs on the calling thread.

  XLA's Eigen pool takes a thread per core and spins between calls; next to a
  simulator that needs every core, the policy's small matmuls gain nothing from
  it and the spinning takes CPU from the simulator (BENCHMARKS.md measures it on
  MT10). Must run before JAX starts its backend; a user's own
  XLA_FLAGS setting of it wins.
  """
  flags_now = os.environ.get("XLA_FLAGS", "")
  if len(os.sched_getaffinity(0)) <= small_machine_cores and "xla_cpu_multi_thread_eigen" not in flags_now:
    os.environ["XLA_FLAGS"] = (flags_now + " --xla_cpu_multi_thread_eigen=false").strip()


def machine_info() -> dict:
  """The machine a benchmark ran on, for its JSON."""
  import jax  # pylint: disable=g-import-not-at-top

  cpu = platform.processor()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
  except OSError:
    pass
  return {"cpu": cpu, "usable_cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
          "jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
          "date": datetime.datetime.now().isoformat(timespec="seconds")}
