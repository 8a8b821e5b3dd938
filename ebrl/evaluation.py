"""Policy evaluation on either backend: host (EnvPool) or device (mjx:, brax:) envs.

Each of n envs runs exactly one episode and its first episode is the one
counted, so tasks with early terminations are not biased towards short
episodes. Actions are sampled as in training (actions="sample") or are the
policy's deterministic `mean_action` (actions="mean": a Gaussian's mean, a token
policy's greedy tokens), clipped to the env bounds either way. On a multi-task env
(MT10, MT50, a task list) the envs are spread over the tasks as in training, and
`success_rate_by_task` gives each task's success over its own envs' episodes.
`success_ci95` (and `success_ci95_by_task`) is the 95% Wilson score interval of
the success rate over those episodes: two checkpoints whose intervals overlap
have not been told apart.

A policy acts only in envs built the way its run built them: pixels, the
render stage and action chunks change the observations and actions it was
trained on. `RunEnv.of_spec` reads those options from the run's spec, and the
runners build their envs with them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import jax
import numpy as np

from ebrl.errors import UserError
from ebrl.sampler import ACTION_MODES
from sim_adapters import is_device_env
from sim_adapters.base import EnvSpec

if TYPE_CHECKING:
  from ebrl.spec import RunSpec

# Env seed of held-out evaluations (launch.sft's, a fine-tuning run's start and final evaluation): far
# from the seeds training and recording use (seed .. seed + 1000 tasks), so their initial states differ.
HELD_OUT_SEED = 1_000_003
_Z95 = 1.959963984540054  # The standard normal's 97.5% quantile.


def success_ci95(successes: int, n: int) -> list[float]:
  """[low, high]: the 95% Wilson score interval of a success rate of `successes` in `n` episodes
  (scipy's binomtest when scipy is there, the same closed form otherwise). Unlike the normal
  approximation it stays inside [0, 1] and is not empty at 0 or n successes."""
  if n <= 0:
    return [0.0, 1.0]
  try:
    from scipy.stats import binomtest  # pylint: disable=g-import-not-at-top
  except ImportError:
    p, z2 = successes / n, _Z95 * _Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = _Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]
  ci = binomtest(int(successes), int(n)).proportion_ci(confidence_level=0.95, method="wilson")
  return [float(ci.low), float(ci.high)]


SUCCESS_FIGURES = ("success_rate", "success_rate_by_task", "success_ci95", "success_ci95_by_task")


def success_figures(result: dict | None) -> dict | None:
  """An evaluation's success figures alone (summary.json's success_before / success_after): the
  rate and its 95% interval, per task too on a multi-task env."""
  if result is None:
    return None
  return {k: result[k] for k in SUCCESS_FIGURES if k in result}


class FirstEpisodes:
  """The first finished episode of each of n envs."""

  def __init__(self, n: int):
    self.ret = np.full(n, np.nan)
    self.length = np.zeros(n, np.int64)
    self.success = np.full(n, np.nan)
    self.seen = np.zeros(n, bool)

  def record(self, done: np.ndarray, ret: np.ndarray, length: np.ndarray, success: np.ndarray) -> None:
    new = done & ~self.seen
    self.ret[new], self.length[new], self.success[new] = ret[new], length[new], success[new]
    self.seen |= new

  @classmethod
  def concatenate(cls, parts: list["FirstEpisodes"]) -> "FirstEpisodes":
    """The envs of `parts` as one set, in order."""
    out = cls(sum(p.seen.size for p in parts))
    for name in ("ret", "length", "success", "seen"):
      setattr(out, name, np.concatenate([getattr(p, name) for p in parts]))
    return out

  @property
  def complete(self) -> bool:
    return bool(self.seen.all())

  def summary(self, has_success: bool, tasks: tuple[str, ...] = (), env_tasks: np.ndarray | None = None) -> dict:
    """Means over the envs' episodes and the success rate's 95% interval; with `tasks` (each env's
    task id in `env_tasks`) also each task's success rate and interval over its own envs."""
    won = self.success > 0
    rate = lambda w: float(np.mean(w)) if has_success else None
    ci = lambda w: success_ci95(int(w.sum()), int(w.size)) if has_success else None
    out = {"episodes": int(self.seen.sum()), "episode_return": float(np.mean(self.ret)),
           "episode_length": float(np.mean(self.length)), "success_rate": rate(won), "success_ci95": ci(won)}
    if tasks:
      out["success_rate_by_task"] = {t: rate(won[env_tasks == k]) for k, t in enumerate(tasks)}
      out["success_ci95_by_task"] = {t: ci(won[env_tasks == k]) for k, t in enumerate(tasks)}
    return out


