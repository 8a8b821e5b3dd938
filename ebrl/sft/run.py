"""One supervised pre-training run, as `launch.sft` drives it: every check first, then training,
held-out evaluation and the outputs.

Every mistake (a demo directory that is missing, empty or of another version; demos whose
observation keys or shapes, or action size, are not the run's; a used --out; an eval seed whose
envs would replay the demos' initial states) is a one-line UserError before anything is compiled.

Outputs in `out`: params/ (Orbax, what `--config.warm_start=out` loads), sft.json (what was run
and how it ended: losses, held-out success per task, the fitted action std, the kept step, and the
kept params' final evaluation with sampled and with mean actions), metrics.jsonl and tb/
(TensorBoard: loss and held-out success, per task on multi-task envs).

The params evaluated and saved are the trained ones made ready to act (`ready`): a Gaussian's std
set in closed form from the demos (fit_std="closed_form"), a flow's frozen copy of its velocity net
synced to the trained one. Both are deterministic, so the saved params act as their evaluation did.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np

from ebrl import warm_start
from ebrl import workdir as workdir_lib
from ebrl.demos import open_demos
from ebrl.errors import UserError
from ebrl.evaluation import HELD_OUT_SEED, HostRunner, RunEnv
from ebrl.sft import data as data_lib
from ebrl.algorithms.imitation import LOSS_NAMES
from ebrl.sft.train import LR_SCHEDULES, SFTConfig, train
from ebrl.spec import RunSpec
from ebrl.telemetry.writers import MetricsWriter, write_json

META_FILE = "sft.json"
SEED_SPAN = 1000  # A multi-task env seeds task k's pool seed + 1000 k (sim_adapters/multitask.py).


@dataclasses.dataclass(frozen=True)
class SFTRun:
  """What launch.sft asks for beside the run config."""

  demos: str
  out: str
  train: SFTConfig = SFTConfig()
  eval_episodes: int = 10  # Per task.
  eval_seed: int = HELD_OUT_SEED
  progress: bool = True
  # mlp, cnn: how the Gaussian's std is chosen: "closed_form" (the maximum-likelihood std given the
  # trained mean, within policy.min_std / max_std), "gradient" (trained with the mean), "none" (init).
  fit_std: str = "closed_form"
  obs_min_std: float = 0.01  # Floor of the observation statistics' std (raw units).
  # Params to continue from (a launch.sft --out or an RL run directory) instead of a fresh init; their
  # observation statistics are kept, not refitted, so the network keeps seeing the inputs it learned on.
  init: str | None = None


FIT_STD_MODES = ("closed_form", "gradient", "none")
GAUSSIAN = ("mlp", "cnn")


def demo_env(cfg, demos: str, env_given: bool):
  """cfg with env.name set to the demos' env (a multi-task env's name carries its task list) unless
  the command line gave one; a given env is checked against the demos later (`check_demos`)."""
  if not env_given:
    cfg.env.name = open_demos(demos).env
  return cfg


def env_spec(run_spec: RunSpec, run_env: RunEnv):
  """The EnvSpec of cfg's env as RL builds it (pixels, chunks), without simulating."""
  from sim_adapters import make_adapter  # pylint: disable=g-import-not-at-top

  if run_spec.device_env:
    raise UserError(f"env '{run_spec.env.name}' is a device simulator; demonstrations are recorded on "
                    "MetaWorld host envs (python -m launch.demos)")
  try:
    adapter = make_adapter(run_spec.env.name, len(run_spec.tasks or (1,)), seed=run_spec.seed,
                           **run_env.adapter_kwargs())
  except (ValueError, RuntimeError) as e:
    raise UserError(str(e)) from None
  adapter.close()
  return adapter.spec


