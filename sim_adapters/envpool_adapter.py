"""EnvPool behind the SimAdapter contract.

EnvPool is the C++ batched simulator: its threads step envs with the GIL
released, and with `batch_size < num_envs` its `recv` returns whichever envs
finished first, which is exactly the "every env runs independently" model the
ebrl scheduler relies on.

Observation order (documented contract):
* a Box observation becomes `state` (float32, flattened);
* a Dict observation with a `state` key (MuJoCo Playground) gives `state`, and
  every other key is kept under its own name (e.g. `privileged_state` for an
  asymmetric critic);
* any other Dict observation is flattened into `state` by concatenating its
  keys in the observation space's order (DM Control's own order, e.g.
  CartpoleBalance's `position` then `velocity`, WalkerWalk's `orientations`,
  `height`, `velocity`);
* an observation with more than one axis that is not a Dict (Atari frames) is
  kept as `pixels` with its own dtype.

Success: MetaWorld and Playground hand tasks report `info["success"]`;
Gymnasium-Robotics reports `is_success`; Playground Panda tasks report
`reward_success` (> 0 once the box is at its target). Everything else has no
success signal and reports NaN.

Automatic resets: when an env finishes, EnvPool resets it on that env's next
step, ignoring the action, and returns the first observation of the new
episode. That row is marked `reset_step` so the learner masks it out.
"""

from __future__ import annotations

import numpy as np

from sim_adapters.base import EnvSpec, Obs, ObsSpec, StepBatch, gather_all

_SUCCESS_KEYS = ("success", "is_success", "reward_success")


class UnsupportedEnvError(ValueError):
  """An env EnvPool has but EBRL cannot train on (e.g. discrete actions)."""


def _obs_layout(space) -> tuple[dict[str, ObsSpec], list[str] | None]:
  """Returns the adapter's obs spec and, for flattened Dicts, the key order."""
  if hasattr(space, "spaces"):  # gymnasium.spaces.Dict
    keys = list(space.spaces.keys())
    if "state" in keys:
      return {k: ObsSpec((int(np.prod(space[k].shape)),), np.dtype(np.float32)) for k in keys}, None
    size = sum(int(np.prod(space[k].shape)) for k in keys)
    return {"state": ObsSpec((size,), np.dtype(np.float32))}, keys
  if len(space.shape) > 1:
    return {"pixels": ObsSpec(tuple(space.shape), np.dtype(space.dtype))}, None
  return {"state": ObsSpec((int(np.prod(space.shape)),), np.dtype(np.float32))}, None


