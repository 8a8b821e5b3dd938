"""Supervised pre-training of any policy on recorded demonstrations, for a warm start of RL.

  python -m launch.demos --env=MetaWorld/MT10 --episodes_per_task=20 --out=demos/mt10
  python -m launch.sft --demos=demos/mt10 --out=runs/sft-vla --config.env.name=MetaWorld/MT10 \
      --config.policy.name=vla --steps=3000 --eval_every=1000
  python -m launch.train --config.env.name=MetaWorld/MT10 --config.policy.name=vla \
      --config.warm_start=runs/sft-vla --workdir=runs/rl-vla

mlp and cnn maximise the Gaussian log-likelihood of the expert's actions (the mean by gradient,
then the std in closed form: --fit_std), vla minimises the cross-entropy of its action tokens
(either decoding mode), flow its flow-matching loss on chunks of `policy.chunk_size` expert
actions. The config flags are launch.train's: env and policy must be the ones RL will use; without
--config.env.name the env (and task list) is the demos'. Every --eval_every steps and at the end
the policy acts in fresh episodes (--eval_episodes per task, seeded --eval_seed, apart from the
demos' seeds) and its success per task is printed, logged and kept; --early_stop keeps the best.
The kept params are evaluated with sampled and with mean actions. <out>/params is what
--config.warm_start loads; <out>/sft.json, metrics.jsonl and tb/ say how it went.
"""

from __future__ import annotations

import math
import os
import sys

from absl import flags

from launch import common

_CONFIG = common.define_config()
_DEMOS = flags.DEFINE_string("demos", None, "Demo directory recorded by python -m launch.demos.")
_OUT = flags.DEFINE_string("out", None, "Directory for the pre-trained params (<out>/params) and its logs.")
_STEPS = flags.DEFINE_integer("steps", 10000, "Gradient steps (at most, with --early_stop).")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Demo steps per gradient step.")
_LR = flags.DEFINE_float("learning_rate", 3e-4, "Adam learning rate.")
_LR_SCHEDULE = flags.DEFINE_enum("lr_schedule", "constant", ["constant", "cosine"],
                                 "Adam's rate over the steps: constant, or cosine from --learning_rate down to 0.")
_INIT = flags.DEFINE_string("init", None, "Continue from these params (a launch.sft --out directory or an RL "
                            "workdir) instead of a fresh init; their observation statistics are kept.")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 1000, "Steps between held-out evaluations (0: only at the end).")
_EVAL_EPISODES = flags.DEFINE_integer("eval_episodes", 10, "Held-out episodes per task at each evaluation.")
_EVAL_SEED = flags.DEFINE_integer("eval_seed", 1_000_003, "Seed of the held-out envs (apart from the demos').")
_FIT_STD = flags.DEFINE_enum("fit_std", "closed_form", ["closed_form", "gradient", "none"],
                             "mlp, cnn: the Gaussian's std. closed_form: after training, the maximum-likelihood std "
                             "of the demos given the trained mean, per dim, within policy.min_std / max_std; "
                             "gradient: trained with the mean; none: left at policy.init_log_std.")
_TRAIN_LOG_STD = flags.DEFINE_bool("train_log_std", False, "Old spelling of --fit_std=gradient.")
_OBS_MIN_STD = flags.DEFINE_float("obs_min_std", 0.01, "Floor of the observation statistics' std (raw units): "
                                  "dims (nearly) constant in the demos are not divided by ~0.")
_EARLY_STOP = flags.DEFINE_bool("early_stop", False, "Keep the params of the best held-out evaluation (ties: the "
                                "later); stop at held-out success 1.0 or after --patience evaluations without "
                                "improvement. Needs --eval_every > 0.")
_PATIENCE = flags.DEFINE_integer("patience", 5, "--early_stop: evaluations without improvement before stopping.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.")


def _rate(fig: dict) -> str:
  sr = fig.get("success_rate")
  if sr is None:
    return "-"
  ci = fig.get("success_ci95")
  return f"{sr:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def _table(final: dict) -> str:
  """Per task: held-out success with mean and with sampled actions."""
  by_task = {m: final.get(m, {}).get("success_rate_by_task") or {} for m in ("mean", "sample")}
  names = list(by_task["mean"] or by_task["sample"])
  if not names:
    return ""
  fmt = lambda s: "-" if s is None else f"{s:.2f}"
  rows = [f"  {'task':<28} {'mean':>6} {'sample':>6}"]
  rows += [f"  {t:<28} {fmt(by_task['mean'].get(t)):>6} {fmt(by_task['sample'].get(t)):>6}" for t in names]
  return "\n".join(rows)