@dataclasses.dataclass(frozen=True)
class RunEnv:
  """The env options of a run that its policy's observations and actions depend on.

  Defaults are the options of a plain state run, so a config.json written
  before an option existed still describes its run.
  """
  max_episode_steps: int = 0
  from_pixels: bool = False
  render_size: int = 64
  render_stage: bool = False
  chunk_size: int = 1
  reward_type: str = "chunk"
  gamma: float = 0.99

  @classmethod
  def of_spec(cls, run: "RunSpec") -> "RunEnv":
    """From a run's spec (ebrl/spec.py)."""
    return cls(max_episode_steps=run.env.max_episode_steps, from_pixels=run.env.from_pixels,
               render_size=run.env.render_size, render_stage=run.env.render_stage,
               chunk_size=run.policy.chunk_size, reward_type=run.env.reward_type, gamma=run.algorithm.gamma)

  def adapter_kwargs(self) -> dict:
    """sim_adapters.make_adapter's options for the run's own adapter. With reward_type="action" a
    chunk's reward is discounted within the chunk, so episode_return is the one training logged."""
    return dataclasses.asdict(self)

  def host_only(self) -> list[str]:
    """The options no device simulator has, as `key=value` of the run's config."""
    on = {"env.from_pixels": self.from_pixels, "env.render_stage": self.render_stage,
          "policy.chunk_size": self.chunk_size if self.chunk_size > 1 else None}
    return [f"{k}={v}" for k, v in on.items() if v]


def check_actions(actions: str) -> None:
  """UserError unless `actions` names an action mode."""
  if actions not in ACTION_MODES:
    raise UserError(f"actions='{actions}' must be one of: {', '.join(ACTION_MODES)} (sample: as in training; "
                    "mean: the policy's deterministic action)")


def _acting(policy, actions: str):
  """The policy as it acts in `actions` mode (policies.base.MeanActing for "mean")."""
  from policies.base import MeanActing  # pylint: disable=g-import-not-at-top

  check_actions(actions)
  if actions == "sample":
    return policy
  if not callable(getattr(policy, "mean_action", None)):
    raise UserError(f"policy '{policy.name}' has no mean_action; evaluate it with actions=sample")
  return MeanActing(policy)


def _check_device_can_run(name: str, run_env: RunEnv) -> None:
  host_only = run_env.host_only()
  if host_only:
    raise UserError(f"the checkpoint was trained with {', '.join(host_only)}, which device env '{name}' does "
                    "not have (it steps one action on state observations); evaluate on a host env")


def spec_of(name: str, run_env: RunEnv = RunEnv()) -> EnvSpec:
  """The EnvSpec of `name` built as `run_env` says, without simulating anything."""
  if is_device_env(name):
    _check_device_can_run(name, run_env)
    from sim_adapters.mjx import make_device_sim
    return make_device_sim(name, 1, max_episode_steps=run_env.max_episode_steps).spec
  from sim_adapters import make_adapter
  adapter = make_adapter(name, 1, **run_env.adapter_kwargs())
  adapter.close()
  return adapter.spec


def check_same_observations(trained: EnvSpec, spec: EnvSpec) -> None:
  """UserError unless a policy trained on `trained` can act in `spec`."""
  shapes = lambda s: {k: tuple(v.shape) for k, v in s.obs.items()}
  if shapes(trained) != shapes(spec) or trained.action_dim != spec.action_dim:
    raise UserError(f"the checkpoint was trained on '{trained.name}' (obs {shapes(trained)}, "
                    f"{trained.action_dim} actions); '{spec.name}' gives obs {shapes(spec)}, {spec.action_dim} actions")


