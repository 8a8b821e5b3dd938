"""docs/ARCHITECTURE.md and README.md describe the tree that is there.

The file map is what a newcomer reads first; a renamed or new module that the
map does not name, or a README table that drifted from the architecture doc,
fails here rather than misleading a reader.
"""

from __future__ import annotations

import os
import re

import markdown_tables

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("ebrl", "sim_adapters", "policies", "launch")


def _file_map(path: str) -> list[str]:
  return markdown_tables.table(path, "| path | what lives there |")


def _paths(rows: list[str]) -> list[str]:
  """Every `path` named in the first column of the map's rows."""
  out = []
  for row in rows[2:]:
    first = markdown_tables.cells(row)[0]
    out += re.findall(r"`([^`]+)`", first)
  return out


def test_readme_layout_table_is_the_architecture_file_map():
  assert _file_map("README.md") == _file_map("docs/ARCHITECTURE.md")


def test_every_path_on_the_map_exists():
  missing = [p for p in _paths(_file_map("docs/ARCHITECTURE.md")) if not os.path.exists(os.path.join(ROOT, p))]
  assert not missing, missing


def test_every_module_is_on_the_map():
  """A module is covered when the map names it or a folder above it."""
  named = [p.rstrip("/") for p in _paths(_file_map("docs/ARCHITECTURE.md"))]
  uncovered = []
  for package in PACKAGES:
    for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
      for name in files:
        if not name.endswith(".py") or name == "__init__.py":
          continue
        rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
        if not any(rel == p or rel.startswith(p + "/") for p in named):
          uncovered.append(rel)
  assert not uncovered, f"modules the file map does not name: {uncovered}"


def test_no_docstring_cites_a_design_file_outside_the_project():
  outside = "DESIGN" + ".md"  # Spelled apart so this file does not cite it.
  cited = []
  for package in PACKAGES + ("tests",):
    for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
      for name in files:
        if name.endswith(".py"):
          path = os.path.join(dirpath, name)
          if outside in open(path).read():
            cited.append(os.path.relpath(path, ROOT))
  assert not cited, cited
