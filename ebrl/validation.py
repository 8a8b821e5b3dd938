"""Checks a run config before anything is built or compiled, and resolves it into a RunSpec.

`resolve(cfg)` is the one way from a config to a run: the config's values are
checked, translated into typed settings (ebrl/spec.py), and the sizes derived
from them checked; `check_devices` adds the checks that need the device count.
Every check raises UserError with one line naming the bad value and what would
be valid; launchers print it and exit 2.
"""

from __future__ import annotations

import math
import os

from ebrl.errors import UserError
from ebrl.spec import RunSpec, share, translate
from sim_adapters.tasks import TaskListError, is_multitask, multitask_tasks

SCHEDULERS = ("sync", "pipelined", "ebrl", "random")
# Device simulators (mjx:..., brax:...) have no host env stages to pipeline.
DEVICE_SCHEDULERS = ("sync", "ebrl", "random")
ALGORITHMS = ("ppo", "grpo")
RATIO_LEVELS = ("decision", "token")
GAUSSIAN_POLICIES = ("mlp", "cnn")  # Policies whose actions are a Gaussian with a mean (ref_kl_mode=mean).
LR_SCHEDULES = ("constant", "linear")
CORRECTIONS = ("decoupled_ppo", "vtrace")
RESOURCE_MODES = ("off", "auto", "naive", "manual")
PLACEMENTS = ("auto", "threads", "processes")
LEARNER_PRIORITIES = ("auto", "normal", "idle")
REWARD_TYPES = ("chunk", "action")  # sim_adapters/chunks.py
VLA_DECODES = ("parallel", "autoregressive")
# EnvPool takes int32 seeds, and env groups (seed + 7919 g), multi-task pools (seed + 1000 k) and
# per-env seeds add offsets to the run's seed: this headroom keeps every one of them an int32.
SEED_HEADROOM = 2**20
SEED_MAX = 2**31 - 1 - SEED_HEADROOM
MIN_RENDER_SIZE = 8  # Smaller frames leave the cnn's first conv nothing to see.


def _is_number(value) -> bool:
  """A real int or float (bool is an int to Python, never a number here)."""
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive(name: str, value) -> None:
  """NaN and inf pass a `> 0` test and then stall or poison a run, so they are rejected too."""
  if not _is_number(value) or not math.isfinite(value) or value <= 0:
    raise UserError(f"{name}={value!r} must be a positive finite number")


def _non_negative(name: str, value, note: str = "") -> None:
  if not _is_number(value) or not math.isfinite(value) or value < 0:
    raise UserError(f"{name}={value!r} must be a finite number >= 0{note}")


def _integer_at_least(name: str, value, low: int, note: str = "") -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < low:
    raise UserError(f"{name}={value!r} must be an integer >= {low}{note}")


def resolve(cfg) -> RunSpec:
  """The run `cfg` (a ConfigDict as ebrl/defaults.py builds it) asks for, checked and typed; UserError
  (one line naming the first bad value) otherwise. The checks that need the device count are
  `check_devices`': an MPS daemon must start before JAX counts devices."""
  validate(cfg)
  spec = translate(cfg)
  check_layout(spec)
  return spec


