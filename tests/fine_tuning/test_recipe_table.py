"""README.md's table of the fine-tuning recipe says what launch/configs/finetune.py sets.

Users copy the recipe's values from the README into their own configs and read the measured figures
in BENCHMARKS.md against it; a value changed in the config but not in the table (or the reverse)
would make both wrong without anything failing. So every value in the table's "recipe" column is
read back and compared with the config, and every key the config sets away from the defaults must
be in the table.
"""

from __future__ import annotations

import math
import re

import markdown_tables
from ebrl import defaults
from launch.configs import finetune

HEADER = "| key | recipe | default | why |"


def _rows() -> list[tuple[list[str], list[str]]]:
  """(dotted keys, recipe values) per row; a key without a section takes the row's first key's."""
  rows = []
  for line in markdown_tables.table("README.md", HEADER)[2:]:
    key_cell, recipe_cell = markdown_tables.cells(line)[:2]
    keys = re.findall(r"`([^`]+)`", key_cell)
    section = keys[0].rpartition(".")[0]
    keys = [k if "." in k or not section else f"{section}.{k}" for k in keys]
    values = [v.strip() for v in re.split(r",\s+(?![^()]*\))", recipe_cell.strip())]  # Not inside a tuple.
    assert len(keys) == len(values), f"README row {key_cell.strip()!r}: {len(keys)} keys, {len(values)} values"
    rows.append((keys, values))
  return rows


def _parse(value: str):
  value = value.strip("`")
  if value in ("True", "False"):
    return value == "True"
  if value == '""':
    return ""
  if value.startswith("(") and value.endswith(")"):  # Layer sizes: "(256, 256)", "()".
    return tuple(int(v) for v in value[1:-1].split(",") if v.strip())
  if value.startswith("log "):
    return math.log(float(value[4:]))
  try:
    return float(value.replace(",", ""))
  except ValueError:
    return value


def test_every_recipe_value_in_the_readme_table_is_the_config_value():
  recipe = defaults.flatten(finetune.get_config())
  wrong = []
  for keys, values in _rows():
    for key, text in zip(keys, values):
      want, got = _parse(text), recipe[key]
      got = tuple(got) if isinstance(got, list) else got
      same = (math.isclose(float(got), want, rel_tol=1e-6) if isinstance(want, float) and not isinstance(got, bool)
              else got == want)
      if not same:
        wrong.append(f"{key}: README {text}, config {got!r}")
  assert not wrong, wrong


def test_every_key_the_recipe_changes_is_in_the_readme_table():
  recipe, base = defaults.flatten(finetune.get_config()), defaults.flatten(defaults.get_config())
  changed = [key for key, value in recipe.items() if value != base[key]]
  documented = {key for keys, _ in _rows() for key in keys}
  assert changed and not set(changed) - documented, sorted(set(changed) - documented)
