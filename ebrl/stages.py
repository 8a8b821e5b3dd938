"""A run's stages, built from its spec: the builder part of a run (ebrl/recorder.py records it,
ebrl/trainer.py drives it).

`build(run, devices, env_seed, hold, say)` makes, in order: the resource manager
and the overlap probe where the run is placed (`resources != off`), the layout
(the spec's, or the plan's), the simulators (host EnvPool groups or a device
simulator), the policy, the learner, the param store, the sampler and the
episode tracker. Each takes the spec's sections it needs. What must be
released (the env pools) is handed to `hold` as soon as it exists, so a build
that fails part way releases it. A learner process (placement=processes) starts
last, from `start_learner_process`, once the trainer has initialised or
restored the state it trains from.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import jax
import numpy as np
import tqdm

from ebrl.errors import UserError
from ebrl.layout import RunLayout
from ebrl.learner import Learner, LearnerConfig, make_mesh
from ebrl.learner_process import LearnerProcessSpec, RemoteLearner, shared_memory_bytes
from ebrl.param_store import ParamStore, with_value_stats
from ebrl.resources import gpu_sharing, profiler
from ebrl.resources.devices import DevicePlacement
from ebrl.resources.overlap import OverlapSwitch
from ebrl.sampler import Sampler
from ebrl.spec import RunSpec, derive_layout
from ebrl.telemetry.episodes import EpisodeTracker
from ebrl.telemetry.stages import StageClock
from ebrl.telemetry.trace import Tracer
from ebrl.transport import shm
from ebrl.tuning import Mark
from policies import IncompatibleObservationError, make_policy
from policies.base import action_size
from sim_adapters import make_env_groups
from sim_adapters.base import EnvSpec
from sim_adapters.envpool_adapter import UnsupportedEnvError
from sim_adapters.multitask import env_task_ids

Say = Callable[[str], None]


@dataclasses.dataclass
class Stages:
  """What a run trains with. `learner` is the local Learner until a learner process replaces it."""

  layout: RunLayout
  placement: DevicePlacement  # Local devices per stage.
  resources: Any  # The ResourceManager (scheduler=ebrl on host envs, resources != off) or None.
  overlap: OverlapSwitch | None
  tracer: Tracer
  clock: StageClock  # Stages' busy time and spans (the render stage's draws too).
  host_envs: Any  # EnvGroups, or None on a device simulator.
  device_sim: Any  # DeviceSim, or None on host envs.
  spec: EnvSpec
  policy: Any
  action_size: int
  learner: Any
  stage_placement: str  # "threads" or "processes": where the async learner runs.
  learner_process_spec: LearnerProcessSpec | None
  params: ParamStore
  sampler: Sampler
  tracker: EpisodeTracker

  @property
  def envs(self):
    """The run's simulators: its host env groups (EnvGroups) or its DeviceSim."""
    return self.host_envs if self.host_envs is not None else self.device_sim

  @property
  def tuners(self) -> tuple:
    """The resource controller and the overlap probe (ebrl/tuning.py), in that order."""
    return tuple(t for t in (self.resources, self.overlap) if t is not None)