# At most this many host envs exist at once in an evaluation: a MetaWorld env holds about 20 MB, so
# 50 episodes per task on MT50 (2,500 envs) would need 50 GB at once. Larger evaluations run in
# rounds of this many envs (a whole number per task), each on seeds of its own, and each round's
# pools are freed before the next is built (`_release`).
MAX_HOST_EVAL_ENVS = 250
# Seed offset between rounds: past the seeds one round's pools use (seed + 1000 k + env, k < 1000 tasks).
ROUND_SEED_STRIDE = 1_000_000


def eval_rounds(n: int, num_tasks: int, max_envs: int = MAX_HOST_EVAL_ENVS) -> list[int]:
  """Env counts of the rounds that run n one-episode envs, each round a multiple of num_tasks but the
  last (the rest: a round of its own with at least one env per task, else part of the one before),
  so every round spreads its envs over the tasks as training does."""
  per_round = max(num_tasks, max_envs // num_tasks * num_tasks)
  full, rest = divmod(n, per_round)
  rounds = [per_round] * full
  if rest >= num_tasks or not rounds:
    rounds.append(rest)
  elif rest:
    rounds[-1] += rest
  return rounds


def _release() -> None:
  """Hands a closed round's env memory back to the OS. EnvPool's envs are C++ allocations that glibc keeps
  in its arenas after they are freed (measured: 100 MT50 envs, 2.0 GB resident, still 2.0 GB after
  close and del); without the trim every round would add its envs' size, and MT50's 2,500 evaluation
  envs ran out of 24 GB in rounds."""
  import ctypes  # pylint: disable=g-import-not-at-top
  import gc  # pylint: disable=g-import-not-at-top

  gc.collect()
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):  # Not glibc (macOS, musl): the allocator keeps what it keeps.
    pass


class HostRunner:
  """One episode per env on the run's own kind of EnvPool adapter, stepped synchronously.

  With action chunks a step is one chunk per env, and episode_length counts
  decisions, as training's metrics do. More than MAX_HOST_EVAL_ENVS envs run in
  rounds (`eval_rounds`), round r's pools seeded seed + r * ROUND_SEED_STRIDE.
  """

  def __init__(self, name: str, n: int, seed: int, run_env: RunEnv = RunEnv(),
               max_envs: int = MAX_HOST_EVAL_ENVS):
    from sim_adapters import make_adapter, multitask_tasks
    self.name, self.n, self.seed, self.run_env = name, n, seed, run_env
    self.tasks = multitask_tasks(name) or ()
    self.rounds = eval_rounds(n, max(1, len(self.tasks)), max_envs)
    # The first round's adapter is built here, so a bad env fails before any policy runs.
    self.adapter = make_adapter(name, self.rounds[0], seed=seed, **run_env.adapter_kwargs())
    self.spec = self.adapter.spec

  def run(self, policy, params, actions: str = "sample") -> dict:
    """The envs' first episodes with `actions` "sample" (training's) or "mean" (`policy.mean_action`):
    the summary (`FirstEpisodes.summary`) and `actions`. The runner may run again: each run
    rebuilds its envs on the same seeds, so both modes start from the same initial states."""
    from ebrl.param_store import ParamStore
    from sim_adapters import make_adapter
    from sim_adapters.multitask import env_task_ids

    _acting(policy, actions)  # A mode the policy cannot act in fails before any env steps.
    store = ParamStore()
    store.publish_params(params, 0)
    firsts, env_tasks = [], []
    for r, size in enumerate(self.rounds):
      seed = self.seed + r * ROUND_SEED_STRIDE
      adapter, self.adapter = self.adapter, None  # The first round's, built in __init__; then None.
      if adapter is None:
        adapter = make_adapter(self.name, size, seed=seed, **self.run_env.adapter_kwargs())
      firsts.append(self._one_round(adapter, size, policy, store, seed, actions))
      del adapter
      _release()
      if self.tasks:
        env_tasks.append(env_task_ids(size, len(self.tasks)))
    first = FirstEpisodes.concatenate(firsts)
    summary = first.summary(self.spec.has_success, self.tasks, np.concatenate(env_tasks) if self.tasks else None)
    return {**summary, "actions": actions}

  def _one_round(self, adapter, n: int, policy, store, seed: int, actions: str = "sample") -> "FirstEpisodes":
    from ebrl.acting import host_step
    from ebrl.sampler import Sampler
    from sim_adapters.base import gather_all

    sampler = Sampler(policy, self.spec, store, seed=seed, actions=actions)
    first = FirstEpisodes(n)
    ret, length, succ = np.zeros(n), np.zeros(n, np.int64), np.zeros(n)
    try:
      adapter.reset()
      obs = gather_all(adapter, n).obs
      while not first.complete:
        _, _, b = host_step(sampler, adapter, obs)
        real = ~b.reset_step
        ret += np.where(real, b.reward, 0.0)
        length += real
        succ = np.fmax(succ, np.where(real, b.success, 0.0))
        first.record(b.done, ret, length, succ)
        ret[b.done], length[b.done], succ[b.done] = 0.0, 0, 0.0
        obs = b.obs
    finally:
      adapter.close()
    return first


