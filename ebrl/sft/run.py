"""One supervised pre-training run, as `launch.sft` drives it: every check first, then training,
held-out evaluation and the outputs.

Every mistake (a demo directory that is missing, empty or of another version; demos whose
observation keys or shapes, or action size, are not the run's; a used --out; an eval seed whose
envs would replay the demos' initial states) is a one-line UserError before anything is compiled.

Outputs in `out`: params/ (Orbax, what `--config.warm_start=out` loads), sft.json (what was run
and how it ended: losses, held-out success per task), metrics.jsonl and tb/ (TensorBoard: loss
and held-out success, per task on multi-task envs).
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
from ebrl.sft.losses import LOSS_NAMES
from ebrl.sft.train import SFTConfig, train
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
  workdir_lib.check_writable(out, flag="out")
  return demos, spec, policy, run_env, out


def held_out(run_spec: RunSpec, run_env: RunEnv, policy, run: SFTRun, num_tasks: int):
  """evaluate(params) -> success (overall and per task) in fresh episodes, `eval_episodes` per task."""
  def evaluate(params) -> dict:
    runner = HostRunner(run_spec.env.name, run.eval_episodes * num_tasks, run.eval_seed, run_env)
    return runner.run(policy, params)
  return evaluate


def pretrain(run_spec: RunSpec, run: SFTRun) -> tuple[Any, dict[str, Any]]:
  """Checks, pre-trains, evaluates and saves; returns (the params saved, what sft.json holds)."""
  demos, spec, policy, run_env, out = prepare(run_spec, run)
  tasks = max(1, spec.num_tasks)
  k = int(spec.chunk_size)
  key = jax.random.PRNGKey(run_spec.seed)
  init_key, train_key = jax.random.split(key)
  params = data_lib.fit_normalizer(policy, policy.init(init_key), demos)
  frozen = run.train.frozen if policy.name in ("mlp", "cnn") else ()
  batches = data_lib.batches(demos, k, run.train.batch_size, seed=run_spec.seed)
  writer = MetricsWriter(out)
  try:
    params, history = train(policy, params, batches, dataclasses.replace(run.train, frozen=frozen), train_key,
                            evaluate=held_out(run_spec, run_env, policy, run, tasks),
                            write=lambda row: writer.write(row, step_key="step"), progress=run.progress)
  finally:
    writer.close()
  final = history["evals"][-1] if history["evals"] else {}
  losses = history["loss"]
  window = max(1, min(50, len(losses) // 5))  # The first and last steps' mean minibatch loss.
  meta = dict(env=run_spec.env.name, policy=policy.name, loss=LOSS_NAMES[policy.name], demos=os.path.abspath(run.demos),
              demo_episodes=demos.num_episodes, demo_steps=demos.num_steps, chunk_size=k,
              expert_success=demos.expert_success(), steps=run.train.steps, batch_size=run.train.batch_size,
              learning_rate=run.train.learning_rate, frozen=list(frozen),
              loss_first=float(np.mean(losses[:window])), loss_last=float(np.mean(losses[-window:])),
              eval_seed=run.eval_seed, eval_episodes_per_task=run.eval_episodes,
              held_out=history["evals"], final_success_rate=final.get("success_rate"),
              final_success_rate_by_task=final.get("success_rate_by_task"),
              config=run_spec.config)
  try:
    warm_start.save_params(out, params)
  except ValueError as e:
    raise UserError(str(e)) from None
  write_json(os.path.join(out, META_FILE), meta)
  return params, meta
