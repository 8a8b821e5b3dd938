"""Shared test setup: JAX's persistent compilation cache and small shared fixtures.

Compiles dominate test time on CPU, so every test process reuses compiled
executables from .jax_cache/ (ignored by git) across runs.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, ".jax_cache")
os.environ.setdefault("EBRL_JAX_CACHE", CACHE)
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import jax  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top

from sim_adapters import make_adapter  # pylint: disable=g-import-not-at-top

jax.config.update("jax_compilation_cache_dir", CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: takes more than ~20 s; run with -m slow")


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
