"""Every simulator behind one interface; `make_adapter` turns a name into one.

Host simulators come from EnvPool (any EnvPool task id: MetaWorld/<Task>-v3,
MuJoCo Playground CPU ports such as PandaPickCube-v1, Gymnasium MuJoCo such as
Ant-v4, DM Control such as CartpoleBalance-v1) plus the multi-task MetaWorld
lists MetaWorld/MT10, MetaWorld/MT50 and MetaWorld/MT:<task>,<task>,...
(sim_adapters/tasks.py). Device simulators (`mjx:<PlaygroundName>`, `brax:<name>`)
follow the DeviceSim contract instead and are built by `make_device_sim`
(sim_adapters/mjx/).
"""

from __future__ import annotations

import difflib
import functools

from sim_adapters.base import EnvSpec, ObsSpec, SimAdapter, StepBatch
from sim_adapters.tasks import NAMED_LISTS, TaskListError, is_multitask, multitask_tasks

MULTI_TASK_NAMES = tuple(NAMED_LISTS)  # The named lists; a user's list is MetaWorld/MT:<task>,<task>,...


class UnknownEnvError(ValueError):
  """An env name no backend knows; the message suggests close valid names."""


@functools.lru_cache(maxsize=1)
def known_env_names() -> tuple[str, ...]:
  import envpool  # Slow import, done once and only when a name is checked.

  return tuple(envpool.list_all_envs()) + MULTI_TASK_NAMES


def metaworld_tasks() -> tuple[str, ...]:
  """Every single MetaWorld task EnvPool registers ("Reach-v3", ...: the 50 of MT50), in its order."""
  prefix = "MetaWorld/"
  return tuple(n[len(prefix):] for n in known_env_names() if n.startswith(prefix) and n not in MULTI_TASK_NAMES)


def check_env_name(name: str) -> None:
  """Raises UnknownEnvError naming the closest valid names."""
  from sim_adapters.mjx import names as device_names

  if device_names.is_device_env(name):
    try:
      device_names.check_device_env_name(name)
    except ValueError as e:
      raise UnknownEnvError(str(e)) from None
    return
  try:
    if multitask_tasks(name) is not None:
      return
  except TaskListError as e:
    raise UnknownEnvError(str(e)) from None
  names = known_env_names()
  if name in names:
    return
  lowered = {n.lower(): n for n in names}
  hints = [lowered[c] for c in difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.6)]
  hint = ", ".join(hints) if hints else "MetaWorld/Reach-v3, MetaWorld/MT10, MetaWorld/MT50, CartpoleBalance-v1"
  raise UnknownEnvError(f"unknown env '{name}'; closest valid names: {hint}")


