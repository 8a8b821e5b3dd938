"""Executes a notebook top to bottom in a fresh kernel and fails on the first cell that errors.

  python notebooks/execute.py notebooks/quickstart.ipynb [--cell_timeout=600] [--workdir=DIR]
      [--set NAME=VALUE ...]

CI runs the quickstart this way. The notebook runs in `--workdir` (default: a
new temporary directory, so its runs/ and plots land outside the checkout) and
its outputs are never written back: the committed notebook holds no outputs.
The executed copy goes to <workdir>/executed.ipynb for a look after a failure.

`--set NAME=VALUE` (a Python literal) runs the notebook with another value of a
top-level setting: a cell assigning it is inserted right after the first cell
that assigns NAME, as papermill's injected parameters are. CI shortens the
quickstart's training this way; that the default run learns is the test
suite's check (tests/end_to_end/test_learning.py), every cell running against
the API as it is is this one's.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import tempfile
import time

import nbclient
import nbformat


def _assigns(source: str, name: str) -> bool:
  try:
    body = ast.parse(source).body
  except SyntaxError:  # IPython magics: not a cell that sets a plain Python name.
    return False
  return any(isinstance(node, (ast.Assign, ast.AnnAssign)) and
             any(isinstance(t, ast.Name) and t.id == name
                 for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))
             for node in body)


def set_values(nb: nbformat.NotebookNode, settings: list[str]) -> None:
  """Inserts `NAME = VALUE` after the first code cell assigning NAME, for each NAME=VALUE.
  Raises ValueError naming a setting that is malformed or that no cell assigns."""
  for setting in settings:
    name, sep, value = setting.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
      raise ValueError(f"--set {setting!r}: expected NAME=VALUE, e.g. TOTAL_ENV_STEPS=20000")
    try:
      ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
      raise ValueError(f"--set {setting!r}: {value.strip()!r} is not a Python literal") from None
    at = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code" and _assigns(c.source, name)), None)
    if at is None:
      raise ValueError(f"--set {setting!r}: no code cell assigns {name}")
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(f"{name} = {value.strip()}  # notebooks/execute.py --set"))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("notebook")
  parser.add_argument("--cell_timeout", type=int, default=600, help="Seconds a cell may run.")
  parser.add_argument("--workdir", default=None, help="Directory the notebook runs in.")
  parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                      help="Run with another value of a top-level setting (a Python literal).")
  args = parser.parse_args()
  nb = nbformat.read(args.notebook, as_version=4)
  try:
    set_values(nb, args.set)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  workdir = args.workdir or tempfile.mkdtemp(prefix="ebrl-notebook-")
  os.makedirs(workdir, exist_ok=True)
  client = nbclient.NotebookClient(nb, timeout=args.cell_timeout, kernel_name="python3",
                                   resources={"metadata": {"path": workdir}})
  start = time.time()
  try:
    client.execute()
  except nbclient.exceptions.CellExecutionError as e:
    print(f"error: {args.notebook}: a cell failed:\n{e}", file=sys.stderr)
    return 1
  except nbclient.exceptions.CellTimeoutError as e:
    print(f"error: {args.notebook}: a cell ran past {args.cell_timeout} s: {e}", file=sys.stderr)
    return 1
  finally:
    nbformat.write(nb, os.path.join(workdir, "executed.ipynb"))
  print(f"{args.notebook}: {len(nb.cells)} cells ran in {time.time() - start:.0f} s (outputs in {workdir})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