def _check_eval_seed(run: SFTRun, demos, num_tasks: int) -> None:
  """The held-out envs' seeds (seed .. seed + 1000 (tasks - 1) + envs) must miss the recording's."""
  if run.eval_episodes <= 0:
    raise UserError(f"--eval_episodes={run.eval_episodes} must be positive (episodes per task)")
  rec = int(demos.manifest.get("seed", 0))
  span = SEED_SPAN * num_tasks + max(run.eval_episodes, int(demos.manifest.get("envs_per_task", 1)))
  if abs(run.eval_seed - rec) < span:
    raise UserError(f"--eval_seed={run.eval_seed} is within {span} of the demos' seed {rec}: held-out envs "
                    "would start where the demos did; choose a seed further away")


def prepare(run_spec: RunSpec, run: SFTRun):
  """Every check, nothing compiled: (demos, spec, policy, run_env, out)."""
  from policies import IncompatibleObservationError, make_policy  # pylint: disable=g-import-not-at-top

  if run.fit_std not in FIT_STD_MODES:
    raise UserError(f"fit_std='{run.fit_std}' must be one of: {', '.join(FIT_STD_MODES)}")
  if not run.obs_min_std > 0 or not np.isfinite(run.obs_min_std):
    raise UserError(f"--obs_min_std={run.obs_min_std} must be a positive number (the observation std floor, "
                    "raw units)")
  if run.train.early_stop and not run.train.eval_every:
    raise UserError("--early_stop=True keeps the best held-out evaluation: it needs --eval_every > 0")
  if run.train.lr_schedule not in LR_SCHEDULES:
    raise UserError(f"--lr_schedule={run.train.lr_schedule} must be one of: {', '.join(LR_SCHEDULES)}")
  if run.train.patience < 1:
    raise UserError(f"--patience={run.train.patience} must be a positive number of evaluations")
  demos = open_demos(run.demos)
  out = os.path.abspath(run.out)
  if os.path.exists(os.path.join(out, warm_start.PARAMS_DIR)):
    raise UserError(f"--out='{run.out}' already holds params; choose a new directory (they are never overwritten)")
  run_env = RunEnv.of_spec(run_spec)
  spec = env_spec(run_spec, run_env)
  data_lib.check_demos(demos, spec, run_spec.env.name)
  _check_eval_seed(run, demos, max(1, spec.num_tasks))
  try:
    policy = make_policy(run_spec.policy.name, spec, run_spec.policy)
  except (ValueError, IncompatibleObservationError) as e:
    raise UserError(str(e)) from None
  if run.init is not None:  # Shapes only (jax.eval_shape): a mismatch is one line before any compile.
    try:
      warm_start.check_params(run.init, jax.eval_shape(lambda: policy.init(jax.random.PRNGKey(0))))
    except ValueError as e:
      raise UserError(f"--init: {e}") from None
  workdir_lib.check_writable(out, flag="out")
  return demos, spec, policy, run_env, out


def held_out(run_spec: RunSpec, run_env: RunEnv, policy, run: SFTRun, num_tasks: int):
  """evaluate(params, actions="sample"|"mean") -> success (overall and per task) in fresh episodes,
  `eval_episodes` per task."""
  def evaluate(params, actions: str = "sample") -> dict:
    runner = HostRunner(run_spec.env.name, run.eval_episodes * num_tasks, run.eval_seed, run_env)
    return runner.run(policy, params, actions=actions)
  return evaluate


def action_std(policy, params, run_spec: RunSpec) -> list[float] | None:
  """mlp, cnn: the std the policy acts with (its log_std within policy.min_std / max_std), per dim."""
  if policy.name not in GAUSSIAN:
    return None
  lo, hi = run_spec.policy.min_std, run_spec.policy.max_std
  std = np.exp(np.asarray(params["net"]["log_std"], np.float64))
  return [float(x) for x in np.clip(std, lo if lo > 0 else 0.0, hi if hi > 0 else np.inf)]


def ready(policy, demos, run_spec: RunSpec, run: SFTRun, k: int):
  """params -> the params as they act and are saved: the closed-form std (fit_std="closed_form",
  mlp / cnn), a flow's frozen base synced to its trained velocity net."""
  def finish(params):
    if policy.name in GAUSSIAN and run.fit_std == "closed_form":
      params, _ = data_lib.fit_action_std(policy, params, demos, k, run_spec.policy.min_std, run_spec.policy.max_std)
    if hasattr(policy, "sync_base"):
      params = policy.sync_base(params)
    return params
  return finish