def validate(cfg) -> None:
  """Raises UserError for the first problem found in cfg's values (`resolve` runs it
  first; `check_layout` then checks the sizes derived from them, and `check_devices` those that
  need the device count, which waits until an MPS daemon, if any, has started)."""
  from policies import POLICY_NAMES
  from sim_adapters import UnknownEnvError, check_env_name, is_device_env

  if cfg.scheduler not in SCHEDULERS:
    raise UserError(f"unknown scheduler '{cfg.scheduler}'; valid: {', '.join(SCHEDULERS)}")
  device = is_device_env(cfg.env.name)
  _task_list(cfg.env.name)  # A bad task list is a UserError here; `translate` keeps the tasks.
  if device and cfg.scheduler not in DEVICE_SCHEDULERS:
    raise UserError(f"scheduler '{cfg.scheduler}' cannot drive device env '{cfg.env.name}'; "
                    f"valid: {', '.join(DEVICE_SCHEDULERS)}")
  if cfg.policy.name not in POLICY_NAMES:
    raise UserError(f"unknown policy '{cfg.policy.name}'; valid: {', '.join(POLICY_NAMES)}")
  if cfg.algorithm.name not in ALGORITHMS:
    raise UserError(f"unknown algorithm '{cfg.algorithm.name}'; valid: {', '.join(ALGORITHMS)}")
  if cfg.algorithm.lr_schedule not in LR_SCHEDULES:
    raise UserError(f"unknown algorithm.lr_schedule '{cfg.algorithm.lr_schedule}'; valid: {', '.join(LR_SCHEDULES)}")
  from ebrl.learner import OBS_NORM_UPDATES  # pylint: disable=g-import-not-at-top
  if cfg.algorithm.obs_norm_update not in OBS_NORM_UPDATES:
    raise UserError(f"unknown algorithm.obs_norm_update '{cfg.algorithm.obs_norm_update}'; valid: "
                    f"{', '.join(OBS_NORM_UPDATES)}")
  if cfg.algorithm.obs_norm_update == "every_step" and (cfg.scheduler != "sync" or device or
                                                        cfg.policy.name != "mlp"):
    raise UserError(f"algorithm.obs_norm_update 'every_step' (statistics counted at every env step) needs "
                    f"scheduler=sync, a host env and policy=mlp (got scheduler={cfg.scheduler}, env "
                    f"'{cfg.env.name}', policy={cfg.policy.name}); valid elsewhere: after, before")
  if cfg.algorithm.correction not in CORRECTIONS:
    raise UserError(f"unknown algorithm.correction '{cfg.algorithm.correction}'; valid: {', '.join(CORRECTIONS)}")
  for name in ("vtrace_rho_clip", "vtrace_c_clip", "behaviour_weight_clip"):
    _positive(f"algorithm.{name}", cfg.algorithm[name])
  for name in ("num_envs", "rollout_length", "total_env_steps"):
    _positive(name, cfg[name])
  for name in ("epochs", "num_minibatches", "learning_rate", "max_grad_norm"):
    _positive(f"algorithm.{name}", cfg.algorithm[name])
  _check_loss(cfg.algorithm)
  for name in ("gamma", "gae_lambda"):
    if not 0.0 <= cfg.algorithm[name] <= 1.0:
      raise UserError(f"algorithm.{name}={cfg.algorithm[name]!r} must be in [0, 1]")
  if not 0.0 < cfg.target_success <= 1.0:
    raise UserError(f"target_success={cfg.target_success!r} must be in (0, 1]")
  batch = cfg.num_envs * cfg.rollout_length
  if batch % cfg.algorithm.num_minibatches:
    raise UserError(f"algorithm.num_minibatches={cfg.algorithm.num_minibatches} must divide "
                    f"num_envs * rollout_length = {batch}")
  if cfg.scheduler == "ebrl" and (not isinstance(cfg.ebrl.num_groups, int) or cfg.ebrl.num_groups < 0):
    raise UserError(f"ebrl.num_groups={cfg.ebrl.num_groups!r} must be an integer >= 0 (0 = auto)")
  if cfg.scheduler == "ebrl":  # Every size the layout derives from must be a count first.
    for name in ("max_gen_batch", "segments_per_update", "recv_batch"):
      _integer_at_least(f"ebrl.{name}", cfg.ebrl[name], 0, " (0 = auto)")
    if not isinstance(cfg.ebrl.max_staleness, int) or cfg.ebrl.max_staleness < 0:
      raise UserError(f"ebrl.max_staleness={cfg.ebrl.max_staleness!r} must be an integer >= 0")
    _non_negative("ebrl.max_wait_ms", cfg.ebrl.max_wait_ms)
  if cfg.scheduler == "pipelined":
    _integer_at_least("pipelined.num_partitions", cfg.pipelined.num_partitions, 1)
  _check_chunks(cfg, device)
  _check_run(cfg)
  _check_env(cfg)
  _check_resources(cfg, device)
  _check_placement(cfg, device)
  _check_render_stage(cfg)
  _check_policy(cfg)
  _check_grpo_and_fine_tuning(cfg, device)
  for name in ("shift_at_s", "shift_sim_us"):
    _non_negative(f"env.{name}", cfg.env[name])
  if any(h <= 0 for h in cfg.policy.hidden):
    raise UserError(f"policy.hidden={tuple(cfg.policy.hidden)} must be positive layer sizes")
  try:
    check_env_name(cfg.env.name)
  except UnknownEnvError as e:
    raise UserError(str(e)) from None


