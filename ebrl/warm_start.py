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
instead of an Orbax traceback.

Behaviour cloning (`bc_train`) maximises the policy's log-likelihood of the demo
actions through `policy.evaluate`, which every Policy has; a policy with a
`flow_matching_loss(params, obs, actions, key)` method (flow policies) is
trained with that loss instead. The observation normaliser is first updated from
the demos, so RL after the warm start sees inputs on the scale BC trained on.
By default the Gaussian `log_std` is frozen: on near-deterministic demos the
likelihood is maximised by a std shrinking towards 0, which would leave RL
without exploration (and the loss unbounded below); the mean is what BC is for.

Demonstrations are dicts {"obs": {key: [M, ...]}, "actions": [M, action_dim]} of
env actions; on disk an .npz with `actions` and the obs keys prefixed `obs/`
(`save_demos` / `load_demos`). `record_demos` rolls any act function in a
SimAdapter (tests use `reach_expert`, a scripted MetaWorld Reach controller).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

Params = Any
Demos = dict[str, Any]

PARAMS_DIR = "params"  # save_params: <dir>/params is the Orbax item.
META_FILE = "bc.json"


# ----------------------------------------------------------------------------- params on disk


def _key_name(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def _leaf_shapes(tree) -> dict[str, tuple[int, ...]]:
  """'net/actor/Dense_0/kernel' -> shape, for arrays and Orbax ArrayMetadata alike."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(_key_name(k) for k in path): tuple(int(d) for d in getattr(leaf, "shape", np.shape(leaf)))
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


def load_params(path: str, template_params: Params) -> Params:
  """Policy params from an EBRL checkpoint or a launch.sft directory, shaped and placed like the template.

  Raises ValueError (one line) when nothing readable is there or a leaf's shape differs.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top

  item = _item_dir(path)
  handler = ocp.PyTreeCheckpointHandler()
  try:
    tree = handler.metadata(epath.Path(item)).tree
  except Exception as e:  # pylint: disable=broad-except  # Orbax raises many kinds.
    raise ValueError(f"cannot read warm-start params in '{item}': {_first_line(e)}") from None
  is_state = isinstance(tree, dict) and "params" in tree and "opt_state" in tree
  check_params_match(_leaf_shapes(tree["params"] if is_state else tree), _leaf_shapes(template_params), item)
  target = {"params": template_params} if is_state else template_params
  try:
    out = ocp.Checkpointer(handler).restore(item, args=ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=is_state))
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"cannot read warm-start params in '{item}': {_first_line(e)}") from None
  return out["params"] if is_state else out


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


# ----------------------------------------------------------------------------- demonstrations


def save_demos(path: str, demos: Demos) -> None:
  """Writes demos as an .npz: `actions` and `obs/<key>` arrays."""
  arrays = {"actions": np.asarray(demos["actions"], np.float32)}
  arrays.update({f"obs/{k}": np.asarray(v) for k, v in demos["obs"].items()})
  np.savez(path, **arrays)


def load_demos(path: str) -> Demos:
  """Reads a demos .npz; ValueError (one line) for a missing file or missing keys."""
  if not os.path.isfile(path):
    raise ValueError(f"--demos='{path}' is not a file; give an .npz with 'actions' [M, action_dim] and "
                     "'obs/<key>' [M, ...] arrays (ebrl.warm_start.save_demos writes one)")
  try:
    with np.load(path, allow_pickle=False) as data:
      arrays = {k: np.asarray(data[k]) for k in data.files}
  except Exception as e:  # pylint: disable=broad-except  # zipfile / pickle / format errors.
    raise ValueError(f"--demos='{path}' is not a readable .npz ({_first_line(e)})") from None
  obs = {k[len("obs/"):]: v for k, v in arrays.items() if k.startswith("obs/")}
  if "actions" not in arrays or not obs:
    need = [n for n, ok in (("actions", "actions" in arrays), ("obs/<key>", bool(obs))) if not ok]
    raise ValueError(f"--demos='{path}' lacks {' and '.join(repr(n) for n in need)}; it has keys "
                     f"{sorted(arrays)} (valid: 'actions' and obs keys prefixed 'obs/', e.g. 'obs/state')")
  return {"obs": obs, "actions": arrays["actions"]}