def initial_params(policy, key: jax.Array, demos, run: SFTRun):
  """A fresh init with the demos' observation statistics, or `run.init`'s params as they were saved
  (statistics included), checked leaf by leaf against the policy first."""
  fresh = policy.init(key)
  if run.init is None:
    return data_lib.fit_normalizer(policy, fresh, demos, min_std=run.obs_min_std)
  try:
    return warm_start.load_params(run.init, fresh)
  except ValueError as e:  # Checked in `prepare`; only a file changed since can get here.
    raise UserError(f"--init: {e}") from None


def pretrain(run_spec: RunSpec, run: SFTRun) -> tuple[Any, dict[str, Any]]:
  """Checks, pre-trains, evaluates and saves; returns (the params saved, what sft.json holds)."""
  demos, spec, policy, run_env, out = prepare(run_spec, run)
  tasks = max(1, spec.num_tasks)
  k = int(spec.chunk_size)
  key = jax.random.PRNGKey(run_spec.seed)
  init_key, train_key = jax.random.split(key)
  params = initial_params(policy, init_key, demos, run)
  gaussian = policy.name in GAUSSIAN
  frozen = (("log_std",) if run.fit_std != "gradient" else ()) if gaussian else ()
  batches = data_lib.batches(demos, k, run.train.batch_size, seed=run_spec.seed)
  finish = ready(policy, demos, run_spec, run, k)
  evaluate = held_out(run_spec, run_env, policy, run, tasks)
  writer = MetricsWriter(out)
  try:
    params, history = train(policy, params, batches, dataclasses.replace(run.train, frozen=frozen), train_key,
                            evaluate=lambda p: evaluate(finish(p)),
                            write=lambda row: writer.write(row, step_key="step"), progress=run.progress)
  finally:
    writer.close()
  params = finish(params)  # The kept params as they were evaluated (the same std, the same base).
  kept = next((e for e in history["evals"] if e["step"] == history["kept_step"]), None)
  final = {"sample": _figures(kept), "mean": _figures(evaluate(params, "mean"))}
  losses = history["loss"]
  window = max(1, min(50, len(losses) // 5))  # The first and last steps' mean minibatch loss.
  meta = dict(env=run_spec.env.name, policy=policy.name, loss=LOSS_NAMES[policy.name], demos=os.path.abspath(run.demos),
              demo_episodes=demos.num_episodes, demo_steps=demos.num_steps, chunk_size=k,
              expert_success=demos.expert_success(), steps=run.train.steps, steps_run=history["steps_run"],
              kept_step=history["kept_step"], early_stop=run.train.early_stop,
              patience=run.train.patience if run.train.early_stop else None,
              batch_size=run.train.batch_size, learning_rate=run.train.learning_rate,
              lr_schedule=run.train.lr_schedule, init=os.path.abspath(run.init) if run.init else None,
              frozen=list(frozen),
              fit_std=run.fit_std if gaussian else None, action_std=action_std(policy, params, run_spec),
              obs_min_std=run.obs_min_std,
              loss_first=float(np.mean(losses[:window])), loss_last=float(np.mean(losses[-window:])),
              eval_seed=run.eval_seed, eval_episodes_per_task=run.eval_episodes,
              held_out=history["evals"], held_out_final=final,
              final_success_rate=final["sample"].get("success_rate"),
              final_success_rate_by_task=final["sample"].get("success_rate_by_task"),
              config=run_spec.config)
  try:
    warm_start.save_params(out, params)
  except ValueError as e:
    raise UserError(str(e)) from None
  write_json(os.path.join(out, META_FILE), meta)
  return params, meta


_FIGURES = ("success_rate", "success_rate_by_task", "success_ci95", "success_ci95_by_task", "episodes",
            "episode_return")


def _figures(result: dict | None) -> dict:
  """An evaluation's success figures (rate, 95% interval, per task) and its episode count and return."""
  return {k: result[k] for k in _FIGURES if k in result} if result else {}