def check_layout(spec: RunSpec) -> None:
  """The sizes `spec.layout` derived: groups that divide the envs, enough envs per task, and
  segments that split into minibatches (UserError, one line)."""
  layout = spec.layout
  groups = layout.num_groups
  key = {"ebrl": "ebrl.num_groups", "pipelined": "pipelined.num_partitions"}.get(spec.scheduler)
  if key:
    _positive(key, groups)
    if spec.num_envs % groups:
      raise UserError(f"{key}={groups} must divide num_envs={spec.num_envs}")
  if spec.tasks is not None and spec.num_envs < len(spec.tasks) * groups:
    raise UserError(f"num_envs={spec.num_envs} is too few for {spec.env.name}: it needs at least one env per task"
                    f"{' in each group' if groups > 1 else ''}, so at least {len(spec.tasks) * groups}")
  if spec.async_ is not None:
    per_group = layout.envs_per_group
    recv = spec.async_.recv_batch
    if recv > per_group:
      raise UserError(f"ebrl.recv_batch={recv} must be in [0, {per_group}] (envs per group; 0 = auto, "
                      f"{per_group} = every env of a group steps together)")
    segments = layout.segments_per_update
    minibatches = spec.algorithm.num_minibatches
    if (segments * spec.rollout_length) % minibatches:
      raise UserError(f"algorithm.num_minibatches={minibatches} must divide "
                      f"ebrl.segments_per_update * rollout_length = {segments * spec.rollout_length}")
    if spec.device_env and segments % per_group:  # A device group collects all its envs at once.
      raise UserError(f"ebrl.segments_per_update={segments} must be a multiple of the {per_group} envs per group "
                      f"(num_envs / ebrl.num_groups) for device env '{spec.env.name}'")


def check_processes(spec: RunSpec, num_processes: int, process_index: int) -> RunSpec:
  """This process's share of a run over `num_processes` processes (`ebrl.spec.share`), after
  checking that the run can be split so (UserError, one line). `num_envs` and
  `ebrl.segments_per_update` count every process's envs and segments."""
  if num_processes == 1:
    return spec
  many = f"a run over {num_processes} processes"
  unsupported = [
      (spec.device_env, f"env '{spec.env.name}' (a device simulator)", "a host env"),
      (spec.scheduler not in ("sync", "ebrl"), f"scheduler={spec.scheduler}", "scheduler=sync or ebrl"),
      (spec.resources != "off" and spec.async_ is not None, f"resources={spec.resources}",
       "resources=off (a plan sizes one process's machine, and each process would plan its own)"),
      (spec.learner_placement == "processes", "placement=processes", "placement=threads or auto"),
      (spec.algorithm.obs_norm_update == "every_step", "algorithm.obs_norm_update=every_step",
       "'after' or 'before' (per-step statistics would differ between processes)"),
  ]
  for bad, what, instead in unsupported:
    if bad:
      raise UserError(f"{what} is not supported in {many}; use {instead}")
  if spec.num_envs % num_processes:
    raise UserError(f"num_envs={spec.num_envs} must be divisible by --num_processes={num_processes} (num_envs counts "
                    "every process's envs)")
  segments = spec.async_.segments_per_update if spec.async_ is not None else 0
  if segments % num_processes:
    raise UserError(f"ebrl.segments_per_update={segments} must be divisible by --num_processes={num_processes} "
                    "(every process gives the same number of segments to each update)")
  local = share(spec, num_processes, process_index)
  if spec.algorithm.name == "grpo" and local.num_envs % spec.algorithm.group_size:
    raise UserError(f"algorithm.group_size={spec.algorithm.group_size} must divide each process's "
                    f"num_envs / {num_processes} = {local.num_envs} envs")
  try:
    check_layout(local)
  except UserError as e:
    raise UserError(f"each of the {num_processes} processes runs num_envs / {num_processes} = {local.num_envs} envs: "
                    f"{e}") from None
  return local


