"""DeviceSim: a batch of MJX envs as two jitted pure functions (docs/ARCHITECTURE.md, Contracts).

`reset(key) -> SimState` and `step(SimState, action) -> SimState` run every env
of the batch on the accelerator. An env whose step ends its episode (the task
terminates it, or it reaches the episode limit) is reset inside that same
jitted step: the returned `obs` is its new episode's first observation and
`final_obs` the observation the finished episode ended on (truncated episodes
bootstrap from it). Only the finished envs are reset, and the reset is skipped
entirely on steps where no env finished. Episode return, length and success
are kept on the device, so no host round trip is needed to log them.

A non-finite observation or reward ends that env's episode as terminated with
reward 0 and resets it (counted in `nan_resets`), as the host adapters do.

With a mesh, every per-env array is sharded along the env axis over the mesh's
devices; envs never talk to each other, so sharding changes no trajectory.
"""

from __future__ import annotations

from typing import Any

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sim_adapters.base import EnvSpec, ObsSpec
from sim_adapters.mjx.core_env import CoreEnv, action_bounds

Obs = dict[str, jax.Array]


@flax.struct.dataclass
class SimState:
  """Every env of one batch after its last step; all per-env leaves are [N, ...]."""

  env: Any  # The library's batched state (physics data, task info).
  obs: Obs  # What the policy sees next: a new episode's first obs where `done`.
  final_obs: Obs  # The obs the last step reached (equals `obs` where not `done`).
  reward: jax.Array  # f32: reward of the last step.
  terminated: jax.Array  # bool
  truncated: jax.Array  # bool: episode limit reached without termination.
  success: jax.Array  # f32 at the last step; NaN when the task has no success signal.
  key: jax.Array  # uint32 [N, 2]: each env's reset key stream.
  steps: jax.Array  # int32: steps taken in the current episode.
  ep_return: jax.Array  # f32: return of the current episode so far.
  ep_length: jax.Array  # int32
  ep_success: jax.Array  # f32: 1 once the current episode has succeeded (NaN: no signal).
  done_return: jax.Array  # f32: the finished episode's return, where `done`.
  done_length: jax.Array  # int32
  done_success: jax.Array  # f32
  nan_resets: jax.Array  # int32 scalar: envs reset for non-finite physics so far.

  @property
  def done(self) -> jax.Array:
    return self.terminated | self.truncated


def _zero_keep_nan(x: jax.Array) -> jax.Array:
  """0 where x is a number, NaN where x is NaN (tasks without success stay NaN)."""
  return jnp.where(jnp.isnan(x), x, 0.0)


def _where(mask: jax.Array, a, b):
  """Per-env select over pytrees whose leaves lead with the env axis."""
  def sel(x, y):
    m = mask.reshape(mask.shape + (1,) * (x.ndim - 1))
    return jnp.where(m, x, y)
  return jax.tree.map(sel, a, b)


