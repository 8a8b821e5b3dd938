"""Loads one unbatched MJX env from MuJoCo Playground or Brax as a `CoreEnv`.

The only module that imports Playground or Brax (inside its loaders), so the
DeviceSim and the schedulers that drive it need neither to build.

Both run on MJX's JAX implementation (`impl="jax"`): Playground's default
MuJoCo Warp backend needs CUDA and would not run on the CPU.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import jax
import jax.numpy as jnp

from sim_adapters.mjx.core_env import CoreEnv
from sim_adapters.mjx.names import BRAX_EPISODE_LENGTH

# Same threshold as EnvPool's CPU port of the Panda tasks (`success_threshold`).
PANDA_SUCCESS_DISTANCE = 0.05


def _obs_shapes(size) -> dict[str, tuple[int, ...]]:
  if isinstance(size, int):
    return {"state": (size,)}
  return {k: (v,) if isinstance(v, int) else tuple(v) for k, v in size.items()}


class _ClipCompat(types.ModuleType):
  """jax.numpy with NumPy's old `clip(a_min=, a_max=)` keywords, which JAX removed.

  Two Playground tasks (Leap cube reorientation, Robotiq push) still call them.
  """

  def __init__(self):
    super().__init__("jax.numpy")

  def __getattr__(self, name):
    return getattr(jnp, name)

  @staticmethod
  def clip(x, min=None, max=None, *, a_min=None, a_max=None):  # pylint: disable=redefined-builtin
    return jnp.clip(x, a_min if min is None else min, a_max if max is None else max)


def _patch_clip_keywords() -> None:
  from mujoco_playground._src.manipulation.franka_emika_panda_robotiq import push_cube
  from mujoco_playground._src.manipulation.leap_hand import reorient

  for module in (reorient, push_cube):
    if not isinstance(module.jp, _ClipCompat):
      module.jp = _ClipCompat()


def _playground_success(name: str, env) -> Callable[[Any], jax.Array] | None:
  if name.startswith("Panda") and hasattr(env, "_obj_body"):
    body = int(env._obj_body)  # pylint: disable=protected-access
    return lambda s: jnp.linalg.norm(s.data.xpos[body] - s.info["target_pos"]) < PANDA_SUCCESS_DISTANCE
  if name.startswith("Leap"):
    return lambda s: s.info["success_count"] > 0
  return None


def load_playground(name: str, episode_length: int = 0) -> CoreEnv:
  """A Playground env on MJX's JAX backend; Menagerie models from the package."""
  from mujoco_playground import dm_control_suite, registry

  if name not in dm_control_suite.ALL_ENVS:
    from sim_adapters.mjx.menagerie import use_packaged_menagerie
    use_packaged_menagerie()
    _patch_clip_keywords()
  cfg = registry.get_default_config(name)
  overrides: dict[str, Any] = {}
  if "impl" in cfg:
    overrides["impl"] = "jax"
  env = registry.load(name, config_overrides=overrides)
  length = episode_length or int(cfg.episode_length)
  return CoreEnv(name=f"mjx:{name}", reset=env.reset, step=env.step, obs_shapes=_obs_shapes(env.observation_size),
                 action_size=int(env.action_size), episode_length=length,
                 success=_playground_success(name, env), raw=env)


def load_brax(name: str, episode_length: int = 0) -> CoreEnv:
  """A Brax env on its MJX backend; Brax has no success signal."""
  from brax import envs

  env = envs.get_environment(name, backend="mjx")
  return CoreEnv(name=f"brax:{name}", reset=env.reset, step=env.step,
                 obs_shapes={"state": (int(env.observation_size),)}, action_size=int(env.action_size),
                 episode_length=episode_length or BRAX_EPISODE_LENGTH, success=None, raw=env)
