"""notebooks/quickstart.ipynb: a valid notebook, committed without outputs, calling the API as it is.

CI executes it top to bottom (.ci/run: notebooks/execute.py); these checks run
in the default suite so a renamed API function or a committed output fails
here first, in seconds.
"""

from __future__ import annotations

import ast
import os

import nbformat

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
