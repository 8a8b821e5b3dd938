"""Warm starts: policy params from an earlier run or from pre-training on demonstrations.

`load_params(path, template)` reads the policy params out of
* an EBRL run directory (`<workdir>`, its `checkpoints/` or one `checkpoints/<step>`),
  as written by ebrl/checkpointing.py: an Orbax Composite item `state` holding the
  whole TrainState, of which only `params` is read (partial restore; the optimiser
  state of the earlier run is not needed and may have another layout), or
* a directory written by `save_params` (python -m launch.sft, ebrl/sft/): the params pytree
  itself in `<dir>/params`, with `<dir>/sft.json` describing how it was made.
The saved tree is checked against freshly initialised params first, so a wrong
policy or env gives one line naming the first mismatching leaf and both shapes
instead of an Orbax traceback. The critic's leaves (policies.base.CRITIC_MODULES) are
the exception: pre-training on demonstrations never trains a critic, so a run may
build a critic of another shape than the saved one (the vla's critic MLP from a
pre-training with a linear value head); the template's critic leaves that the saved
params lack or shape differently keep their fresh init, and saved critic leaves the
policy has no place for are not read.

Pre-training itself (`launch.sft`, `ebrl/sft/`) reads demonstrations recorded by
`launch.demos` (`ebrl/demos/`) and saves its params here.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from flax import traverse_util

from policies.base import is_critic_path, key_name

Params = Any

PARAMS_DIR = "params"  # save_params: <dir>/params is the Orbax item.
BASE = "base"  # params[BASE]: frozen copies of params["net"] subtrees, under the same keys.
META_FILE = "bc.json"


# ----------------------------------------------------------------------------- params on disk


def _leaf_shapes(tree) -> dict[str, tuple[int, ...]]:
  """'net/actor/Dense_0/kernel' -> shape, for arrays and Orbax ArrayMetadata alike."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(key_name(k) for k in path): tuple(int(d) for d in getattr(leaf, "shape", np.shape(leaf)))
          for path, leaf in leaves}


def _item_dir(path: str) -> str:
  """The Orbax item directory that holds the params (or a TrainState with them) under `path`."""
  p = os.path.abspath(os.path.expanduser(path))
  if not os.path.isdir(p):
    raise ValueError(f"warm-start path '{path}' is not a directory; give an EBRL run directory, "
                     "one of its checkpoints, or a launch.sft --out directory")
  if os.path.isdir(os.path.join(p, "checkpoints")):
    p = os.path.join(p, "checkpoints")
  steps = sorted(int(d) for d in os.listdir(p) if d.isdigit() and os.path.isdir(os.path.join(p, d)))
  if steps:
    p = os.path.join(p, str(steps[-1]))  # The newest checkpoint.
  for sub in ("state", PARAMS_DIR):
    if os.path.isdir(os.path.join(p, sub)):
      return os.path.join(p, sub)
  if os.path.exists(os.path.join(p, "_METADATA")):
    return p
  raise ValueError(f"no Orbax params found under '{path}'; expected <workdir>/checkpoints/<step>/state "
                   f"(launch.train) or <dir>/{PARAMS_DIR} (launch.sft)")


def check_params_match(saved: dict[str, tuple[int, ...]], template: dict[str, tuple[int, ...]],
                       where: str) -> None:
  """Raises ValueError naming the first leaf (in the template's order) that differs."""
  for name, shape in template.items():
    if name not in saved:
      raise ValueError(f"warm-start params in '{where}' do not match the policy: leaf '{name}' {shape} is "
                       "missing from the checkpoint (another policy or config?)")
    if saved[name] != shape:
      raise ValueError(f"warm-start params in '{where}' do not match the policy: leaf '{name}' has shape "
                       f"{saved[name]} in the checkpoint but {shape} in the policy (another env or "
                       "policy.hidden?)")
  extra = [n for n in saved if n not in template]
  if extra:
    raise ValueError(f"warm-start params in '{where}' do not match the policy: the checkpoint has leaf "
                     f"'{extra[0]}' {saved[extra[0]]} that the policy does not (another policy?)")


def _is_critic(name: str) -> bool:
  return is_critic_path(name.split("/"))


def fresh_critic_leaves(saved: dict[str, tuple[int, ...]], template: dict[str, tuple[int, ...]]) -> list[str]:
  """The template's critic leaves that `saved` lacks or shapes otherwise: they start from their init."""
  return [n for n, shape in template.items() if _is_critic(n) and saved.get(n) != shape]