def build(run: RunSpec, devices: DevicePlacement, env_seed: int, hold: Callable[[str, Callable[[], None]], None],
          say: Say) -> Stages:
  """The stages of `run` on `devices` (validation.check_devices), its env pools seeded by `env_seed`."""
  resources = _resource_manager(run, say)
  overlap = resources.overlap if resources is not None else _device_overlap_switch(run, say)
  # The spec's layout, or the plan's: the resource manager sizes groups and batches for this machine.
  layout = derive_layout(run, resources.plan) if resources is not None else run.layout
  placement = _placement(run, devices, resources)
  tracer = Tracer()
  clock = StageClock(tracer)
  host_envs = device_sim = None
  if run.device_env:
    device_sim = _device_sim(run, layout, placement)
    hold("envs", device_sim.close)
  else:
    host_envs = _host_groups(run, layout, env_seed, clock, resources)
    hold("envs", host_envs.close)
  env_spec = (host_envs if host_envs is not None else device_sim).spec
  try:
    policy = make_policy(run.policy.name, env_spec, run.policy)
  except (IncompatibleObservationError, ValueError) as e:
    raise UserError(f"policy '{run.policy.name}': {e}") from None
  actions = action_size(policy, env_spec)
  learner = Learner(policy, LearnerConfig.of(run.algorithm, layout, run.max_staleness),
                    mesh=make_mesh(_train_devices(placement.train)), demos=_bc_demos(run, env_spec))
  process_spec = _learner_process_spec(run, resources, learner, env_spec, layout, actions, placement)
  # threads or processes; a learner process's /dev/shm space is checked here, before any compile.
  stage_placement = _stage_placement(run, resources, learner, process_spec, say)
  if stage_placement == "processes":
    shm.check_space(shared_memory_bytes(learner, process_spec), "the learner process (placement=processes)")
  # Host acting: generation on its own devices (a device env's policy acts inside the sim's scan).
  gen_mesh = None if device_sim is not None else make_mesh(_local_devices(placement.gen))
  params = _param_store(device_sim, gen_mesh)
  sampler = Sampler(policy, env_spec, params, seed=_sampler_seed(run), mesh=gen_mesh,
                    prenormalized=run.algorithm.obs_norm_update == "every_step")
  return Stages(layout=layout, placement=placement, resources=resources, overlap=overlap, tracer=tracer,
                clock=clock, host_envs=host_envs, device_sim=device_sim, spec=env_spec, policy=policy,
                action_size=actions, learner=learner, stage_placement=stage_placement,
                learner_process_spec=process_spec if stage_placement == "processes" else None, params=params,
                sampler=sampler, tracker=_episode_tracker(run, layout, env_spec, device_sim is not None))


def _bc_demos(run: RunSpec, env_spec: EnvSpec) -> dict | None:
  """The demonstration rows of the update's bc term (algorithm.bc_coef > 0), checked against the env
  as pre-training checks them; None without the term."""
  if run.algorithm.bc_coef <= 0:
    return None
  from ebrl.demos import DemoFormatError, open_demos  # pylint: disable=g-import-not-at-top
  from ebrl.demos.rows import all_rows  # pylint: disable=g-import-not-at-top
  from ebrl.sft.data import check_demos  # pylint: disable=g-import-not-at-top
  from ebrl.validation import bc_demos_path  # pylint: disable=g-import-not-at-top

  a = run.algorithm
  path = bc_demos_path(a.bc_coef, a.bc_demos, run.outputs.warm_start)
  try:
    demos = open_demos(path)
    check_demos(demos, env_spec, run.env.name)  # Pre-training's check: the same env, observations, actions.
    rows = all_rows(demos, max(1, run.policy.chunk_size))
    if len(rows["actions"]) < demos.num_steps:
      tqdm.tqdm.write(f"demo term: {len(rows['actions']):,} of the {demos.num_steps:,} demo steps in '{path}', "
                      "evenly spaced (the update holds at most that many on its devices)")
    return rows
  except (DemoFormatError, ValueError) as e:
    raise UserError(str(e)) from None


def _local_devices(indices: tuple[int, ...]) -> list:
  local = jax.local_devices()
  return [local[i] for i in indices]


def _train_devices(indices: tuple[int, ...]) -> list:
  """The learner's mesh: these local devices of every process of the run, in process order (the
  order in which the processes' env columns make up each update's batch, ebrl/learner.py)."""
  if jax.process_count() == 1:
    return _local_devices(indices)
  by_process = [[d for d in jax.devices() if d.process_index == p] for p in range(jax.process_count())]
  return [devices[i] for devices in by_process for i in indices]