def _env_given(cfg) -> bool:
  """Whether the command line (or a config file) chose the env: else the demos' env is taken."""
  from ebrl.defaults import get_config  # pylint: disable=g-import-not-at-top

  return bool(common.flag_values(sys.argv, "config.env.name")) or cfg.env.name != get_config().env.name


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}; use --demos=..., --out=... and --config.<key>=<value> flags")
  if not _DEMOS.value:
    common.fail("--demos is required: a demo directory recorded by python -m launch.demos")
  if not _OUT.value:
    common.fail("--out is required: the directory to save the pre-trained params in")
  for name, value in (("steps", _STEPS.value), ("batch_size", _BATCH.value), ("learning_rate", _LR.value),
                      ("eval_episodes", _EVAL_EPISODES.value), ("patience", _PATIENCE.value)):
    if value <= 0:
      common.fail(f"--{name}={value} must be positive")
  if _EVAL_EVERY.value < 0:
    common.fail(f"--eval_every={_EVAL_EVERY.value} must be 0 (only at the end) or positive")
  if not _OBS_MIN_STD.value > 0 or not math.isfinite(_OBS_MIN_STD.value):
    common.fail(f"--obs_min_std={_OBS_MIN_STD.value} must be a positive number (the observation std floor, raw units)")
  if _INIT.value is not None and not os.path.isdir(_INIT.value):
    common.fail(f"--init='{_INIT.value}' is not a directory; give a launch.sft --out directory or an RL workdir")
  if _EARLY_STOP.value and not _EVAL_EVERY.value:
    common.fail("--early_stop=True keeps the best held-out evaluation: it needs --eval_every > 0")
  fit_std = _FIT_STD.value
  if _TRAIN_LOG_STD.value:
    if flags.FLAGS["fit_std"].present and fit_std != "gradient":
      common.fail(f"--train_log_std=True (--fit_std=gradient) contradicts --fit_std={fit_std}; give one of them")
    fit_std = "gradient"
  cfg = common.config_value(_CONFIG)
  if cfg.algorithm.bc_coef > 0 and not cfg.algorithm.bc_demos:
    # A fine-tuning config's demonstration term: RL will read the demos pre-training reads.
    cfg.algorithm.bc_demos = _DEMOS.value
  common.enable_compilation_cache()
  import jax  # pylint: disable=g-import-not-at-top

  from ebrl import validation  # pylint: disable=g-import-not-at-top
  from ebrl.sft import SFTConfig, SFTRun, pretrain  # pylint: disable=g-import-not-at-top
  from ebrl.sft.run import demo_env  # pylint: disable=g-import-not-at-top

  from ebrl.validation import resolve  # pylint: disable=g-import-not-at-top

  run_spec = resolve(demo_env(cfg, _DEMOS.value, _env_given(cfg)))
  validation.check_devices(run_spec, jax.local_device_count())
  run = SFTRun(demos=_DEMOS.value, out=_OUT.value, eval_episodes=_EVAL_EPISODES.value, eval_seed=_EVAL_SEED.value,
               progress=_PROGRESS.value, fit_std=fit_std, obs_min_std=_OBS_MIN_STD.value, init=_INIT.value,
               train=SFTConfig(steps=_STEPS.value, batch_size=_BATCH.value, learning_rate=_LR.value,
                               lr_schedule=_LR_SCHEDULE.value,
                               eval_every=_EVAL_EVERY.value, early_stop=_EARLY_STOP.value, patience=_PATIENCE.value))
  _, meta = pretrain(run_spec, run)
  print(f"sft {meta['policy']} on {meta['env']}: {meta['loss']} {meta['loss_first']:.4f} -> {meta['loss_last']:.4f} "
        f"({meta['demo_steps']} demo steps, {meta['steps_run']} steps)", flush=True)
  for ev in meta["held_out"]:
    print(f"held-out success at step {ev['step']}: {ev['success_rate']}", flush=True)
  if meta["early_stop"]:
    print(f"early stop: kept the params of step {meta['kept_step']} ({meta['steps_run']} of {meta['steps']} steps run)",
          flush=True)
  if meta["action_std"] is not None:
    print(f"action std ({meta['fit_std']}): " + " ".join(f"{x:.4f}" for x in meta["action_std"]), flush=True)
  final = meta["held_out_final"]
  print(f"held-out success of the kept params (step {meta['kept_step']}): mean actions {_rate(final['mean'])}, "
        f"sampled actions {_rate(final['sample'])}", flush=True)
  table = _table(final)
  if table:
    print("held-out success per task:\n" + table, flush=True)
  print(f"params saved to {_OUT.value}/params (--config.warm_start={_OUT.value})", flush=True)


def cli() -> None:
  """The `ebrl-sft` console command (pyproject.toml): the same flags as `python -m launch.sft`."""
  common.run(main)


if __name__ == "__main__":
  cli()