class DeviceSim:
  """`num_envs` copies of one CoreEnv, batched, auto-resetting, optionally sharded.

  `step` donates its input state (its buffers are reused for the output), so
  keep only the state it returns. Env groups on one device are simply
  several states of one DeviceSim (each from its own reset key): the compiled
  functions are shared and each group can be stepped while another's actions
  are generated.
  """

  def __init__(self, core: CoreEnv, num_envs: int, mesh: Mesh | None = None):
    if num_envs <= 0:
      raise ValueError(f"num_envs={num_envs} must be positive")
    if mesh is not None and num_envs % mesh.devices.size:
      raise ValueError(f"num_envs={num_envs} must be divisible by the {mesh.devices.size} devices of the sim mesh")
    self.core = core
    self.num_envs = num_envs
    self.mesh = mesh
    low, high = action_bounds(core)
    self.spec = EnvSpec(
        name=core.name, obs={k: ObsSpec(s, np.dtype(np.float32)) for k, s in core.obs_shapes.items()},
        action_dim=core.action_size, action_low=low, action_high=high,
        max_episode_steps=core.episode_length, has_success=core.success is not None)
    self.nan_resets = 0  # Host copy, refreshed by whoever drives the sim.
    shardings = self._shardings() if mesh is not None else None
    self.reset = jax.jit(self._reset, out_shardings=shardings)
    self.step = jax.jit(self._step, out_shardings=shardings, donate_argnums=(0,))

  # -- the two pure functions -------------------------------------------------

  def _reset_envs(self, keys: jax.Array):
    env = jax.vmap(self.core.reset)(keys)
    return env, jax.vmap(self.core.obs)(env)

  def _success(self, env) -> jax.Array:
    if self.core.success is None:
      return jnp.full((self.num_envs,), jnp.nan, jnp.float32)
    return jax.vmap(self.core.success)(env).astype(jnp.float32)

  def _reset(self, key: jax.Array) -> SimState:
    n = self.num_envs
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.key_data(key)
    keys = jax.random.split(key, n)
    split = jax.vmap(jax.random.split)(keys)
    env, obs = self._reset_envs(split[:, 1])
    zeros_f, zeros_i, no = jnp.zeros(n, jnp.float32), jnp.zeros(n, jnp.int32), jnp.zeros(n, bool)
    success0 = _zero_keep_nan(self._success(env))
    return SimState(env=env, obs=obs, final_obs=obs, reward=zeros_f, terminated=no, truncated=no,
                    success=success0, key=split[:, 0], steps=zeros_i, ep_return=zeros_f, ep_length=zeros_i,
                    ep_success=success0, done_return=zeros_f, done_length=zeros_i, done_success=success0,
                    nan_resets=jnp.zeros((), jnp.int32))

  def _step(self, state: SimState, action: jax.Array) -> SimState:
    n = self.num_envs
    chex.assert_shape(action, (n, self.core.action_size))
    env = jax.vmap(self.core.step)(state.env, action.astype(jnp.float32))
    obs = jax.vmap(self.core.obs)(env)
    reward = env.reward.astype(jnp.float32)
    finite = jnp.isfinite(reward)
    for v in obs.values():
      finite &= jnp.all(jnp.isfinite(v.reshape(n, -1)), axis=-1)
    reward = jnp.where(finite, reward, 0.0)
    obs = _where(finite, obs, jax.tree.map(jnp.zeros_like, obs))
    terminated = (env.done > 0) | ~finite
    steps = state.steps + 1
    truncated = (steps >= self.core.episode_length) & ~terminated
    done = terminated | truncated
    success = jnp.where(finite, self._success(env), _zero_keep_nan(state.success))
    ep_return = state.ep_return + reward
    ep_length = state.ep_length + 1
    ep_success = jnp.fmax(state.ep_success, success)

    split = jax.vmap(jax.random.split)(state.key)
    next_key, reset_key = split[:, 0], split[:, 1]
    fresh_env, fresh_obs = self._maybe_reset(done, reset_key, env, obs)
    chex.assert_shape(done, (n,))
    return SimState(
        env=_where(done, fresh_env, env), obs=_where(done, fresh_obs, obs), final_obs=obs, reward=reward,
        terminated=terminated, truncated=truncated, success=success,
        key=jnp.where(done[:, None], next_key, state.key), steps=jnp.where(done, 0, steps),
        ep_return=jnp.where(done, 0.0, ep_return), ep_length=jnp.where(done, 0, ep_length),
        ep_success=jnp.where(done, _zero_keep_nan(ep_success), ep_success),
        done_return=ep_return, done_length=ep_length, done_success=ep_success,
        nan_resets=state.nan_resets + jnp.sum(~finite).astype(jnp.int32))

  def _maybe_reset(self, done: jax.Array, keys: jax.Array, env, obs):
    """Fresh states for every env, computed only when some env is done.

    Resetting runs the physics' forward pass, as costly as a step; skipping it
    when nothing finished keeps a step one physics step. The skip needs the
    reset state to have the step state's exact structure, which Playground and
    Brax states do; otherwise the reset is computed every step.
    """
    def fresh():
      new_env, new_obs = self._reset_envs(keys)
      return jax.tree.map(lambda a, b: a.astype(b.dtype), (new_env, new_obs), (env, obs))

    reset_shape = jax.eval_shape(self._reset_envs, keys)
    same = (jax.tree.structure(reset_shape) == jax.tree.structure((env, obs)) and all(
        a.shape == b.shape for a, b in zip(jax.tree.leaves(reset_shape), jax.tree.leaves((env, obs)))))
    if not same:
      return fresh()
    return jax.lax.cond(jnp.any(done), fresh, lambda: (env, obs))

  # -- sharding ---------------------------------------------------------------

  def _shardings(self):
    """Per-env leaves split along the env axis over the mesh; scalars replicated."""
    shapes = jax.eval_shape(self._reset, jax.random.PRNGKey(0))
    axis = self.mesh.axis_names[0]
    per_env = NamedSharding(self.mesh, P(axis))
    replicated = NamedSharding(self.mesh, P())
    return jax.tree.map(lambda s: per_env if s.ndim and s.shape[0] == self.num_envs else replicated, shapes)

  def place_action(self, action: jax.Array) -> jax.Array:
    """Puts actions on the sim mesh, split like the envs (no-op without a mesh)."""
    if self.mesh is None:
      return action
    return jax.device_put(action, NamedSharding(self.mesh, P(self.mesh.axis_names[0])))

  def close(self) -> None:
    """Nothing to release (device buffers go with their last reference)."""


def make_sim_mesh(devices=None) -> Mesh:
  """A one-axis ('envs') mesh over `devices` (default: every local device)."""
  devices = np.asarray(devices if devices is not None else jax.local_devices())
  return Mesh(devices.reshape(-1), ("envs",))