def _sampler_seed(run: RunSpec) -> int:
  """The sampler's seed: the run's + 1, and a disjoint reproducible one for each further process."""
  if run.process_index == 0:
    return run.seed + 1
  return int(np.random.SeedSequence([run.seed + 1, run.process_index]).generate_state(1)[0]) % (1 << 30)


def _resource_manager(run: RunSpec, say: Say):
  """The async scheduler's ResourceManager on host envs (profile, plan, re-plan), or None."""
  if run.async_ is None or run.resources == "off" or run.device_env:
    return None
  from ebrl.resources.manager import ResourceManager  # pylint: disable=g-import-not-at-top

  try:
    return ResourceManager(run, log=say)
  except ValueError as e:
    raise UserError(str(e)) from None


def _device_overlap_switch(run: RunSpec, say: Say) -> OverlapSwitch | None:
  """On a device simulator (no stages to place) resources=auto probes only overlap against a
  barrier (ebrl/resources/overlap.py); on host envs that is the resource manager's."""
  if not (run.device_env and run.async_ is not None and run.resources == "auto"):
    return None
  if not OverlapSwitch.allowed(run):
    say(f"[resources] auto on '{run.env.name}': nothing to choose (the device simulator fuses sim and "
        f"generation; max_staleness={run.max_staleness}, quotas.overlap_probe_s={run.quotas.overlap_probe_s})")
    return None
  say(f"[resources] auto on '{run.env.name}': the device simulator fuses sim and generation in XLA's threads; "
      "overlap against a barrier is probed on the run")
  return OverlapSwitch(run.max_staleness, run.quotas.overlap_probe_s, say)


def _placement(run: RunSpec, checked: DevicePlacement, resources) -> DevicePlacement:
  """Local devices per stage as `validation.check_devices` found them; with a plan, "auto" splits
  them by the plan's stage costs instead."""
  from ebrl.resources import devices as devices_lib  # pylint: disable=g-import-not-at-top

  placement = checked
  if resources is not None:
    costs = resources.plan.stage_cost_us
    placement = devices_lib.resolve(run.devices, jax.local_device_count(), run.device_env,
                                    gen_cost=costs.get("gen", 1.0), train_cost=costs.get("train", 1.0))
  if jax.local_device_count() > 1:
    tqdm.tqdm.write(devices_lib.demand_split_note(placement, jax.local_device_count()))
  return placement


def _host_groups(run: RunSpec, layout: RunLayout, env_seed: int, clock: StageClock, resources):
  """EnvPool env groups (host simulators) for the sync / pipelined / ebrl schedulers."""
  pinning, adopt = {}, contextlib.nullcontext()
  if resources is not None:  # EnvPool's workers are pinned to the plan's sim quota.
    pinning = {"thread_affinity_offset": layout.thread_affinity_offset}
    adopt = resources.adopt("sim")
  env = run.env
  try:
    with adopt:
      groups = make_env_groups(
          env.name, layout.num_groups, layout.envs_per_group, recv_batch=layout.recv_batch,
          num_threads=layout.sim_threads, seed=env_seed, first_group=layout.process_index * layout.num_groups,
          max_episode_steps=env.max_episode_steps,
          from_pixels=env.from_pixels, render_size=env.render_size, straggler_fraction=env.straggler_fraction,
          straggler_slowdown=env.straggler_slowdown, straggler_step_s=env.straggler_step_ms / 1000.0 or None,
          shift_at_s=env.shift_at_s, shift_sim_us=env.shift_sim_us, chunk_size=run.policy.chunk_size,
          reward_type=env.reward_type, gamma=run.algorithm.gamma,
          env_group_size=run.algorithm.group_size if run.algorithm.name == "grpo" else 1,
          render_stage=env.render_stage, clock=clock, success_bonus=env.success_bonus,
          end_on_success=env.end_on_success, dense_reward_scale=env.dense_reward_scale, **pinning)
  except (UnsupportedEnvError, ValueError) as e:
    raise UserError(str(e)) from None
  if resources is not None and env.render_stage:  # Draws get the render quota, not sim's.
    from sim_adapters.render_stage import render_thread_ids  # pylint: disable=g-import-not-at-top
    resources.enforcer.assign("render", render_thread_ids())
  return groups