def check_params(path: str, template_params: Params) -> tuple[str, bool, bool, list[str]]:
  """Checks, from Orbax's metadata alone, that `path` holds params shaped like the template (which may
  be jax.eval_shape's: nothing is read or compiled). Returns (the item directory, whether it holds a
  whole TrainState, whether the template's frozen copy params["base"] must be filled from the net,
  the template's critic leaves that keep their init: `fresh_critic_leaves`).

  Raises ValueError (one line) when nothing readable is there or a leaf's shape differs.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top

  item = _item_dir(path)
  try:
    tree = ocp.PyTreeCheckpointHandler().metadata(epath.Path(item)).tree
  except Exception as e:  # pylint: disable=broad-except  # Orbax raises many kinds.
    raise ValueError(f"cannot read warm-start params in '{item}': {_first_line(e)}") from None
  is_state = isinstance(tree, dict) and "params" in tree and "opt_state" in tree
  saved = tree["params"] if is_state else tree
  # A frozen copy (params["base"]: subtrees of params["net"] under the same keys, e.g. a flow policy
  # fine-tuning its last denoising steps) that the saved params lack is copied from the loaded net.
  fill_base = (isinstance(template_params, dict) and BASE in template_params
               and not (isinstance(saved, dict) and BASE in saved))
  template = {k: v for k, v in template_params.items() if k != BASE} if fill_base else template_params
  saved, template = _leaf_shapes(saved), _leaf_shapes(template)
  fresh = fresh_critic_leaves(saved, template)
  check_params_match({n: s for n, s in saved.items() if not _is_critic(n)},
                     {n: s for n, s in template.items() if not _is_critic(n)}, item)
  return item, is_state, fill_base, fresh


def load_params(path: str, template_params: Params) -> Params:
  """Policy params from an EBRL checkpoint or a launch.sft directory, shaped and placed like the template.

  Raises ValueError (one line) when nothing readable is there or a leaf's shape differs.
  """
  return load_params_and_fresh(path, template_params)[0]


def load_params_and_fresh(path: str, template_params: Params) -> tuple[Params, list[str]]:
  """`load_params`, and the critic leaves that kept the template's init (`fresh_critic_leaves`)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  item, is_state, fill_base, fresh = check_params(path, template_params)
  handler = ocp.PyTreeCheckpointHandler()
  template = {k: v for k, v in template_params.items() if k != BASE} if fill_base else template_params
  flat_template = traverse_util.flatten_dict(template, sep="/")  # Dicts only: obs_norm's stats stay one entry.
  readable = traverse_util.unflatten_dict({n: x for n, x in flat_template.items() if n not in fresh}, sep="/")
  target = {"params": readable} if is_state else readable
  try:  # Partial: a TrainState's other fields, and saved critic leaves the policy has no place for, stay unread.
    out = ocp.Checkpointer(handler).restore(item, args=ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True))
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"cannot read warm-start params in '{item}': {_first_line(e)}") from None
  out = out["params"] if is_state else out
  if fresh:  # The template's structure, its own init on the fresh critic leaves.
    loaded = traverse_util.flatten_dict(out, sep="/")
    out = traverse_util.unflatten_dict({n: x if n in fresh else loaded[n] for n, x in flat_template.items()}, sep="/")
  if fill_base:
    out = {**out, BASE: {k: jax.tree.map(lambda x: x.copy(), out["net"][k]) for k in template_params[BASE]}}
    check_params_match(_leaf_shapes(out), _leaf_shapes(template_params), item)
  return out, fresh


def save_params(directory: str, params: Params, meta: dict | None = None) -> str:
  """Saves params atomically (Orbax writes a temporary directory, then renames) to <directory>/params.

  A directory that already holds params is never overwritten (ValueError).
  Returns the params path.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  directory = os.path.abspath(directory)
  target = os.path.join(directory, PARAMS_DIR)
  if os.path.exists(target):
    raise ValueError(f"'{target}' already exists; choose a new --out directory (params are never overwritten)")
  os.makedirs(directory, exist_ok=True)
  ckptr = ocp.Checkpointer(ocp.StandardCheckpointHandler())
  ckptr.save(target, args=ocp.args.StandardSave(jax.device_get(params)))
  ckptr.close()
  if meta is not None:
    tmp = os.path.join(directory, META_FILE + ".tmp")
    with open(tmp, "w") as f:
      json.dump(meta, f, indent=2)
    os.replace(tmp, os.path.join(directory, META_FILE))
  return target


def _first_line(e: Exception) -> str:
  text = str(e).strip()
  return (text.splitlines()[0][:200] if text else type(e).__name__)