def check_devices(spec: RunSpec, num_devices: int):
  """The stages' local devices (config.devices on `num_devices`), after checking that the sizes
  split over them; UserError (one line) otherwise. Returns the DevicePlacement."""
  from ebrl.resources import devices as devices_lib  # pylint: disable=g-import-not-at-top

  placement = devices_lib.resolve(spec.devices, num_devices, spec.device_env)
  train_devices, sim_devices = len(placement.train), len(placement.sim)
  if spec.num_envs % train_devices:
    raise UserError(f"num_envs={spec.num_envs} must be divisible by the {train_devices} devices of the learner mesh")
  if spec.device_env and spec.async_ is None and spec.num_envs % sim_devices:
    raise UserError(f"num_envs={spec.num_envs} must be divisible by the {sim_devices} devices of the sim mesh")
  if spec.async_ is not None:
    segments, per_group = spec.layout.segments_per_update, spec.layout.envs_per_group
    if segments % train_devices:
      raise UserError(f"ebrl.segments_per_update={segments} must be divisible by the {train_devices} learner devices")
    if spec.device_env and per_group % sim_devices:
      raise UserError(f"num_envs / ebrl.num_groups = {per_group} envs per group must be divisible by the "
                      f"{sim_devices} devices of the sim mesh")
  return placement


def _task_list(name: str) -> tuple[str, ...] | None:
  """The tasks of a multi-task MetaWorld env (sim_adapters/tasks.py), None for any other env; a
  bad list (empty, a task repeated, a task MetaWorld does not have) is a UserError."""
  try:
    return multitask_tasks(name)
  except TaskListError as e:
    raise UserError(str(e)) from None


def _check_loss(a) -> None:
  """The PPO loss terms: a zero or negative scale silently trains on a wrong objective."""
  _positive("algorithm.reward_scale", a.reward_scale)
  _positive("algorithm.clip_eps", a.clip_eps)
  _non_negative("algorithm.value_clip_eps", a.value_clip_eps, " (0 = no value clipping)")
  for name in ("vf_coef", "ent_coef"):
    _non_negative(f"algorithm.{name}", a[name])
  _non_negative("algorithm.target_kl", a.target_kl, " (0 = no KL early stopping)")
  _positive("algorithm.value_norm_count", a.value_norm_count)


def _check_run(cfg) -> None:
  """Run-level values: the checkpointer keeps at least one, and every env seed stays an int32."""
  _integer_at_least("keep_checkpoints", cfg.keep_checkpoints, 1, " (checkpoints kept on disk)")
  if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool) or not 0 <= cfg.seed <= SEED_MAX:
    raise UserError(f"seed={cfg.seed!r} must be an integer in [0, {SEED_MAX}] (EnvPool seeds are int32, and "
                    "env groups and task pools add offsets to the seed)")


def _check_env(cfg) -> None:
  """Env construction values EnvPool would reject with a traceback, or stragglers that never end a step."""
  e = cfg.env
  _integer_at_least("env.render_size", e.render_size, MIN_RENDER_SIZE, " (pixels per image side)")
  _integer_at_least("env.num_threads", e.num_threads, 0, " (0 = one per usable core)")
  _integer_at_least("env.max_episode_steps", e.max_episode_steps, 0, " (0 = the task's own limit)")
  if not _is_number(e.straggler_fraction) or not 0.0 <= e.straggler_fraction <= 1.0:
    raise UserError(f"env.straggler_fraction={e.straggler_fraction!r} must be in [0, 1]")
  if not _is_number(e.straggler_slowdown) or not 1.0 <= e.straggler_slowdown < math.inf:
    raise UserError(f"env.straggler_slowdown={e.straggler_slowdown!r} must be a finite number >= 1")
  _non_negative("env.straggler_step_ms", e.straggler_step_ms)
  _check_success_options(cfg)