def _device_sim(run: RunSpec, layout: RunLayout, placement: DevicePlacement):
  """One DeviceSim over the simulator's devices (config.devices.sim; default every local device), driven by
  the fused rollout (ebrl/scheduler/device_sync.py).

  With scheduler=ebrl it holds one env group (num_envs / num_groups envs); each group is its own
  state of it (ebrl/scheduler/device_async.py). ebrl/validation.py has rejected host-only schedulers.
  """
  from sim_adapters.mjx import make_device_sim  # pylint: disable=g-import-not-at-top
  from sim_adapters.mjx.device_sim import make_sim_mesh  # pylint: disable=g-import-not-at-top

  env = run.env
  unsupported = {"env.from_pixels": env.from_pixels, "env.straggler_fraction": env.straggler_fraction,
                 "env.straggler_step_ms": env.straggler_step_ms, "env.shift_sim_us": env.shift_sim_us}
  for key, value in unsupported.items():
    if value:
      raise UserError(f"{key}={value!r} is not supported for device env '{env.name}' (host envs only)")
  try:
    return make_device_sim(env.name, layout.envs_per_group, max_episode_steps=env.max_episode_steps,
                           mesh=make_sim_mesh(_local_devices(placement.sim)))
  except (ValueError, RuntimeError) as e:
    raise UserError(str(e)) from None


def _learner_process_spec(run: RunSpec, resources, learner: Learner, env_spec: EnvSpec, layout: RunLayout,
                          actions: int, placement: DevicePlacement) -> LearnerProcessSpec:
  """What a learner process would be started with: its policy, learner settings, shapes, cores,
  priority and devices."""
  cores = tuple(resources.plan.cpu_sets["train"]) if resources is not None else ()
  return LearnerProcessSpec(policy_name=run.policy.name, policy_cfg=run.policy, env_spec=env_spec,
                            learner_cfg=learner.cfg, rollout_length=layout.rollout_length,
                            segments_per_update=layout.segments_per_update, action_size=actions,
                            train_devices=tuple(placement.train), cores=cores,
                            priority=profiler.learner_priority(run))


def _stage_placement(run: RunSpec, resources, learner: Learner, process_spec: LearnerProcessSpec, say: Say) -> str:
  """threads or processes: the config's, or with placement=auto the plan's (threads without one,
  and threads where /dev/shm cannot hold the learner process's ring and state slot)."""
  if run.learner_placement != "auto":
    return run.learner_placement
  chosen = resources.plan.placement if resources is not None else "threads"
  if chosen == "processes" and run.algorithm.bc_coef > 0:
    say("[placement] the demonstration term (algorithm.bc_coef) runs in the learner thread: the learner stays in "
        "this process")
    return "threads"
  if chosen == "processes":
    needed = shared_memory_bytes(learner, process_spec)
    if not shm.fits(needed):
      say(f"[placement] the plan's learner process needs {needed / 2**20:,.1f} MiB of {shm.SHM_DIR}, which has "
          f"{(shm.free_bytes() or 0) / 2**20:,.1f} MiB free: the learner stays in this process")
      return "threads"
  return chosen


def _param_store(device_sim, gen_mesh) -> ParamStore:
  """Host acting reads the policy params, replicated on the generation devices (a device-to-device
  copy from the learner's); device collects also the value statistics, on the simulator's mesh."""
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top

  if device_sim is None:
    return ParamStore(place=lambda params: jax.device_put(params, NamedSharding(gen_mesh, P())))
  mesh = device_sim.mesh
  place = None if mesh is None else (lambda params: jax.device_put(params, NamedSharding(mesh, P())))
  return ParamStore(select=with_value_stats, place=place)