def make_adapter(name: str, num_envs: int, *, batch_size: int | None = None, num_threads: int = 0,
                 thread_affinity_offset: int = -1, seed: int = 0, max_episode_steps: int = 0,
                 from_pixels: bool = False, render_size: int = 64, render_camera: int | str = -1,
                 straggler_fraction: float = 0.0, straggler_slowdown: float = 1.0,
                 straggler_step_s: float | None = None, shift_at_s: float = 0.0, shift_sim_us: float = 0.0,
                 chunk_size: int = 1, reward_type: str = "chunk", gamma: float = 0.99,
                 env_group_size: int = 1, render_stage: bool = False, clock=None, success_bonus: float = 0.0,
                 end_on_success: bool = False, dense_reward_scale: float = 1.0):
  """Builds the adapter for `name` (checked first, so errors come before any work).

  No env is reset here: the first reset happens when a scheduler starts, so a
  policy/observation mismatch is reported before any simulation or rendering.
  `render_camera` (with from_pixels): EnvPool's camera id, -1 for the free
  camera, or for MetaWorld a camera name (sim_adapters.render.METAWORLD_CAMERAS).
  `render_stage` (with from_pixels): state and pixels, the frames drawn by EBRL's
  render stage (as the envs come back) instead of inside EnvPool's
  pixel-only pools (sim_adapters/render_stage.py); `clock` (a StageClock) times its draws.
  `success_bonus` / `end_on_success` / `dense_reward_scale` (MetaWorld only): a reward added on
  success steps, episodes that end at their first success, the factor on the env's shaped reward
  (sim_adapters/success.py; training only, evaluation keeps MetaWorld's protocol).
  """
  check_env_name(name)
  if from_pixels:
    from sim_adapters.render import camera_id
    render_camera = camera_id(name, render_camera)
  elif render_camera != -1:
    raise ValueError(f"render_camera={render_camera!r} needs from_pixels=True")
  from sim_adapters.mjx import names as device_names

  if device_names.is_device_env(name):
    raise UnknownEnvError(f"env '{name}' is a device simulator: build it with sim_adapters.mjx.make_device_sim")
  if chunk_size > 1 and batch_size is None:
    # Chunks run per env (sim_adapters/chunks.py): a synchronous `step` gathers envs one by
    # one as their chunks end, which an EnvPool waiting for whole batches could not return.
    batch_size = 1
  kwargs = dict(batch_size=batch_size, num_threads=num_threads,
                thread_affinity_offset=thread_affinity_offset, seed=seed,
                max_episode_steps=max_episode_steps)
  if env_group_size > 1:
    if is_multitask(name):
      raise ValueError(f"same-seed env groups are not supported for '{name}'")
    # GRPO: env i gets seed + i // env_group_size (ebrl.algorithms.grpo.grouped_env_seeds), so
    # every env of a group starts each episode from the same initial state.
    kwargs["env_seed"] = [seed + i // env_group_size for i in range(num_envs)]
  reshaped = bool(success_bonus or end_on_success or dense_reward_scale != 1.0)
  if reshaped:
    from sim_adapters.success import check_options
    check_options(success_bonus, end_on_success, dense_reward_scale)
    if not name.startswith("MetaWorld/"):
      raise ValueError(f"success_bonus / end_on_success / dense_reward_scale apply to MetaWorld host envs, not '{name}'")
  if render_stage and not from_pixels:
    raise ValueError("render_stage=True draws pixels: it needs from_pixels=True")
  if render_stage:
    if is_multitask(name):
      raise ValueError(f"the render stage draws one EnvPool's envs; '{name}' has one pool per task "
                       "(use render_stage=False for its pixel pools)")
    from sim_adapters.render import pixel_env_kwargs
    kwargs.update(render_mode="rgb_array", render_width=render_size, render_height=render_size,
                  render_camera_id=render_camera)
    kwargs = pixel_env_kwargs(name, kwargs)
  elif from_pixels:
    kwargs.update(from_pixels=True, render_width=render_size, render_height=render_size,
                  render_camera_id=render_camera)
  if name.startswith("MetaWorld/"):
    # The MT1 convention: the goal is part of the observation.
    kwargs["partially_observable"] = False
  if is_multitask(name):
    from sim_adapters.multitask import MultiTaskAdapter
    adapter = MultiTaskAdapter(num_envs, name=name, **kwargs)
  else:
    from sim_adapters.envpool_adapter import EnvPoolAdapter
    from sim_adapters.fresh_episodes import FreshEpisodeAdapter, needs_fresh_episodes
    adapter = (FreshEpisodeAdapter if needs_fresh_episodes(name) else EnvPoolAdapter)(name, num_envs, **kwargs)
  simulator = adapter  # The wrappers below leave its frames to draw (render stage).
  if straggler_fraction != 0.0 or straggler_slowdown != 1.0:
    # Wrapped whenever either is set, so bad values are rejected; no delay when inactive.
    from sim_adapters.instruments.straggler import StragglerAdapter
    adapter = StragglerAdapter(adapter, straggler_fraction, straggler_slowdown, seed=seed,
                               per_env_step_s=straggler_step_s)
  if shift_sim_us:
    from sim_adapters.instruments.demand_shift import DemandShiftAdapter
    adapter = DemandShiftAdapter(adapter, shift_at_s, shift_sim_us)
  if reshaped:
    # Per step, below chunks: a chunk ends at the success step like at any episode end.
    from sim_adapters.success import SuccessAdapter
    adapter = SuccessAdapter(adapter, success_bonus, end_on_success, dense_reward_scale)
  if chunk_size > 1:
    from sim_adapters.chunks import ChunkAdapter
    adapter = ChunkAdapter(adapter, chunk_size, reward_type, gamma)
  if render_stage:  # Outermost: only the observation an env is handed back with is drawn.
    from sim_adapters.render_stage import RenderStage
    adapter = RenderStage(adapter, simulator.render_frames, render_size, clock=clock)
  return adapter


def make_env_groups(name: str, num_groups: int, envs_per_group: int, *, recv_batch: int | None = None,
                    num_threads: int = 0, seed: int = 0, first_group: int = 0, **kwargs):
  """num_groups adapters of envs_per_group envs each (sync mode unless recv_batch < envs_per_group).

  Each group gets its own seed and `num_threads` EnvPool workers (the run's RunLayout gives a
  share of the cores to each group, so the groups together use the cores one adapter would).
  Groups are numbered from `first_group` (a process's first, in a run over several), so every
  group of a run draws different initial states.
  """
  from sim_adapters.groups import EnvGroups

  batch = recv_batch if recv_batch and recv_batch < envs_per_group else None
  return EnvGroups([
      make_adapter(name, envs_per_group, batch_size=batch, num_threads=num_threads, seed=seed + 7919 * g, **kwargs)
      for g in range(first_group, first_group + num_groups)
  ])


def is_device_env(name: str) -> bool:
  """Whether `name` is a device simulator (`mjx:...` or `brax:...`)."""
  from sim_adapters.mjx import names as device_names

  return device_names.is_device_env(name)


__all__ = ["EnvSpec", "ObsSpec", "SimAdapter", "StepBatch", "UnknownEnvError",
           "check_env_name", "is_device_env", "is_multitask", "known_env_names", "make_adapter", "make_env_groups",
           "multitask_tasks"]