def _check_success_options(cfg) -> None:
  """env.success_bonus / env.end_on_success / env.dense_reward_scale (sim_adapters/success.py): valid
  values, on MetaWorld host envs."""
  e = cfg.env
  _non_negative("env.success_bonus", e.success_bonus, " (reward added on success steps; 0 = none)")
  if not isinstance(e.end_on_success, bool):
    raise UserError(f"env.end_on_success={e.end_on_success!r} must be True or False")
  _non_negative("env.dense_reward_scale", e.dense_reward_scale,
                " (factor on the env's shaped reward: 1 = as is, 0 = the success bonus alone)")
  if e.dense_reward_scale == 0 and not e.success_bonus:
    raise UserError("env.dense_reward_scale=0 with env.success_bonus=0 leaves no reward to learn from; "
                    "set env.success_bonus > 0 (e.g. 1000) or dense_reward_scale > 0")
  on = [f"env.{k}={e[k]!r}" for k in ("success_bonus", "end_on_success") if e[k]]
  if e.dense_reward_scale != 1.0:
    on.append(f"env.dense_reward_scale={e.dense_reward_scale!r}")
  if on and not e.name.startswith("MetaWorld/"):
    raise UserError(f"{' and '.join(on)} applies to MetaWorld host envs (MetaWorld/<Task>-v3, MT10, MT50), not "
                    f"'{e.name}'; leave success_bonus=0, end_on_success=False and dense_reward_scale=1")
  chunk = cfg.policy.get("chunk_size", 1)
  if e.success_bonus and isinstance(chunk, int) and chunk > 1 and e.reward_type == "chunk":
    raise UserError(f"env.success_bonus={e.success_bonus!r} is a per-step reward, but with policy.chunk_size={chunk} "
                    f"and env.reward_type='chunk' a decision's reward sums {chunk} steps and is discounted once, so "
                    f"staying near the goal is worth {chunk}x what it would be per step and can outweigh success; "
                    "set env.reward_type=action")
  if e.end_on_success and cfg.algorithm.name == "grpo":
    raise UserError("env.end_on_success=True ends the episodes of a same-seed group at different steps, so "
                    "algorithm.name=grpo would compare envs in different episodes; use end_on_success=False")


def _check_fine_tuning(cfg) -> None:
  """The fine-tuning knobs: critic warm-up by explained variance, the KL's mode, actor and critic rates,
  the demonstration term and its demos."""
  from ebrl.learner import REF_KL_MODES  # pylint: disable=g-import-not-at-top

  a = cfg.algorithm
  if not _is_number(a.critic_warmup_ev) or not 0.0 <= a.critic_warmup_ev < 1.0:
    raise UserError(f"algorithm.critic_warmup_ev={a.critic_warmup_ev!r} must be in [0, 1) (the explained variance "
                    "that ends the critic warm-up; 0 = a fixed count of updates)")
  if a.critic_warmup_ev > 0 and a.critic_warmup_updates < 1:
    raise UserError(f"algorithm.critic_warmup_ev={a.critic_warmup_ev} needs algorithm.critic_warmup_updates >= 1, "
                    "its cap (got 0)")
  if a.ref_kl_mode not in REF_KL_MODES:
    raise UserError(f"algorithm.ref_kl_mode={a.ref_kl_mode!r} is not one of {', '.join(REF_KL_MODES)}")
  if a.ref_kl_mode == "mean" and a.ref_kl_coef > 0 and cfg.policy.name not in GAUSSIAN_POLICIES:
    raise UserError(f"algorithm.ref_kl_mode=mean compares a Gaussian policy's means ({', '.join(GAUSSIAN_POLICIES)}); "
                    f"policy.name='{cfg.policy.name}' needs ref_kl_mode=sample")
  _non_negative("algorithm.actor_learning_rate", a.actor_learning_rate, " (0 = learning_rate)")
  _non_negative("algorithm.critic_learning_rate", a.critic_learning_rate, " (0 = learning_rate)")
  _non_negative("algorithm.bc_coef", a.bc_coef, " (0 = no demonstration term)")
  if not _is_number(a.bc_decay) or not 0.0 < a.bc_decay <= 1.0:
    raise UserError(f"algorithm.bc_decay={a.bc_decay!r} must be in (0, 1] (the demonstration weight's factor per "
                    "update; 1 = constant)")
  _integer_at_least("algorithm.bc_batch_size", a.bc_batch_size, 1, " (demo steps per minibatch step)")
  if a.bc_coef > 0:
    bc_demos_path(a.bc_coef, a.bc_demos, cfg.warm_start)  # A one-line error where there are none.


