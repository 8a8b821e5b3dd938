"""Runs one test file under pytest inside `bazel test` (the main of every py_test in tests/BUILD).

The file runs with the project's pytest settings (pyproject.toml: slow tests
deselected) and JAX's compilation cache in the test's own temporary directory,
since the runfiles tree Bazel builds is read-only.
"""

from __future__ import annotations

import os
import sys

import pytest

if __name__ == "__main__":
  os.environ.setdefault("EBRL_JAX_CACHE", os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "jax-cache"))
  sys.exit(pytest.main([*sys.argv[1:], "-q", "-p", "no:cacheprovider", "--rootdir", os.getcwd()]))