class DeviceRunner:
  """One episode per env on a DeviceSim, in jitted chunks of steps."""

  def __init__(self, name: str, n: int, seed: int, run_env: RunEnv = RunEnv()):
    _check_device_can_run(name, run_env)
    from sim_adapters.mjx import make_device_sim
    self.sim = make_device_sim(name, n, max_episode_steps=run_env.max_episode_steps)
    self.spec, self.n, self.seed = self.sim.spec, n, seed

  def run(self, policy, params, actions: str = "sample") -> dict:
    """As HostRunner.run: `actions` "sample" or "mean"; the same initial states on every run."""
    from ebrl import normalizer
    from ebrl.acting import device_unroll

    sim = self.sim
    chunk = min(100, self.spec.max_episode_steps)
    # Training's unroll; its rewards and values are not used here (no value statistics needed).
    unroll, _ = device_unroll(sim, _acting(policy, actions), chunk, gamma=1.0)
    acting = {**params, "value_norm": normalizer.init_stats(1)}

    @jax.jit
    def steps(state, key):
      state, rows = unroll(acting, state, key)
      return state, rows["fin"]

    key = jax.random.PRNGKey(self.seed)
    state = sim.reset(jax.random.fold_in(key, 0))
    first = FirstEpisodes(self.n)
    for i in range(1, math.ceil(self.spec.max_episode_steps / chunk) + 2):
      state, rows = steps(state, jax.random.fold_in(key, i))
      for t_rows in zip(*(np.asarray(x) for x in rows)):
        first.record(*t_rows)
      if first.complete:
        break
    return {**first.summary(self.spec.has_success), "actions": actions}


def make_runner(name: str, n: int, seed: int, run_env: RunEnv = RunEnv()):
  """A runner for `name` whose envs are built as the checkpoint's run built its own."""
  cls = DeviceRunner if is_device_env(name) else HostRunner
  try:
    return cls(name, n, seed, run_env)
  except (ValueError, RuntimeError) as e:
    raise UserError(str(e)) from None


SFT_META = "sft.json"  # A launch.sft --out directory's description (ebrl/sft/run.py); its "config" is the run's.


def _run_config(checkpoint: str):
  """(the run config a policy was made with, its source): "train" for a launch.train workdir (its
  config.json), "sft" for a launch.sft --out directory (sft.json's "config")."""
  import json  # pylint: disable=g-import-not-at-top
  import os

  import ml_collections

  path = os.path.join(checkpoint, "config.json")
  sft = os.path.join(checkpoint, SFT_META)
  if os.path.isfile(path):
    with open(path) as f:
      return ml_collections.ConfigDict(json.load(f)), "train"
  if os.path.isfile(sft):
    try:
      with open(sft) as f:
        config = json.load(f).get("config")
    except (OSError, ValueError, AttributeError) as e:
      raise UserError(f"checkpoint={checkpoint}: cannot read {SFT_META} ({type(e).__name__})") from None
    if not isinstance(config, dict):
      raise UserError(f"checkpoint={checkpoint}: {SFT_META} holds no run config (written by an older launch.sft); "
                      "pre-train again to evaluate it")
    return ml_collections.ConfigDict(config), "sft"
  raise UserError(f"checkpoint={checkpoint} is not a run workdir (no config.json) nor a launch.sft --out "
                  f"directory (no {SFT_META})")


