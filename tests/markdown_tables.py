"""Reads a table out of a Markdown file, for the tests that hold the docs to the code.

Why one reader: README.md and docs/ARCHITECTURE.md carry tables that tests compare with the tree and
with configs; each test finding "its" table its own way would let two of them disagree on where a
table ends (the first line that is not a row).
"""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def table(path: str, header: str) -> list[str]:
  """The lines of the table in `path` (relative to the checkout) whose first line starts with `header`:
  the header, the separator and every row up to the first line that does not start with "|"."""
  text = open(os.path.join(ROOT, path)).read()
  start = text.find(header)
  if start < 0:
    raise ValueError(f"{path} has no table with the header {header!r}")
  lines = []
  for line in text[start:].splitlines():
    if not line.startswith("|"):
      break
    lines.append(line)
  return lines


def cells(row: str) -> list[str]:
  """The cells of one row, stripped ("| a | b |" -> ["a", "b"])."""
  return [c.strip() for c in row.strip().strip("|").split("|")]
