"""notebooks/quickstart.ipynb: a valid notebook, committed without outputs, calling the API as it is.

CI executes it top to bottom (.ci/run: notebooks/execute.py); these checks run
in the default suite so a renamed API function or a committed output fails
here first, in seconds.
"""

from __future__ import annotations

import ast
import os
import re

import nbformat
import pytest

import ebrl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")


def _code_cells() -> list[str]:
  nb = nbformat.read(NOTEBOOK, as_version=4)
  return [c.source for c in nb.cells if c.cell_type == "code"]


def test_notebook_is_valid_and_has_no_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]


def test_first_cell_installs_only_in_colab():
  first = ast.parse(_code_cells()[0])
  guards = [n for n in ast.walk(first) if isinstance(n, ast.If)]
  assert guards and "google.colab" in ast.unparse(guards[0].test)
  assert "pip" in ast.unparse(guards[0]) and "install" in ast.unparse(guards[0])
  assert all(not isinstance(n, ast.Expr) or n in ast.walk(guards[0]) for n in first.body if isinstance(n, ast.Expr))


def test_every_ebrl_call_exists_and_takes_its_arguments():
  import inspect  # pylint: disable=g-import-not-at-top

  seen = set()
  for source in _code_cells():
    for node in ast.walk(ast.parse(source)):
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and isinstance(node.func.value, ast.Name) and node.func.value.id == "ebrl"):
        fn = getattr(ebrl, node.func.attr)  # AttributeError: the notebook calls what the API lacks.
        params = inspect.signature(fn).parameters
        for kw in node.keywords:
          assert kw.arg in params, f"ebrl.{node.func.attr} has no parameter {kw.arg}"
        seen.add(node.func.attr)
  assert {"train", "bench", "evaluate"} <= seen


def _execute_module():
  import importlib.util  # pylint: disable=g-import-not-at-top

  spec = importlib.util.spec_from_file_location("notebook_execute", os.path.join(ROOT, "notebooks", "execute.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_set_inserts_the_value_after_the_cell_that_assigns_it():
  execute = _execute_module()
  nb = nbformat.read(NOTEBOOK, as_version=4)
  before = [c.source for c in nb.cells]
  execute.set_values(nb, ["TOTAL_ENV_STEPS=20_000", "BENCH_SECONDS = 1.5"])
  at = next(i for i, source in enumerate(before) if "TOTAL_ENV_STEPS = " in source)
  assert [c.source.split("  #")[0] for c in nb.cells[at + 1:at + 3]] == ["BENCH_SECONDS = 1.5", "TOTAL_ENV_STEPS = 20_000"]
  assert [c.source for c in nb.cells[:at + 1] + nb.cells[at + 3:]] == before
  nbformat.validate(nb)
  scope = {}
  for cell in nb.cells[at + 1:at + 3]:
    exec(cell.source, scope)  # pylint: disable=exec-used
  assert scope["TOTAL_ENV_STEPS"] == 20_000 and scope["BENCH_SECONDS"] == 1.5


@pytest.mark.parametrize("setting,says", [
    ("TOTAL_STEPS=1", "no code cell assigns TOTAL_STEPS"),
    ("TOTAL_ENV_STEPS", "expected NAME=VALUE"),
    ("TOTAL_ENV_STEPS=os.system('x')", "is not a Python literal"),
])
def test_a_bad_set_is_named(setting, says):
  with pytest.raises(ValueError, match=re.escape(says)):
    _execute_module().set_values(nbformat.read(NOTEBOOK, as_version=4), [setting])


def test_what_ci_sets_the_notebook_assigns():
  """CI's `--set`s name the quickstart's settings (a renamed one fails here, not after the tests)."""
  lines = open(os.path.join(ROOT, ".ci", "run")).read().splitlines()
  line = next(l for l in lines if "python notebooks/execute.py" in l and not l.lstrip().startswith("#"))
  settings = re.findall(r"--set[ =](\S+)", line)
  assert settings
  _execute_module().set_values(nbformat.read(NOTEBOOK, as_version=4), settings)