def saved_run(saved) -> "RunSpec":
  """A run's config.json as its spec: over today's defaults, so a config written before a key
  existed reads as that key's default (it was checked when the run started)."""
  from ebrl.defaults import get_config  # pylint: disable=g-import-not-at-top
  from ebrl.spec import translate

  cfg = get_config()
  cfg.update(saved)
  return translate(cfg)


def _restore(checkpoint: str, run: "RunSpec", policy):
  """The newest readable checkpoint of the run, into a state shaped by the run's own settings."""
  import os  # pylint: disable=g-import-not-at-top

  from ebrl.checkpointing import Checkpointer
  from ebrl.learner import LearnerConfig, init_train_state

  template = init_train_state(policy, LearnerConfig.of(run.algorithm, run.layout, run.max_staleness),
                              jax.random.PRNGKey(0))
  ckpt = Checkpointer(os.path.join(checkpoint, "checkpoints"), warn=lambda m: None)
  try:
    restored = ckpt.restore_latest(template)
  finally:
    ckpt.close()
  if restored is None:
    raise UserError(f"no checkpoint in {os.path.join(checkpoint, 'checkpoints')}")
  return restored


def check_args(episodes: int, seed: int, actions: str = "sample") -> None:
  """Before the run is read or any env built."""
  from ebrl.validation import SEED_MAX  # pylint: disable=g-import-not-at-top

  check_actions(actions)
  if episodes <= 0:
    raise UserError(f"episodes={episodes} must be a positive integer (one episode per env)")
  if not 0 <= seed <= SEED_MAX:
    raise UserError(f"seed={seed} must be an integer in [0, {SEED_MAX}] (EnvPool takes int32 seeds)")


def evaluate_run(checkpoint: str, env: str | None = None, episodes: int = 32, seed: int = HELD_OUT_SEED,
                 out: str | None = None, actions: str = "sample") -> dict:
  """Evaluates the newest checkpoint of the run in `checkpoint` (its workdir), or the params of a
  launch.sft --out directory, on `env` (default: the env it trained on; the same task on the other
  backend works too) with `actions` "sample" or "mean", and returns env, trained_on, source ("train"
  or "sft"), actions, episodes, episode_return, episode_length, success_rate and success_ci95 (None
  without a success signal), success_rate_by_task and success_ci95_by_task (multi-task envs only) and
  checkpoint_env_steps (None for sft params); also written to `out` as one JSON line when given. The
  default seed is the held-out one (HELD_OUT_SEED) a fine-tuning run and launch.sft evaluate on, so
  every checkpoint compared starts from the same initial states."""
  import json  # pylint: disable=g-import-not-at-top
  import os

  from ebrl.workdir import check_output_file
  from policies import IncompatibleObservationError, make_policy
  from sim_adapters import UnknownEnvError, check_env_name

  check_args(episodes, seed, actions)
  saved, source = _run_config(checkpoint)  # Its messages name the workdir as given.
  run = saved_run(saved)
  checkpoint = os.path.abspath(checkpoint)
  env_name = env or run.env.name
  try:
    check_env_name(env_name)
  except UnknownEnvError as e:
    raise UserError(str(e)) from None
  if out:  # Before the episodes run: an unwritable out would lose them.
    check_output_file("out", out)
  run_env = RunEnv.of_spec(run)
  runner = make_runner(env_name, episodes, seed, run_env)
  train_spec = spec_of(run.env.name, run_env) if env_name != run.env.name else runner.spec
  check_same_observations(train_spec, runner.spec)
  try:
    policy = make_policy(run.policy.name, runner.spec, run.policy)
  except (IncompatibleObservationError, ValueError) as e:
    raise UserError(f"checkpoint={checkpoint}: {e}") from None
  if source == "sft":
    from ebrl.warm_start import load_params  # pylint: disable=g-import-not-at-top
    try:
      params, env_steps = load_params(checkpoint, policy.init(jax.random.PRNGKey(0))), None
    except ValueError as e:
      raise UserError(str(e)) from None
  else:
    state, meta = _restore(checkpoint, run, policy)
    params, env_steps = state.params, int(meta["env_steps"])
  result = {"env": env_name, "trained_on": run.env.name, "source": source,
            **runner.run(policy, params, actions), "checkpoint_env_steps": env_steps}
  if out:
    with open(out, "w") as f:
      f.write(json.dumps(result) + "\n")
  return result