def bc_demos_path(bc_coef: float, bc_demos: str, warm_start: str) -> str:
  """The demo directory of the demonstration term: algorithm.bc_demos, or the demos the warm start
  was pre-trained on (its sft.json's "demos"). UserError (one line) where there is none."""
  import json  # pylint: disable=g-import-not-at-top

  path = bc_demos
  if not path:
    meta = os.path.join(warm_start, "sft.json") if warm_start else ""
    if not meta or not os.path.isfile(meta):
      raise UserError(f"algorithm.bc_coef={bc_coef} needs demonstrations: set --config.algorithm.bc_demos=<launch.demos "
                      "directory>, or --config.warm_start=<a launch.sft --out directory> whose sft.json names them "
                      f"(warm_start='{warm_start}' has none)")
    with open(meta) as f:
      path = json.load(f).get("demos", "")
  if not os.path.isfile(os.path.join(path, "manifest.json")):
    raise UserError(f"algorithm.bc_demos: '{path}' is not a demo directory (no manifest.json); record one with "
                    "python -m launch.demos")
  return path


def _check_grpo_and_fine_tuning(cfg, device: bool) -> None:
  if cfg.algorithm.name == "grpo":
    g = cfg.algorithm.group_size
    if not isinstance(g, int) or isinstance(g, bool) or g < 2:
      raise UserError(f"algorithm.group_size={g!r} must be an integer >= 2 for algorithm.name=grpo "
                      "(envs per same-seed group)")
    if cfg.num_envs % g:
      raise UserError(f"algorithm.group_size={g} must divide num_envs={cfg.num_envs}")
    if cfg.scheduler != "sync":
      raise UserError(f"algorithm.name=grpo needs scheduler=sync (got '{cfg.scheduler}'): it compares the envs of "
                      "a group at the same step, which the other schedulers do not keep aligned")
    if device or is_multitask(cfg.env.name):
      raise UserError(f"algorithm.name=grpo needs one EnvPool with per-env seeds; env '{cfg.env.name}' "
                      "is not supported")
  a = cfg.algorithm
  _integer_at_least("algorithm.critic_warmup_updates", a.critic_warmup_updates, 0,
                    " (updates that train only the critic; 0 = none)")
  _non_negative("algorithm.ref_kl_coef", a.ref_kl_coef, " (0 = no KL penalty)")
  if a.ref_kl_coef > 0 and not cfg.warm_start:
    raise UserError(f"algorithm.ref_kl_coef={a.ref_kl_coef} penalises divergence from the warm-start policy, but "
                    "warm_start is empty; set --config.warm_start=<launch.sft --out dir> or ref_kl_coef=0")
  if a.ref_kl_coef > 0 and a.obs_norm_update == "every_step":
    raise UserError(f"algorithm.ref_kl_coef={a.ref_kl_coef} needs raw observations in the batch; "
                    "algorithm.obs_norm_update='every_step' stores them normalised (valid with it: after, before)")
  _check_fine_tuning(cfg)
  if a.ratio_level not in RATIO_LEVELS:
    raise UserError(f"algorithm.ratio_level={a.ratio_level!r} is not one of {', '.join(RATIO_LEVELS)}")
  if a.ratio_level == "token" and cfg.policy.name not in ("vla", "flow"):
    raise UserError(f"algorithm.ratio_level=token needs a policy whose decision is a sequence (vla: action "
                    f"tokens, flow: denoising steps), got policy.name='{cfg.policy.name}'; use ratio_level=decision")
  if a.ratio_level == "token" and a.correction == "vtrace":
    raise UserError("algorithm.ratio_level=token takes each token's ratio against the update's proximal policy, "
                    "which correction=vtrace does not use; use correction=decoupled_ppo")
  _integer_at_least("eval_episodes", cfg.eval_episodes, 0, " (evaluation episodes at start and end; 0 = none)")
  if cfg.warm_start and not os.path.isdir(cfg.warm_start):
    raise UserError(f"warm_start='{cfg.warm_start}' is not a directory; give a launch.train workdir (or one of "
                    "its checkpoints) or a launch.sft --out directory")


