"""RunSpec: a run config translated once into typed, frozen settings.

Why: below the API and the launchers nothing reads the config dict.
`ebrl.validation.resolve` checks the config (one-line errors), then `translate`
here turns each of its sections into a frozen dataclass and derives every size
once (the RunLayout). Components take the sections they use (the learner its
`algorithm`, the env builders `env`, the scheduler the layout and the async
settings), the way a builder translates a config into explicit arguments.

The sections keep the config's key names, so `--config.algorithm.gamma` is
`spec.algorithm.gamma`; the differences are the async scheduler's settings,
`spec.async_` (the config's `ebrl` section, None for every other scheduler),
and the outputs (`spec.outputs`: logging, checkpoints, resume, evaluation,
warm start, the success target).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from ebrl.layout import RunLayout, envs_per_group, total_updates
from sim_adapters.tasks import multitask_tasks


def _section(cls, values: Mapping[str, Any]):
  """`cls` from a config section: every field by name, sequences as tuples (hashable, frozen)."""
  kwargs = {}
  for field in dataclasses.fields(cls):
    value = values[field.name]
    kwargs[field.name] = tuple(value) if isinstance(value, (list, tuple)) else value
  return cls(**kwargs)


@dataclasses.dataclass(frozen=True)
class EnvSettings:
  """The config's `env` section (ebrl/defaults.py documents each key)."""

  name: str
  num_threads: int
  max_episode_steps: int
  from_pixels: bool
  render_size: int
  render_stage: bool
  straggler_fraction: float
  straggler_slowdown: float
  straggler_step_ms: float
  shift_at_s: float
  shift_sim_us: float
  reward_type: str
  success_bonus: float
  end_on_success: bool
  dense_reward_scale: float


@dataclasses.dataclass(frozen=True)
class PolicySettings:
  """The config's `policy` section."""

  name: str
  hidden: tuple[int, ...]
  init_log_std: float
  min_std: float  # mlp, cnn: action std bounds (0.0: none).
  max_std: float
  chunk_size: int
  channels: tuple[int, ...]
  bins: int
  width: int
  depth: int
  heads: int
  decode: str
  detach_critic: bool  # vla: the value head reads stop_gradient of the trunk.
  vla_critic_hidden: tuple[int, ...]  # vla: the critic MLP's layers; () = a linear head on [CLS].
  flow_steps: int
  flow_init_log_std: float
  flow_min_log_std: float  # flow: floor of the log noise scale.
  flow_hidden: tuple[int, ...]  # flow: the velocity net's layers.
  flow_finetune_steps: int  # flow: trained (last) denoising steps; 0 = all.


@dataclasses.dataclass(frozen=True)
class AlgorithmSettings:
  """The config's `algorithm` section (the learner's LearnerConfig derives from it)."""

  name: str
  group_size: int
  gamma: float
  gae_lambda: float
  clip_eps: float
  value_clip_eps: float
  vf_coef: float
  ent_coef: float
  normalize_advantages: bool
  epochs: int
  num_minibatches: int
  learning_rate: float
  lr_schedule: str
  max_grad_norm: float
  target_kl: float
  reward_scale: float
  reward_norm: bool
  obs_norm_update: str
  value_norm: bool
  value_norm_count: float
  correction: str
  behaviour_weight_clip: float
  vtrace_rho_clip: float
  vtrace_c_clip: float
  critic_warmup_updates: int
  ref_kl_coef: float
  ratio_level: str
  critic_warmup_ev: float
  ref_kl_mode: str
  actor_learning_rate: float
  critic_learning_rate: float
  bc_coef: float
  bc_decay: float
  bc_batch_size: int
  bc_demos: str


@dataclasses.dataclass(frozen=True)
class AsyncSettings:
  """scheduler=ebrl's settings (the config's `ebrl` section). Zero means "derived": the layout
  holds the sizes a run uses."""

  num_groups: int
  recv_batch: int
  max_gen_batch: int
  max_wait_ms: float
  max_staleness: int
  segments_per_update: int

  @property
  def max_wait_s(self) -> float:
    return self.max_wait_ms / 1000.0


