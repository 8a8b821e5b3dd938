"""Recording MetaWorld expert demonstrations through EBRL's own adapters.

Why through the adapters: a policy pre-trained on these demos meets, in RL, exactly the observations
recorded here (the `state` vector, a multi-task env's one-hot `task`, the render stage's `pixels`),
from the same env names and seeds a run uses. Every env steps in one synchronous batch; each env's
rows fill a buffer of its own episode, vectorised over envs: the row an automatic reset produces
(`StepBatch.reset_step`) starts the next episode and is never a step of one. An episode succeeded
when `success` was set after any of its actions, as the run's episode tracker counts it. Episodes
are numbered per task in the order they finish (rows come back in env id order); the first
`episodes_per_task` of each task are the recording, and all of them count in the expert's success,
kept or not. The same request records the same bytes: env seeds and the noise generator derive
from `seed` alone.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import shutil
import time

import numpy as np

from ebrl.demos import format as fmt
from ebrl.demos.experts import EXPERT_PACKAGE, ExpertActor, expert_classes, expert_version
from ebrl.errors import UserError
from ebrl.validation import MIN_RENDER_SIZE, SEED_MAX
from ebrl.workdir import check_writable
from sim_adapters.tasks import METAWORLD_INSTRUCTIONS, MT50, PREFIX, TaskListError, multitask_tasks

DEFAULT_ENVS_PER_TASK = 10
SHARD_BYTES = 64 << 20  # What episodes_per_shard=0 fills a shard up to, uncompressed: one shard is what a reader holds.


@dataclasses.dataclass(frozen=True)
class RecordRequest:
  """What `launch.demos` asks for (its flags, one field each)."""

  env: str
  episodes_per_task: int
  out: str
  seed: int = 0
  envs_per_task: int = 0  # 0: min(episodes_per_task, DEFAULT_ENVS_PER_TASK).
  action_noise: float = 0.0  # Std of the Gaussian added to each expert action (then clipped).
  keep_failed: bool = False
  max_episode_steps: int = 0  # 0: the task's own limit (500).
  from_pixels: bool = False  # State and the render stage's frames.
  render_size: int = 64
  episodes_per_shard: int = 0  # 0: as many as fit in SHARD_BYTES.
  num_threads: int = 0  # EnvPool workers (0: EnvPool's default; one per task pool on multi-task envs).
  overwrite: bool = False

  @property
  def num_envs_per_task(self) -> int:
    return self.envs_per_task or min(self.episodes_per_task, DEFAULT_ENVS_PER_TASK)


def env_tasks(env: str) -> tuple[str, ...]:
  """The MetaWorld tasks `env` records; UserError (one line) for any other env name."""
  try:
    tasks = multitask_tasks(env)
  except TaskListError as e:
    raise UserError(str(e)) from None
  if tasks is not None:
    return tasks
  task = env[len(PREFIX):] if env.startswith(PREFIX) else None
  if task in METAWORLD_INSTRUCTIONS:
    return (task,)
  names = [PREFIX + t for t in MT50] + ["MetaWorld/MT10", "MetaWorld/MT50"]
  close = difflib.get_close_matches(env, names, n=3, cutoff=0.6)
  hint = f"closest: {', '.join(close)}" if close else "e.g. MetaWorld/Reach-v3, MetaWorld/MT10, MetaWorld/MT50"
  raise UserError(f"--env='{env}' is not a MetaWorld env the experts can record (MetaWorld/<Task>-v3, "
                  f"MetaWorld/MT10, MetaWorld/MT50, MetaWorld/MT:<task>,<task>); {hint}")


def _foreign_files(out: str) -> list[str]:
  return sorted(set(os.listdir(out)) - {fmt.MANIFEST, fmt.SHARD_DIR})


def check(req: RecordRequest) -> tuple[str, ...]:
  """Every mistake in `req` as a one-line UserError, before any env is built; returns the tasks."""
  tasks = env_tasks(req.env)
  if req.episodes_per_task <= 0:
    raise UserError(f"--episodes_per_task={req.episodes_per_task} must be positive")
  if req.render_size < MIN_RENDER_SIZE:
    raise UserError(f"--render_size={req.render_size} must be at least {MIN_RENDER_SIZE}")
  for name, value in (("envs_per_task", req.envs_per_task), ("max_episode_steps", req.max_episode_steps),
                      ("episodes_per_shard", req.episodes_per_shard), ("num_threads", req.num_threads)):
    if value < 0:
      raise UserError(f"--{name}={value} must be >= 0 (0: the default)")
  if not 0 <= req.seed <= SEED_MAX:
    raise UserError(f"--seed={req.seed} must be an integer in [0, {SEED_MAX}] (EnvPool seeds are int32, and task "
                    "pools add offsets to the seed)")
  if not np.isfinite(req.action_noise) or req.action_noise < 0:
    raise UserError(f"--action_noise={req.action_noise} must be a finite std >= 0")
  if req.from_pixels and len(tasks) > 1:
    raise UserError(f"--from_pixels records the render stage's frames, which draws one task's pool; '{req.env}' "
                    "has one pool per task: record pixels per task (--env=MetaWorld/<Task>-v3)")
  if not req.out:
    raise UserError("--out is required: the directory to write the demos to")
  if os.path.exists(req.out):
    if not os.path.isdir(req.out):
      raise UserError(f"--out='{req.out}' is a file; give a directory")
    if os.listdir(req.out):
      if not req.overwrite:
        raise UserError(f"--out='{req.out}' is not empty; choose a new directory, or pass --overwrite to replace "
                        "the demos it holds")
      foreign = _foreign_files(req.out)
      if foreign:
        raise UserError(f"--out='{req.out}' holds files that are not demos ({', '.join(foreign[:3])}); "
                        "--overwrite replaces only a demo directory: choose a new directory")
  check_writable(req.out, flag="out")
  expert_classes(tasks)  # A task without an expert fails here, before any env exists.
  return tasks


def episodes_per_shard(spec) -> int:
  """How many of `spec`'s longest episodes fill SHARD_BYTES (at least one)."""
  step = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in spec.obs.values())
  step += 4 * (2 * spec.action_dim + 2)  # actions, expert_actions, rewards, success
  return max(1, SHARD_BYTES // (step * spec.max_episode_steps))


def _clear(out: str) -> None:
  """Removes a demo directory's contents (checked to be only that): the manifest first, so an
  interrupted recording never leaves an old manifest beside new shards."""
  manifest = os.path.join(out, fmt.MANIFEST)
  if os.path.exists(manifest):
    os.remove(manifest)
  shutil.rmtree(os.path.join(out, fmt.SHARD_DIR), ignore_errors=True)


class _Buffers:
  """Each env's episode so far, [num_envs, T + 1, ...] per array (T actions, T + 1 observations)."""

  def __init__(self, spec, num_envs: int, horizon: int):
    self.obs = {k: np.zeros((num_envs, horizon + 1) + tuple(v.shape), v.dtype) for k, v in spec.obs.items()}
    self.actions = np.zeros((num_envs, horizon, spec.action_dim), np.float32)
    self.expert_actions = np.zeros_like(self.actions)
    self.rewards = np.zeros((num_envs, horizon), np.float32)
    self.success = np.zeros((num_envs, horizon), np.float32)
    self.t = np.zeros(num_envs, np.int64)  # Actions taken in the current episode.

  def episode(self, i: int) -> dict:
    t = int(self.t[i])
    return dict(obs={k: v[i, :t].copy() for k, v in self.obs.items()},
                final_obs={k: v[i, t].copy() for k, v in self.obs.items()},
                actions=self.actions[i, :t].copy(), expert_actions=self.expert_actions[i, :t].copy(),
                rewards=self.rewards[i, :t].copy(), success=self.success[i, :t].copy())


@dataclasses.dataclass
class RecordResult:
  manifest: dict
  wall_s: float  # From the first env built to the manifest written.
  loop_s: float  # Stepping, the experts and writing shards: what env_steps_per_s divides by.
  env_steps: int  # Every env step simulated, discarded episodes' included.

  @property
  def env_steps_per_s(self) -> float:
    return self.env_steps / max(self.loop_s, 1e-9)


def record(req: RecordRequest, progress: bool = True) -> RecordResult:
  """Records `req` (checked first) into req.out and returns its manifest and rate."""
  from sim_adapters import make_adapter  # pylint: disable=g-import-not-at-top
  from sim_adapters.base import gather_all  # pylint: disable=g-import-not-at-top

  tasks = check(req)
  experts = ExpertActor(tasks)
  _clear(req.out)
  os.makedirs(os.path.join(req.out, fmt.SHARD_DIR), exist_ok=True)
  per_task = req.num_envs_per_task
  n = per_task * len(tasks)
  start = time.monotonic()
  adapter = make_adapter(req.env, n, num_threads=req.num_threads, seed=req.seed,
                         max_episode_steps=req.max_episode_steps, from_pixels=req.from_pixels,
                         render_size=req.render_size, render_stage=req.from_pixels)
  try:
    task_ids = np.asarray(getattr(adapter, "task_ids", np.zeros(n, np.int32)), np.int32)
    spec = adapter.spec
    bufs = _Buffers(spec, n, spec.max_episode_steps)
    rng = np.random.default_rng(req.seed)
    low, high = spec.action_low, spec.action_high
    attempted = np.zeros(len(tasks), np.int64)
    successes = np.zeros(len(tasks), np.int64)
    kept_eps = np.zeros(len(tasks), np.int64)
    kept_steps = np.zeros(len(tasks), np.int64)
    nan_resets, env_steps, pending, shards = 0, 0, [], []
    per_shard = req.episodes_per_shard or episodes_per_shard(spec)

    def flush() -> None:
      path = fmt.shard_name(len(shards))
      fmt.write_npz(os.path.join(req.out, path), fmt.pack_shard(pending))
      shards.append(dict(file=path, episodes=len(pending), steps=int(sum(len(e["actions"]) for e in pending))))
      pending.clear()

    total = req.episodes_per_task * len(tasks)
    bar = _progress_bar(total, req.env, progress)
    loop_start = time.monotonic()  # The rate counts stepping (and the experts), not building the envs.
    adapter.reset()
    b = gather_all(adapter, n)
    live = ~b.done  # Envs in an episode (a first row that ended at once would be a NaN reset).
    ids = np.arange(n)
    for k, v in b.obs.items():
      bufs.obs[k][ids, 0] = v
    while (attempted < req.episodes_per_task).any():
      act = live & (attempted[task_ids] < req.episodes_per_task)  # Rows whose action is recorded.
      expert = np.zeros((n, spec.action_dim), np.float32)
      if act.any():
        expert[act] = np.clip(experts.act(b.obs["state"][act], task_ids[act]), low, high)
      executed = expert + rng.normal(0.0, req.action_noise, expert.shape) if req.action_noise else expert
      executed = np.clip(executed, low, high).astype(np.float32)
      t = bufs.t
      bufs.actions[live, t[live]] = executed[live]
      bufs.expert_actions[live, t[live]] = expert[live]
      b = adapter.step(executed)
      env_steps += n
      if not np.array_equal(b.env_ids, ids):
        raise RuntimeError(f"{req.env} returned env ids {b.env_ids[:8].tolist()}... from a synchronous step")
      step = live & ~b.reset_step  # Rows that complete a transition of the episode in progress.
      bufs.rewards[step, t[step]] = b.reward[step]
      bufs.success[step, t[step]] = b.success[step]
      t[step] += 1
      for k, v in b.obs.items():
        bufs.obs[k][step, t[step]] = v[step]
      new = b.reset_step & ~b.done  # First rows of new episodes (after an episode ended, or a NaN reset).
      t[new] = 0
      for k, v in b.obs.items():
        bufs.obs[k][new, 0] = v[new]
      aborted = live & b.reset_step  # Non-finite physics ended the episode in progress.
      finished = 0
      for i in np.flatnonzero((step & b.done) | aborted):
        k = int(task_ids[i])
        if attempted[k] >= req.episodes_per_task:
          continue
        ep = bufs.episode(i)
        won = bool(ep["success"].max(initial=0.0) > 0)
        index = int(attempted[k])
        attempted[k] += 1
        successes[k] += won
        nan_resets += int(aborted[i])
        finished += 1
        if aborted[i] or not (won or req.keep_failed):
          continue
        ep.update(episode_task=k, episode_instruction=k, episode_success=won,
                  episode_return=float(ep["rewards"].sum()), episode_env=int(i), episode_index=index)
        pending.append(ep)
        kept_eps[k] += 1
        kept_steps[k] += len(ep["actions"])
        if len(pending) >= per_shard:
          flush()
      live = ~b.done
      if finished:
        bar.set_postfix_str(f"expert success {successes.sum() / attempted.sum():.2f}, "
                            f"{env_steps / (time.monotonic() - loop_start):.0f} env steps/s", refresh=False)
        bar.update(finished)
    if pending:
      flush()
    bar.close()
    loop_s = time.monotonic() - loop_start
  finally:
    adapter.close()
  manifest = _manifest(req, tasks, spec, experts, attempted, successes, kept_eps, kept_steps, nan_resets, shards,
                       per_shard)
  fmt.write_manifest(req.out, manifest)
  return RecordResult(manifest, time.monotonic() - start, loop_s, env_steps)


def _progress_bar(total: int, env: str, enabled: bool):
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top

  return tqdm(total=total, desc=f"demos {env}", unit="episode", disable=not enabled, dynamic_ncols=True)


def _manifest(req, tasks, spec, experts, attempted, successes, kept_eps, kept_steps, nan_resets, shards,
              per_shard) -> dict:
  by_task = {t: dict(episodes=int(attempted[k]), successes=int(successes[k]),
                     expert_success=float(successes[k] / attempted[k]) if attempted[k] else None,
                     kept=int(kept_eps[k]), steps=int(kept_steps[k])) for k, t in enumerate(tasks)}
  return dict(
      format=fmt.FORMAT, version=fmt.FORMAT_VERSION, env=req.env, tasks=list(tasks),
      instructions=[METAWORLD_INSTRUCTIONS[t] for t in tasks],
      observation={k: dict(shape=list(v.shape), dtype=np.dtype(v.dtype).name) for k, v in spec.obs.items()},
      action=dict(dim=spec.action_dim, dtype="float32", low=spec.action_low.tolist(),
                  high=spec.action_high.tolist()),
      expert=dict(package=EXPERT_PACKAGE, version=expert_version(), policies=experts.class_names),
      seed=req.seed, envs_per_task=req.num_envs_per_task, episodes_per_task=req.episodes_per_task,
      max_episode_steps=spec.max_episode_steps, action_noise=req.action_noise,
      kept="all" if req.keep_failed else "successful", from_pixels=req.from_pixels,
      render_size=req.render_size if req.from_pixels else None, episodes_per_shard=per_shard,
      by_task=by_task, episodes=int(kept_eps.sum()), steps=int(kept_steps.sum()), nan_resets=nan_resets,
      shards=shards)