def _check_policy(cfg) -> None:
  p = cfg.policy
  if p.name == "vla":
    if p.decode not in VLA_DECODES:
      raise UserError(f"unknown policy.decode '{p.decode}'; valid: {', '.join(VLA_DECODES)}")
    for key in ("bins", "width", "depth", "heads"):
      if not isinstance(p[key], int) or p[key] < (2 if key == "bins" else 1):
        raise UserError(f"policy.{key}={p[key]!r} must be an integer >= {2 if key == 'bins' else 1}")
    if p.width % p.heads:
      raise UserError(f"policy.width={p.width} must be a multiple of policy.heads={p.heads}")
    hidden = p.vla_critic_hidden
    if not _is_layer_sizes(hidden):
      raise UserError(f"policy.vla_critic_hidden={hidden!r} must be positive integer layer sizes, e.g. (256, 256), "
                      "or () for a linear value head on the trunk")
  if p.name == "flow":
    if not isinstance(p.flow_steps, int) or p.flow_steps < 1:
      raise UserError(f"policy.flow_steps={p.flow_steps!r} must be an integer >= 1")
    lo = p.flow_min_log_std
    if not _is_number(lo) or not -math.inf < lo < 0.0:
      raise UserError(f"policy.flow_min_log_std={lo!r} must be a finite number below 0 (the log noise floor)")
    if not _is_number(p.flow_init_log_std) or not lo < p.flow_init_log_std < 0.0:
      raise UserError(f"policy.flow_init_log_std={p.flow_init_log_std!r} must be in ({lo:g}, 0) "
                      f"(above policy.flow_min_log_std={lo!r})")
    hidden = p.flow_hidden
    if not hidden or not _is_layer_sizes(hidden):
      raise UserError(f"policy.flow_hidden={hidden!r} must be positive integer layer sizes, e.g. (256, 256)")
    k = p.flow_finetune_steps
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= p.flow_steps:
      raise UserError(f"policy.flow_finetune_steps={k!r} must be an integer in [0, policy.flow_steps={p.flow_steps}] "
                      "(the last denoising steps fine-tuned; 0 = all)")
  if p.name == "cnn" and any(c <= 0 for c in p.channels):
    raise UserError(f"policy.channels={tuple(p.channels)} must be positive channel counts")
  for key in ("min_std", "max_std"):
    _non_negative(f"policy.{key}", p[key], " (the mlp / cnn action std bound; 0.0 = none)")
  if 0 < p.max_std <= p.min_std:
    raise UserError(f"policy.min_std={p.min_std!r} must be below policy.max_std={p.max_std!r} "
                    "(or set either to 0.0 for no bound on that side)")
  if not isinstance(p.detach_critic, bool):
    raise UserError(f"policy.detach_critic={p.detach_critic!r} must be True or False")


def _is_layer_sizes(hidden) -> bool:
  """A tuple or list of positive integers (not bools); () is one too."""
  return isinstance(hidden, (tuple, list)) and all(isinstance(h, int) and not isinstance(h, bool) and h > 0
                                                   for h in hidden)