@dataclasses.dataclass(frozen=True)
class DeviceRequest:
  """Local devices per stage as the config asks (ebrl/resources/devices.py resolves them)."""

  gen: str
  train: str
  sim: str


@dataclasses.dataclass(frozen=True)
class QuotaSettings:
  """The config's `quotas` section: how the resource manager places the stages."""

  profile: str
  control_interval_s: float
  overlap_probe_s: float
  sim_cores: str
  gen_cores: str
  train_cores: str
  render_cores: str
  sim_threads: int
  learner_sm_percent: int
  learner_priority: str


@dataclasses.dataclass(frozen=True)
class OutputSettings:
  """What the run records and where it starts from."""

  target_success: float
  log_every_s: float
  checkpoint_every_s: float
  keep_checkpoints: int
  resume: bool
  warm_start: str
  eval_episodes: int


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One run, resolved (see the module docstring). `config` is the config it came from, as plain
  JSON-able data, for config.json and for comparing a resumed run with the one it resumes."""

  env: EnvSettings
  policy: PolicySettings
  algorithm: AlgorithmSettings
  scheduler: str
  async_: AsyncSettings | None
  num_partitions: int  # scheduler=pipelined: env partitions taking turns (1 elsewhere).
  num_envs: int
  rollout_length: int
  total_env_steps: int
  seed: int
  devices: DeviceRequest
  resources: str  # off, auto, naive, manual (scheduler=ebrl on host envs; auto on a device sim).
  learner_placement: str  # auto, threads, processes: where the async learner runs (config `placement`).
  quotas: QuotaSettings
  outputs: OutputSettings
  device_env: bool  # The env is a device simulator (mjx:..., brax:...), not host EnvPools.
  tasks: tuple[str, ...] | None  # A multi-task MetaWorld env's tasks, None for one env.
  layout: RunLayout = dataclasses.field(compare=False)
  config: Mapping[str, Any] = dataclasses.field(compare=False, repr=False)
  # A run over several processes: this spec is process `process_index`'s share (see `share`).
  num_processes: int = 1
  process_index: int = 0

  @property
  def max_staleness(self) -> int:
    """Policy versions a sample may lag the learner by: the async scheduler's bound; 0 elsewhere,
    where every sample is generated by the params it is learned from."""
    return self.async_.max_staleness if self.async_ is not None else 0


def translate(cfg) -> RunSpec:
  """`cfg` as typed settings and its layout, without checking it (`validation.resolve` checks first;
  a saved run's config.json, checked when it ran, is read back this way)."""
  from sim_adapters import is_device_env  # pylint: disable=g-import-not-at-top

  spec = RunSpec(
      env=_section(EnvSettings, cfg.env), policy=_section(PolicySettings, cfg.policy),
      algorithm=_section(AlgorithmSettings, cfg.algorithm), scheduler=cfg.scheduler,
      async_=_section(AsyncSettings, cfg.ebrl) if cfg.scheduler == "ebrl" else None,
      num_partitions=cfg.pipelined.num_partitions if cfg.scheduler == "pipelined" else 1,
      num_envs=cfg.num_envs, rollout_length=cfg.rollout_length, total_env_steps=cfg.total_env_steps,
      seed=cfg.seed, devices=_section(DeviceRequest, cfg.devices), resources=cfg.resources,
      learner_placement=cfg.placement, quotas=_section(QuotaSettings, cfg.quotas),
      outputs=_section(OutputSettings, cfg), device_env=is_device_env(cfg.env.name),
      tasks=multitask_tasks(cfg.env.name), layout=None, config=json.loads(cfg.to_json_best_effort()))
  return dataclasses.replace(spec, layout=derive_layout(spec))


def share(spec: RunSpec, num_processes: int, process_index: int) -> RunSpec:
  """Process `process_index`'s part of a run over `num_processes` processes: the config's
  `num_envs` and `ebrl.segments_per_update` count every process's, so each process runs
  num_envs / num_processes envs and gives that share of every update's segments; the budget
  (total_env_steps, the update count) stays the run's. `validation.check_processes` has checked
  that the sizes divide. One process: `spec` itself."""
  if num_processes == 1:
    return spec
  async_ = spec.async_
  if async_ is not None:
    async_ = dataclasses.replace(async_, segments_per_update=async_.segments_per_update // num_processes)
  local = dataclasses.replace(spec, num_envs=spec.num_envs // num_processes, async_=async_,
                              num_processes=num_processes, process_index=process_index)
  return dataclasses.replace(local, layout=derive_layout(local))


def _num_groups(spec: RunSpec) -> int:
  """ebrl.num_groups = 0 picks 1 for a multi-task MetaWorld env (MT10, MT50, a list), whose task
  pools already run independently of each other (one receiver thread each), so splitting them
  further only shrinks every pool's batches; 2 otherwise, so one group simulates while the other's
  actions are generated. The pipelined scheduler's groups are its partitions."""
  if spec.async_ is not None:
    return spec.async_.num_groups or (1 if spec.tasks else 2)
  return spec.num_partitions


def _recv_batch(spec: RunSpec, per_group: int) -> int:
  """Envs an ebrl group's recv returns (ebrl.recv_batch = 0): half a group for one EnvPool, so
  envs return in two waves that overlap the other group's generation; all but one env of a
  multi-task env's group, whose task pools each step their envs together: the tasks' uneven step
  times already stagger their returns, and a policy whose call costs more than a task's step
  (the flow) loses more to half-size calls than overlap gains (BENCHMARKS.md)."""
  if spec.async_.recv_batch:
    return spec.async_.recv_batch
  return max(1, per_group - 1 if spec.tasks else per_group // 2)


def derive_layout(spec: RunSpec, plan=None) -> RunLayout:
  """The sizes of `spec`'s run (ebrl/layout.py says what each means per scheduler); `plan`, the
  resource manager's, if any, sizes the groups, batches and pools for this machine. Sizes that do
  not divide are rejected by `validation.check_layout` right after `translate` derives them."""
  groups = plan.num_groups if plan is not None else _num_groups(spec)
  per_group = envs_per_group(spec.num_envs, max(1, groups))
  asynchronous = spec.async_
  recv = max_gen = None
  if asynchronous is not None and not spec.device_env:
    recv = plan.recv_batch if plan is not None else _recv_batch(spec, per_group)
    # Default: every group's ready batch at once, so a full batch never waits out max_wait.
    max_gen = asynchronous.max_gen_batch or (plan.max_gen_batch if plan is not None else recv * groups)
  segments = (asynchronous.segments_per_update or spec.num_envs) if asynchronous is not None else spec.num_envs
  samples = segments * spec.rollout_length
  threads = spec.env.num_threads
  if plan is not None:  # The plan sizes every pool; its workers are pinned to the sim quota.
    threads = plan.sim_threads
  elif groups > 1:  # Groups share the cores one pool would have had.
    threads = max(1, (threads or len(os.sched_getaffinity(0))) // groups)
  k = spec.policy.chunk_size
  # With reward_type=action a chunk's reward is already discounted per action, so the next chunk
  # is K actions away: gamma^K (the semi-MDP view). reward_type=chunk treats a chunk as one step.
  gamma = spec.algorithm.gamma
  if k > 1 and spec.env.reward_type == "action":
    gamma = gamma ** k
  return RunLayout(num_envs=spec.num_envs, num_groups=groups, envs_per_group=per_group,
                   rollout_length=spec.rollout_length, segments_per_update=segments, samples_per_update=samples,
                   total_updates=total_updates(samples * spec.num_processes, spec.total_env_steps), recv_batch=recv,
                   max_gen_batch=max_gen, gen_batch_fixed=bool(asynchronous is not None and asynchronous.max_gen_batch),
                   sim_threads=threads, thread_affinity_offset=plan.thread_affinity_offset if plan is not None else -1,
                   chunk_size=k, gamma=gamma, num_processes=spec.num_processes, process_index=spec.process_index)