def check_demos(demos: Demos, spec) -> int:
  """Checks demos against an EnvSpec; returns M. ValueError (one line) naming the bad value."""
  actions = np.asarray(demos["actions"])
  want_obs = {k: tuple(v.shape) for k, v in spec.obs.items()}
  if actions.ndim != 2 or actions.shape[1] != spec.action_dim or actions.shape[0] < 1:
    k = int(getattr(spec, "chunk_size", 1))
    unit = f"chunks of {k} x {spec.action_dim // k}-dim actions" if k > 1 else f"{spec.action_dim}-dim actions"
    raise ValueError(f"demos 'actions' has shape {actions.shape}; env '{spec.name}' needs [M, {spec.action_dim}] "
                     f"(M >= 1 demo steps of {unit})")
  m = actions.shape[0]
  for key, shape in want_obs.items():
    if key not in demos["obs"]:
      raise ValueError(f"demos lack 'obs/{key}'; env '{spec.name}' observes "
                       f"{', '.join(f'obs/{k} {s}' for k, s in want_obs.items())}")
    got = np.shape(demos["obs"][key])
    if tuple(got) != (m,) + shape:
      raise ValueError(f"demos 'obs/{key}' has shape {tuple(got)}; env '{spec.name}' needs {(m,) + shape} "
                       f"(one {shape} observation per action)")
  extra = [k for k in demos["obs"] if k not in want_obs]
  if extra:
    raise ValueError(f"demos have 'obs/{extra[0]}', which env '{spec.name}' does not observe; valid: "
                     f"{', '.join(f'obs/{k}' for k in want_obs)}")
  if not np.all(np.isfinite(actions)):
    raise ValueError("demos 'actions' contain NaN or infinite values")
  return m


def record_demos(adapter, act_fn: Callable[[dict], np.ndarray], num_steps: int) -> Demos:
  """Steps every env of a (synchronous) SimAdapter num_steps times with act_fn(obs) -> env actions.

  Keeps the (obs, action) pairs of real transitions: a step answered by an
  automatic reset ignored its action and is dropped.
  """
  from sim_adapters.base import gather_all  # pylint: disable=g-import-not-at-top

  adapter.reset()
  obs = gather_all(adapter, adapter.num_envs).obs
  rows_obs: dict[str, list] = {k: [] for k in obs}
  rows_act = []
  for _ in range(num_steps):
    action = np.asarray(act_fn(obs), np.float32)
    result = adapter.step(action)
    keep = ~np.asarray(result.reset_step, bool)
    for k in obs:
      rows_obs[k].append(np.asarray(obs[k])[keep])
    rows_act.append(action[keep])
    obs = result.obs
  return {"obs": {k: np.concatenate(v) for k, v in rows_obs.items()}, "actions": np.concatenate(rows_act)}


def reach_expert(obs: dict, gain: float = 10.0) -> np.ndarray:
  """Scripted MetaWorld Reach controller (goal-observable obs): move the hand towards the goal.

  state[:, 0:3] is the hand position and state[:, -3:] the goal; actions are
  (dx, dy, dz, gripper) in [-1, 1]. Solves Reach-v3 in about 30 steps.
  """
  s = np.asarray(obs["state"], np.float32)
  action = np.zeros((s.shape[0], 4), np.float32)
  action[:, :3] = np.clip(gain * (s[:, -3:] - s[:, :3]), -1.0, 1.0)
  return action


# ----------------------------------------------------------------------------- behaviour cloning


def bc_loss(policy, params: Params, obs: dict, actions: jax.Array, key: jax.Array) -> jax.Array:
  """Flow-matching loss for flow policies, else the negative mean log-likelihood of the actions."""
  if hasattr(policy, "flow_matching_loss"):
    return policy.flow_matching_loss(params, obs, actions, key)
  logp, _, _ = policy.evaluate(params, obs, actions)
  return -jnp.mean(logp)


