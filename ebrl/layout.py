"""RunLayout: every size a run derives from its config, computed once.

Why one place: validation, the env builders, the learner's schedule, the
resource planner and every scheduler need the same numbers (how many env
groups, how many envs each, how many samples an update takes, how many
updates the budget pays for). Each derived once here, nothing else can
disagree with it. The module sits at the bottom of the import graph: it reads
a config mapping and, when the resource manager planned the run, its plan
(anything with `num_groups`, `recv_batch`, `max_gen_batch`, `sim_threads`). Whether an env is a
multi-task MetaWorld list it asks sim_adapters/tasks.py, which imports nothing from the project.

What each field means for each scheduler:
* sync, random: one group of all envs, one update per `rollout_length` steps of every env.
* pipelined: `pipelined.num_partitions` groups ("env partitions") that take turns within a rollout.
* ebrl: `ebrl.num_groups` groups stepping independently; an update takes
  `segments_per_update` finished segments of `rollout_length` steps.
"""

from __future__ import annotations

import dataclasses
import math
import os

from sim_adapters.tasks import is_multitask


def envs_per_group(num_envs: int, num_groups: int) -> int:
  """Envs in each of num_groups equal groups (validation rejects a remainder)."""
  return num_envs // num_groups


def _num_groups(cfg) -> int:
  """ebrl.num_groups = 0 picks 1 for a multi-task MetaWorld env (MT10, MT50, a list), whose task
  pools already run independently of each other (one receiver thread each), so splitting them
  further only shrinks every pool's batches; 2 otherwise, so one group simulates while the other's
  actions are generated."""
  if cfg.scheduler == "ebrl":
    return cfg.ebrl.num_groups or (1 if is_multitask(cfg.env.name) else 2)
  if cfg.scheduler == "pipelined":
    return cfg.pipelined.num_partitions
  return 1


def _recv_batch(cfg, per_group: int) -> int:
  """Envs an ebrl group's recv returns (ebrl.recv_batch = 0): half a group for one EnvPool, so
  envs return in two waves that overlap the other group's generation; all but one env of a
  multi-task env's group, whose task pools each step their envs together: the tasks' uneven step
  times already stagger their returns, and a policy whose call costs more than a task's step
  (the flow) loses more to half-size calls than overlap gains (BENCHMARKS.md)."""
  if cfg.ebrl.recv_batch:
    return cfg.ebrl.recv_batch
  return max(1, per_group - 1 if is_multitask(cfg.env.name) else per_group // 2)


@dataclasses.dataclass(frozen=True)
class RunLayout:
  """The sizes of one run (see the module docstring)."""

  num_envs: int
  num_groups: int
  envs_per_group: int
  rollout_length: int  # Steps (decisions) per env between updates / per segment.
  segments_per_update: int  # Env segments of rollout_length steps in one update.
  samples_per_update: int
  total_updates: int  # Updates the step budget pays for; the rate schedule decays over them.
  recv_batch: int | None  # ebrl on host envs: envs a group's recv returns; None elsewhere.
  max_gen_batch: int | None  # ebrl on host envs: rows the sampler merges into one call.
  gen_batch_fixed: bool  # ebrl.max_gen_batch set by the user: a re-plan keeps it.
  sim_threads: int  # EnvPool worker threads of each group's pool (0 = one per usable core).
  thread_affinity_offset: int  # EnvPool's first pinned core; -1 = not pinned.
  chunk_size: int  # Actions per decision.
  gamma: float  # The learner's discount per transition (one transition = one chunk).

  @classmethod
  def from_config(cls, cfg, plan=None, device_env: bool = False) -> "RunLayout":
    """The layout of `cfg` (validated, or being validated: sizes that do not divide are caught by
    validation before anything reads them); `plan` is the resource manager's, if any."""
    groups = plan.num_groups if plan is not None else _num_groups(cfg)
    per_group = envs_per_group(cfg.num_envs, max(1, groups))
    ebrl_host = cfg.scheduler == "ebrl" and not device_env
    recv = max_gen = None
    if ebrl_host:
      recv = plan.recv_batch if plan is not None else _recv_batch(cfg, per_group)
      # Default: every group's ready batch at once, so a full batch never waits out max_wait.
      max_gen = cfg.ebrl.max_gen_batch or (plan.max_gen_batch if plan is not None else recv * groups)
    segments = (cfg.ebrl.segments_per_update or cfg.num_envs) if cfg.scheduler == "ebrl" else cfg.num_envs
    samples = segments * cfg.rollout_length
    threads = cfg.env.num_threads
    if plan is not None:  # The plan sizes every pool; its workers are pinned to the sim quota.
      threads = plan.sim_threads
    elif groups > 1:  # Groups share the cores one pool would have had.
      threads = max(1, (threads or len(os.sched_getaffinity(0))) // groups)
    k = cfg.policy.chunk_size
    # With reward_type=action a chunk's reward is already discounted per action, so the next chunk
    # is K actions away: gamma^K (the semi-MDP view). reward_type=chunk treats a chunk as one step.
    gamma = cfg.algorithm.gamma ** k if k > 1 and cfg.env.reward_type == "action" else cfg.algorithm.gamma
    return cls(num_envs=cfg.num_envs, num_groups=groups, envs_per_group=per_group,
               rollout_length=cfg.rollout_length, segments_per_update=segments, samples_per_update=samples,
               total_updates=total_updates(samples, cfg.total_env_steps), recv_batch=recv, max_gen_batch=max_gen,
               gen_batch_fixed=bool(cfg.ebrl.max_gen_batch),
               sim_threads=threads, thread_affinity_offset=plan.thread_affinity_offset if plan is not None else -1,
               chunk_size=k, gamma=gamma)

  def updates_for(self, total_env_steps: int) -> int:
    """Updates a budget other than the config's pays for (benchmarks and tests run shorter)."""
    return total_updates(self.samples_per_update, total_env_steps)


def total_updates(samples_per_update: int, total_env_steps: int) -> int:
  """Updates a budget of total_env_steps pays for (at least one)."""
  return max(1, math.ceil(total_env_steps / samples_per_update))