def _check_render_stage(cfg) -> None:
  e = cfg.env
  if e.render_stage and not e.from_pixels:
    raise UserError("env.render_stage=True draws pixels beside the state: it needs env.from_pixels=True")
  if e.render_stage and is_multitask(e.name):
    raise UserError(f"env.render_stage=True draws one EnvPool's envs; {e.name} has one pool per task "
                    "(use env.render_stage=False for its pixel pools)")


def _check_chunks(cfg, device: bool) -> None:
  k = cfg.policy.chunk_size
  if not isinstance(k, int) or isinstance(k, bool) or k < 1:
    raise UserError(f"policy.chunk_size={k!r} must be an integer >= 1 (actions per decision)")
  if cfg.env.reward_type not in REWARD_TYPES:
    raise UserError(f"unknown env.reward_type '{cfg.env.reward_type}'; valid: {', '.join(REWARD_TYPES)}")
  if k > 1 and device:
    raise UserError(f"policy.chunk_size={k} runs chunks in host simulators; device env '{cfg.env.name}' "
                    "steps one action per call (use chunk_size=1)")


def _check_placement(cfg, device: bool) -> None:
  if cfg.placement not in PLACEMENTS:
    raise UserError(f"unknown placement '{cfg.placement}'; valid: {', '.join(PLACEMENTS)}")
  if cfg.placement == "processes" and cfg.algorithm.bc_coef > 0:
    raise UserError(f"placement=processes with algorithm.bc_coef={cfg.algorithm.bc_coef}: the demonstration term "
                    "runs in the learner thread only; use placement=threads or auto")
  if cfg.placement == "processes" and (cfg.scheduler != "ebrl" or device):
    raise UserError(f"placement=processes runs the learner of scheduler=ebrl on host envs in a process of its "
                    f"own; scheduler={cfg.scheduler} on '{cfg.env.name}' runs in one process (use placement=threads)")


def _check_resources(cfg, device: bool) -> None:
  if cfg.resources not in RESOURCE_MODES:
    raise UserError(f"unknown resources '{cfg.resources}'; valid: {', '.join(RESOURCE_MODES)}")
  if cfg.resources != "off" and cfg.scheduler != "ebrl":
    raise UserError(f"resources={cfg.resources} places the stages of scheduler=ebrl; "
                    f"scheduler={cfg.scheduler} on '{cfg.env.name}' keeps its fixed layout (use resources=off)")
  if cfg.resources in ("naive", "manual") and device:
    raise UserError(f"resources={cfg.resources} splits CPU cores between host-env stages; the device simulator "
                    f"'{cfg.env.name}' fuses sim and generation on its devices (use resources=auto or off)")
  q = cfg.quotas
  if q.control_interval_s < 0:
    raise UserError(f"quotas.control_interval_s={q.control_interval_s!r} must be >= 0 (0 = no runtime feedback)")
  _non_negative("quotas.overlap_probe_s", q.overlap_probe_s)
  sm = q.learner_sm_percent
  if isinstance(sm, bool) or not isinstance(sm, int) or not 0 <= sm <= 100:
    raise UserError(f"quotas.learner_sm_percent={sm!r} must be an integer in [0, 100] (0 = from the profile)")
  if q.learner_priority not in LEARNER_PRIORITIES:
    raise UserError(f"unknown quotas.learner_priority '{q.learner_priority}'; valid: {', '.join(LEARNER_PRIORITIES)}")
  if not isinstance(q.sim_threads, int) or q.sim_threads < 0:
    raise UserError(f"quotas.sim_threads={q.sim_threads!r} must be an integer >= 0 (0 = one per sim core)")
  if q.profile and not os.path.isfile(q.profile):
    raise UserError(f"quotas.profile='{q.profile}' is not a file; make one with python -m launch.profile --out=...")
  if cfg.resources == "manual":
    from ebrl.resources.manager import manual_layout
    try:
      manual_layout(cfg, tuple(sorted(os.sched_getaffinity(0))))
    except ValueError as e:
      raise UserError(str(e)) from None
