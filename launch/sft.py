"""Supervised pre-training of any policy on recorded demonstrations, for a warm start of RL.

  python -m launch.demos --env=MetaWorld/MT10 --episodes_per_task=20 --out=demos/mt10
  python -m launch.sft --demos=demos/mt10 --out=runs/sft-vla --config.env.name=MetaWorld/MT10 \
      --config.policy.name=vla --steps=3000 --eval_every=1000
  python -m launch.train --config.env.name=MetaWorld/MT10 --config.policy.name=vla \
      --config.warm_start=runs/sft-vla --workdir=runs/rl-vla

mlp and cnn maximise the Gaussian log-likelihood of the expert's actions, vla minimises the
cross-entropy of its action tokens (either decoding mode), flow its flow-matching loss on chunks
of `policy.chunk_size` expert actions. The config flags are launch.train's: env and policy must be
the ones RL will use. Every --eval_every steps and at the end the policy acts in fresh episodes
(--eval_episodes per task, seeded --eval_seed, apart from the demos' seeds) and its success per
task is printed, logged and kept. <out>/params is what --config.warm_start loads; <out>/sft.json,
metrics.jsonl and tb/ say how it went.
"""

from __future__ import annotations

from absl import flags

from launch import common

_CONFIG = common.define_config()
_DEMOS = flags.DEFINE_string("demos", None, "Demo directory recorded by python -m launch.demos.")
_OUT = flags.DEFINE_string("out", None, "Directory for the pre-trained params (<out>/params) and its logs.")
_STEPS = flags.DEFINE_integer("steps", 2000, "Gradient steps.")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Demo steps per gradient step.")
_LR = flags.DEFINE_float("learning_rate", 3e-4, "Adam learning rate.")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 0, "Steps between held-out evaluations (0: only at the end).")
_EVAL_EPISODES = flags.DEFINE_integer("eval_episodes", 10, "Held-out episodes per task at each evaluation.")
_EVAL_SEED = flags.DEFINE_integer("eval_seed", 1_000_003, "Seed of the held-out envs (apart from the demos').")
_TRAIN_LOG_STD = flags.DEFINE_bool("train_log_std", False, "mlp, cnn: also fit the Gaussian std (it shrinks on "
                                   "near-deterministic demos, leaving RL little exploration).")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.")


def _table(by_task: dict | None) -> str:
  if not by_task:
    return ""
  return "\n".join(f"  {t:<28} {'-' if s is None else f'{s:.2f}'}" for t, s in by_task.items())


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}; use --demos=..., --out=... and --config.<key>=<value> flags")
  if not _DEMOS.value:
    common.fail("--demos is required: a demo directory recorded by python -m launch.demos")
  if not _OUT.value:
    common.fail("--out is required: the directory to save the pre-trained params in")
  for name, value in (("steps", _STEPS.value), ("batch_size", _BATCH.value), ("learning_rate", _LR.value),
                      ("eval_episodes", _EVAL_EPISODES.value)):
    if value <= 0:
      common.fail(f"--{name}={value} must be positive")
  if _EVAL_EVERY.value < 0:
    common.fail(f"--eval_every={_EVAL_EVERY.value} must be 0 (only at the end) or positive")
  cfg = common.config_value(_CONFIG)
  common.enable_compilation_cache()
  import jax  # pylint: disable=g-import-not-at-top

  from ebrl import validation  # pylint: disable=g-import-not-at-top
  from ebrl.sft import SFTConfig, SFTRun, pretrain  # pylint: disable=g-import-not-at-top

  from ebrl.validation import resolve  # pylint: disable=g-import-not-at-top

  run_spec = resolve(cfg)
  validation.check_devices(run_spec, jax.local_device_count())
  frozen = () if _TRAIN_LOG_STD.value else ("log_std",)
  run = SFTRun(demos=_DEMOS.value, out=_OUT.value, eval_episodes=_EVAL_EPISODES.value, eval_seed=_EVAL_SEED.value,
               progress=_PROGRESS.value,
               train=SFTConfig(steps=_STEPS.value, batch_size=_BATCH.value, learning_rate=_LR.value,
                               eval_every=_EVAL_EVERY.value, frozen=frozen))
  _, meta = pretrain(run_spec, run)
  print(f"sft {meta['policy']} on {meta['env']}: {meta['loss']} {meta['loss_first']:.4f} -> {meta['loss_last']:.4f} "
        f"({meta['demo_steps']} demo steps, {meta['steps']} steps)", flush=True)
  for ev in meta["held_out"]:
    print(f"held-out success at step {ev['step']}: {ev['success_rate']}", flush=True)
  table = _table(meta["final_success_rate_by_task"])
  if table:
    print("held-out success per task:\n" + table, flush=True)
  print(f"params saved to {_OUT.value}/params (--config.warm_start={_OUT.value})", flush=True)


def cli() -> None:
  """The `ebrl-sft` console command (pyproject.toml): the same flags as `python -m launch.sft`."""
  common.run(main)


if __name__ == "__main__":
  cli()