def _labels(net, frozen: Sequence[str]):
  def label(path, _):
    return "frozen" if any(_key_name(k) in frozen for k in path) else "train"
  return jax.tree_util.tree_map_with_path(label, net)


def bc_train(policy, params: Params, demos: Demos, steps: int, batch_size: int, learning_rate: float,
             key: jax.Array, *, frozen: Sequence[str] = ("log_std",), max_grad_norm: float = 1.0,
             chunk: int = 250, log: Callable[[int, float], None] | None = None) -> tuple[Params, np.ndarray]:
  """Behaviour cloning of demos into params["net"]; returns (params, per-step minibatch losses [steps]).

  Minibatches of batch_size rows are drawn uniformly (with replacement) from
  the M demo rows; Adam with global-norm clipping. Leaves of params["net"]
  whose path contains a name in `frozen` are not changed. `log(step, loss)` is
  called after every `chunk` steps (one compiled scan per chunk).
  """
  obs = {k: jnp.asarray(v) for k, v in demos["obs"].items()}
  actions = jnp.asarray(demos["actions"], jnp.float32)
  m = int(actions.shape[0])
  for k, v in obs.items():
    if v.shape[0] != m:
      raise ValueError(f"demos 'obs/{k}' has {v.shape[0]} rows but 'actions' has {m}")
  size = getattr(policy, "action_size", None)
  if not hasattr(policy, "flow_matching_loss") and size is not None and int(size) != actions.shape[-1]:
    raise ValueError(f"policy '{policy.name}' evaluates raw actions of width {size}, demos have "
                     f"{actions.shape[-1]}; it needs a flow_matching_loss to clone env actions")
  if steps < 1 or batch_size < 1 or learning_rate <= 0:
    raise ValueError(f"steps={steps}, batch_size={batch_size}, learning_rate={learning_rate} must be positive")
  batch_size = min(batch_size, m)
  params = policy.update_normalizer(params, obs, jnp.ones((m,), jnp.float32))
  inner = optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate))
  optimizer = optax.multi_transform({"train": inner, "frozen": optax.set_to_zero()},
                                    _labels(params["net"], tuple(frozen)))
  opt_state = optimizer.init(params["net"])

  def loss_fn(net, rest, b_obs, b_act, k):
    return bc_loss(policy, {**rest, "net": net}, b_obs, b_act, k)

  def step(carry, k):
    net, opt_state, rest = carry
    k_idx, k_loss = jax.random.split(k)
    idx = jax.random.randint(k_idx, (batch_size,), 0, m)
    b_obs = jax.tree.map(lambda x: x[idx], obs)
    loss, grads = jax.value_and_grad(loss_fn)(net, rest, b_obs, actions[idx], k_loss)
    updates, opt_state = optimizer.update(grads, opt_state, net)
    return (optax.apply_updates(net, updates), opt_state, rest), loss

  @jax.jit
  def run(carry, keys):
    return jax.lax.scan(step, carry, keys)

  rest = {k: v for k, v in params.items() if k != "net"}
  carry = (params["net"], opt_state, rest)
  losses, done = [], 0
  while done < steps:
    n = min(chunk, steps - done)
    key, sub = jax.random.split(key)
    carry, chunk_losses = run(carry, jax.random.split(sub, n))
    losses.append(np.asarray(chunk_losses))
    done += n
    if log is not None:
      log(done, float(np.mean(losses[-1])))
  return {**params, "net": carry[0]}, np.concatenate(losses)


def dataset_loss(policy, params: Params, demos: Demos, key: jax.Array, max_rows: int = 4096) -> float:
  """bc_loss over (up to max_rows of) the demos, for reporting before and after training."""
  m = int(np.shape(demos["actions"])[0])
  rows = np.random.default_rng(0).permutation(m)[:max_rows] if m > max_rows else np.arange(m)
  obs = {k: jnp.asarray(np.asarray(v)[rows]) for k, v in demos["obs"].items()}
  actions = jnp.asarray(np.asarray(demos["actions"], np.float32)[rows])
  return float(jax.jit(lambda p, o, a, k: bc_loss(policy, p, o, a, k))(params, obs, actions, key))
