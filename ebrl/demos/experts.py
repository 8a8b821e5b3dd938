"""MetaWorld's scripted experts (the `metaworld` package's `Sawyer*V3Policy`), one per task.

Why here and not in policies/: an expert is a hand-written NumPy controller with no params, read
only when demonstrations are recorded. It acts on one goal-observable 39-value observation (the
adapters run MetaWorld goal-observable), so `ExpertActor` calls each env's expert on its row.
Which class serves which task is the package's own table (`ENV_POLICY_MAP`, keyed by MetaWorld's
names, `peg-insert-side-v3` for EnvPool's `PegInsertSide-v3`).
"""

from __future__ import annotations

import re
import warnings
from typing import Sequence

import numpy as np

from ebrl.errors import UserError

EXPERT_PACKAGE = "metaworld"


def metaworld_name(task: str) -> str:
  """MetaWorld's name of an EnvPool task: "PegInsertSide-v3" -> "peg-insert-side-v3"."""
  return re.sub(r"(?<!^)(?=[A-Z])", "-", task).lower()


def _policy_map() -> dict:
  try:
    from metaworld import policies  # pylint: disable=g-import-not-at-top  # Loads every MetaWorld env class.
  except ImportError as e:
    raise UserError(f"the MetaWorld experts need the metaworld package (pip install -r requirements.txt): "
                    f"{e}") from None
  return policies.ENV_POLICY_MAP


def expert_version() -> str:
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  return metadata.version(EXPERT_PACKAGE)


def expert_classes(tasks: Sequence[str]) -> dict[str, type]:
  """{task: its expert's class}; UserError (one line) naming a task the package has no expert for."""
  table = _policy_map()
  out = {}
  for task in tasks:
    cls = table.get(metaworld_name(task))
    if cls is None:
      raise UserError(f"the metaworld package has no expert for task '{task}' ('{metaworld_name(task)}')")
    out[task] = cls
  return out


class ExpertActor:
  """The experts of a task list, acting for a batch of envs whose task ids are given."""

  def __init__(self, tasks: Sequence[str]):
    classes = expert_classes(tasks)
    self.experts = [classes[t]() for t in tasks]
    self.class_names = {t: classes[t].__name__ for t in tasks}

  def act(self, states: np.ndarray, task_ids: np.ndarray) -> np.ndarray:
    """float32 [n, 4]: each row's expert action on its state (float64, as the experts compute)."""
    states = np.asarray(states, np.float64)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # The experts warn whenever a gain exceeds the action bounds.
      return np.stack([self.experts[k].get_action(s) for s, k in zip(states, task_ids.tolist())]).astype(np.float32)
