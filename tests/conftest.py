"""Shared test setup: JAX's persistent compilation cache, the `egl` marker, small fixtures.

Compiles dominate test time on CPU, so every test process reuses compiled
executables from .jax_cache/ (ignored by git) across runs.

Pixel tests carry `@pytest.mark.egl`: on a machine without libEGL they are
skipped, so the suite still runs there. CI sets EBRL_REQUIRE_EGL=1, under which
they run regardless: a CI image that lost libEGL then fails them instead of
quietly skipping every pixel test.
"""

from __future__ import annotations

import ctypes.util
import functools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.setdefault("EBRL_JAX_CACHE", os.path.join(ROOT, ".jax_cache"))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from ebrl import runtime  # pylint: disable=g-import-not-at-top

# As every launch does on a machine of a few cores: XLA's CPU compute on the calling thread, not a
# pool that spins between calls beside the simulators and the subprocesses tests start.
runtime.limit_xla_threads()
# Tests check what programs compute, not how fast XLA's code for them runs, and nearly all of a test's
# time on CPU is compiling tiny programs: LLVM's expensive passes off cut that by ~40% (tests/policies/test_vla.py
# and test_offpolicy_reference.py from a cold cache: 142 s -> 84 s). Both sides of every equality a test
# checks compile under the same flags; the environment carries them to the processes tests start.
COMPILE_FAST_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + COMPILE_FAST_FLAGS).strip()

import jax  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top

from sim_adapters import make_adapter  # pylint: disable=g-import-not-at-top

# Every compile of 0.1 s or more is kept, here and in the processes tests start (ebrl.runtime leaves
# JAX's own variable alone): most tests compile programs of the same tiny shapes.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
jax.config.update("jax_compilation_cache_dir", CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))


REQUIRE_EGL = "EBRL_REQUIRE_EGL"


@functools.cache
def _has_library(name: str) -> bool:
  return bool(ctypes.util.find_library(name))


def egl_skip_reason(alternatives: tuple[str, ...] = ()) -> str | None:
  """Why an `egl` test is skipped here, or None when it runs.

  It runs when libEGL (or one of the `alternatives`, e.g. "OSMesa") is found,
  and always when EBRL_REQUIRE_EGL=1.
  """
  libraries = ("EGL",) + tuple(alternatives)
  if os.environ.get(REQUIRE_EGL) == "1" or any(_has_library(name) for name in libraries):
    return None
  names = " or ".join(f"lib{name}" for name in libraries)
  return f"no {names} on this machine (apt install libegl1 libgl1-mesa-dri; {REQUIRE_EGL}=1 runs it anyway)"


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: takes more than ~20 s; run with -m slow")
  config.addinivalue_line("markers", "egl(*alternatives): renders through libEGL (or an alternative library such as "
                          "'OSMesa'); skipped without it unless EBRL_REQUIRE_EGL=1")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: Bazel's test runs have no xdist.
def pytest_xdist_auto_num_workers(config):
  """`-n auto` (README's test command): a worker per core, at most 4. Each worker compiles its own
  programs and some tests start training processes of their own; more workers than cores only
  contend, and beyond 4 they mostly add memory."""
  del config
  return max(1, min(4, len(os.sched_getaffinity(0))))


def pytest_collection_modifyitems(config, items):
  del config
  for item in items:
    marker = item.get_closest_marker("egl")
    if marker is not None and (reason := egl_skip_reason(marker.args)):
      item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def make():
  """make_adapter, closing every adapter it built when the test ends."""
  made = []

  def _make(name, num_envs, **kwargs):
    adapter = make_adapter(name, num_envs, **kwargs)
    made.append(adapter)
    return adapter

  yield _make
  for adapter in made:
    adapter.close()