class EnvPoolAdapter:
  """One EnvPool instance; sync when `batch_size == num_envs`, async otherwise."""

  def __init__(
      self,
      name: str,
      num_envs: int,
      *,
      batch_size: int | None = None,
      num_threads: int = 0,
      thread_affinity_offset: int = -1,
      seed: int = 0,
      max_episode_steps: int = 0,
      **env_kwargs,
  ):
    import envpool  # Imported here: loading EnvPool's C++ modules takes a while.

    kwargs = dict(env_kwargs)
    if kwargs.get("from_pixels"):
      # Loads GL before EnvPool's first render and points MetaWorld at shadow-free assets.
      from sim_adapters.render import pixel_env_kwargs
      kwargs = pixel_env_kwargs(name, kwargs)
    if max_episode_steps > 0:
      kwargs["max_episode_steps"] = max_episode_steps
    self.num_envs = num_envs
    self.batch_size = batch_size or num_envs
    self.is_async = self.batch_size < num_envs
    self._pool = envpool.make(
        name,
        env_type="gymnasium",
        num_envs=num_envs,
        batch_size=self.batch_size,
        num_threads=num_threads,
        thread_affinity_offset=thread_affinity_offset,
        seed=seed,
        **kwargs,
    )
    obs_spec, self._flat_keys = _obs_layout(self._pool.observation_space)
    action_space = self._pool.action_space
    if not hasattr(action_space, "low"):
      self._pool.close()
      raise UnsupportedEnvError(f"env '{name}' has {action_space} actions; EBRL policies act in continuous "
                                "(Box) action spaces such as MetaWorld, MuJoCo, DM Control and Playground tasks")
    info_keys = [k.split(":", 1)[1] for k in self._pool.spec._state_keys if k.startswith("info:")]  # pylint: disable=protected-access
    self._success_key = next((k for k in _SUCCESS_KEYS if k in info_keys), None)
    self.spec = EnvSpec(
        name=name,
        obs=obs_spec,
        action_dim=int(np.prod(action_space.shape)),
        action_low=np.asarray(action_space.low, np.float32).reshape(-1),
        action_high=np.asarray(action_space.high, np.float32).reshape(-1),
        max_episode_steps=int(self._pool.spec.config.max_episode_steps),
        has_success=self._success_key is not None,
    )
    self._action_dtype = action_space.dtype
    self._prev_done = np.ones(num_envs, bool)  # Next row of each env is a reset.
    self._needs_reset = np.zeros(num_envs, bool)
    self._pending = np.zeros(num_envs, bool)  # Sent (or reset) and not yet received.
    self._stash: list[StepBatch] = []
    self._in_flight = 0  # Envs sent (or reset) and not yet received.
    self.nan_resets = 0

  # -- conversion ------------------------------------------------------------

  def _convert_obs(self, raw) -> Obs:
    if self._flat_keys is not None:
      n = raw[self._flat_keys[0]].shape[0]
      return {"state": np.concatenate(
          [np.asarray(raw[k], np.float32).reshape(n, -1) for k in self._flat_keys], axis=1)}
    if isinstance(raw, dict):
      return {k: np.asarray(v, np.float32).reshape(v.shape[0], -1) for k, v in raw.items()}
    if "pixels" in self.spec.obs:
      return {"pixels": raw}
    return {"state": np.asarray(raw, np.float32).reshape(raw.shape[0], -1)}

  def _to_batch(self, out) -> StepBatch:
    raw_obs, reward, terminated, truncated, info = out
    env_ids = np.asarray(info["env_id"], np.int32)
    obs = self._convert_obs(raw_obs)
    reward = np.asarray(reward, np.float32).reshape(-1)
    terminated = np.asarray(terminated, bool).reshape(-1)
    truncated = np.asarray(truncated, bool).reshape(-1)
    if self._success_key is not None:
      success = (np.asarray(info[self._success_key], np.float32) > 0).astype(np.float32)
    else:
      success = np.full(env_ids.shape, np.nan, np.float32)
    reset_step = self._prev_done[env_ids].copy()
    # EnvPool leaves the reward of a reset row unwritten (DM Control: whatever was
    # in memory); no transition led there, so its reward is 0 by definition.
    reward[reset_step] = 0.0
    # Non-finite physics: end the episode here, reset the env on its next send.
    finite = np.isfinite(reward)
    for v in obs.values():
      if np.issubdtype(v.dtype, np.floating):
        finite &= np.isfinite(v).reshape(len(env_ids), -1).all(axis=1)
    if not finite.all():
      bad = ~finite
      self.nan_resets += int(bad.sum())
      for v in obs.values():
        v[bad] = 0
      reward[bad] = 0.0
      if self._success_key is not None:
        success[bad] = 0.0
      truncated[bad] = True
      reset_step[bad] = True
      self._needs_reset[env_ids[bad]] = True
    self._prev_done[env_ids] = terminated | truncated
    return StepBatch(obs, reward, terminated, truncated, success, env_ids, reset_step)

  # -- SimAdapter --------------------------------------------------------------

  def reset(self) -> None:
    self._stash.clear()
    self._prev_done[:] = True
    self._needs_reset[:] = False
    self._in_flight = self.num_envs
    self._pending[:] = True
    self._pool.async_reset()

  def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
    env_ids = np.asarray(env_ids, np.int32)
    if self._pending[env_ids].any():
      # EnvPool would hand the step to a second worker while the first still steps or resets
      # that env: two threads on one MuJoCo state corrupt memory (segfaults, nefc errors).
      raise RuntimeError(f"send to env(s) {env_ids[self._pending[env_ids]][:8].tolist()} whose last step or "
                         "reset has not been received; recv their rows first")
    self._pending[env_ids] = True
    self._in_flight += len(env_ids)
    redo = self._needs_reset[env_ids]
    if redo.any():
      reset_ids = env_ids[redo]
      self._needs_reset[reset_ids] = False
      self._prev_done[reset_ids] = True
      self._pool._reset(reset_ids)  # pylint: disable=protected-access
      if not self.is_async:
        # In sync mode a reset and a step may not share one request: collect the
        # reset now and hand it out with the next recv. In async mode the reset
        # rows simply come back through a later recv, like any ready env.
        self._stash.append(self._to_batch(self._pool.recv()))
      env_ids, actions = env_ids[~redo], actions[~redo]
      if not len(env_ids):
        return
    self._pool.send(np.asarray(actions, self._action_dtype), env_ids)

  def can_recv(self) -> bool:
    """Whether `recv` can return: async EnvPool waits for a whole batch of envs in flight."""
    return bool(self._stash) or self._in_flight >= (self.batch_size if self.is_async else 1)

  def recv(self) -> StepBatch:
    b = self._stash.pop(0) if self._stash else self._to_batch(self._pool.recv())
    self._in_flight -= len(b)
    self._pending[b.env_ids] = False
    return b

  def step(self, actions: np.ndarray) -> StepBatch:
    self.send(actions, np.arange(self.num_envs, dtype=np.int32))
    return gather_all(self, self.num_envs)

  def render_frames(self, env_ids: np.ndarray) -> np.ndarray:
    """uint8 [len(env_ids), H, W, 3] camera frames of these envs' current state (a pool made with
    render_mode="rgb_array"); envs in flight must not be drawn."""
    return self._pool.render(np.asarray(env_ids))

  def reset_envs(self, env_ids: np.ndarray) -> None:
    self._needs_reset[np.asarray(env_ids, np.int32)] = True

  def close(self) -> None:
    self._pool.close()
