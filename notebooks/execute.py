"""Executes a notebook top to bottom in a fresh kernel and fails on the first cell that errors.

  python notebooks/execute.py notebooks/quickstart.ipynb [--cell_timeout=600] [--workdir=DIR]

CI runs the quickstart this way. The notebook runs in `--workdir` (default: a
new temporary directory, so its runs/ and plots land outside the checkout) and
its outputs are never written back: the committed notebook holds no outputs.
The executed copy goes to <workdir>/executed.ipynb for a look after a failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import nbclient
import nbformat


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("notebook")
  parser.add_argument("--cell_timeout", type=int, default=600, help="Seconds a cell may run.")
  parser.add_argument("--workdir", default=None, help="Directory the notebook runs in.")
  args = parser.parse_args()
  nb = nbformat.read(args.notebook, as_version=4)
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