def _episode_tracker(run: RunSpec, layout: RunLayout, env_spec: EnvSpec, device: bool) -> EpisodeTracker:
  """The run's episode statistics; with a multi-task env, per task too. Every env group holds the
  same task list over `envs_per_group` envs, laid out as one adapter lays out its envs."""
  tasks = () if device else run.tasks or ()
  env_tasks = None
  if tasks:
    env_tasks = np.tile(env_task_ids(layout.envs_per_group, len(tasks)), layout.num_groups)
  return EpisodeTracker(run.num_envs, env_spec.has_success, target=run.outputs.target_success, tasks=tasks,
                        env_tasks=env_tasks)


class LearnerProcessPlacement:
  """Moves the learner process with each plan: to the plan's train cores, and, under MPS
  (`sharing`), to its SM share, which takes a restart of the process."""

  def __init__(self, remote: RemoteLearner, sharing, say: Say):
    self.remote, self.sharing, self.say = remote, sharing, say

  def follow(self, plan) -> list[Mark]:
    """Between updates (the driver's turn); returns a mark when the process was restarted."""
    remote = self.remote
    changes = (self.sharing.learner_env(plan.learner_sm_percent) if self.sharing and plan.learner_sm_percent
               else {"env": remote.spec.env, "unset_env": remote.spec.unset_env})
    if changes["env"] == remote.spec.env:
      remote.set_cores(plan.cpu_sets["train"])
      return []
    remote.respawn(**changes, cores=tuple(plan.cpu_sets["train"]))
    self.say(f"[placement] learner process restarted as {remote.pid} with {plan.learner_sm_percent}% of the SMs")
    return [Mark("learner_respawn", f"learner {plan.learner_sm_percent}% SMs", {"pid": remote.pid})]


def start_learner_process(run: RunSpec, stages: Stages, say: Say) -> RemoteLearner:
  """The learner in a spawned process on the plan's train cores (ebrl/learner_process.py), under
  MPS with its SM share; a re-plan moves it (the resource manager's LearnerProcessPlacement)."""
  spec = stages.learner_process_spec
  sharing = gpu_sharing.current()
  mps = sharing is not None and sharing.mode == "mps"
  share = ""
  if mps:
    sm = _learner_sm_percent(run, stages.resources)
    spec = dataclasses.replace(spec, **sharing.learner_env(sm))
    share = f", {sm}% of the SMs"
  remote = RemoteLearner(stages.learner, spec)
  if stages.resources is not None:  # Each re-plan moves it (ResourceManager.decide).
    stages.resources.learner_process = LearnerProcessPlacement(remote, sharing if mps else None, say)
  say(f"[placement] learner in process {remote.pid}" + (f" on cores {spec.cores}" if spec.cores else "") + share
      + (", at idle CPU priority" if spec.priority == "idle" else ""))
  if sharing is None or sharing.mode == "off":  # placement=auto's choice, or a Trainer built directly.
    say("[placement] no SM shares (MPS starts before JAX, from ebrl.train with placement=processes): "
        "the processes time-share")
  else:
    say(sharing.note)
  return remote


def _learner_sm_percent(run: RunSpec, resources) -> int:
  """The learner process's SM share: the config's, else the plan's (from shares the profile
  measured), else its part of the profiled GPU time per step."""
  asked = run.quotas.learner_sm_percent
  if not asked and resources is not None and resources.plan.learner_sm_percent:
    return resources.plan.learner_sm_percent
  profile = resources.profile if resources is not None else None
  if profile is None:
    return gpu_sharing.learner_sm_percent(asked, 1.0, 1.0)
  n = run.num_envs
  return gpu_sharing.learner_sm_percent(asked, profile.gen_wall_us(n) * 1e-6 / n,
                                        1.0 / max(profile.train_rate(), 1e-9))
