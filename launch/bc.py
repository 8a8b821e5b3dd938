"""Behaviour cloning: pretrain a policy on demonstrations, for a warm start of RL.

  python -m launch.bc --demos=demos.npz --out=runs/bc-reach \
      --config.env.name=MetaWorld/Reach-v3 --config.policy.name=mlp --steps=2000

The demos are an .npz with `actions` [M, action_dim] (env actions) and the
observations under `obs/<key>` [M, ...] (e.g. `obs/state`), as
ebrl.warm_start.save_demos writes them. The config flags are launch.train's:
env and policy must be the ones RL will use, since the params are checked
against them. The env is built once for its spec and closed; nothing is
simulated. The params are saved atomically with Orbax to <out>/params
(<out>/bc.json says how); ebrl.warm_start.load_params reads them back.
"""

from __future__ import annotations

import json
import os

from absl import flags

from launch import common

_CONFIG = common.define_config()
_DEMOS = flags.DEFINE_string("demos", None, "Demonstrations .npz: 'actions' and 'obs/<key>' arrays.")
_OUT = flags.DEFINE_string("out", None, "Directory to save the cloned params in (<out>/params).")
_STEPS = flags.DEFINE_integer("steps", 2000, "Gradient steps.")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Demo rows per gradient step.")
_LR = flags.DEFINE_float("learning_rate", 1e-3, "Adam learning rate.")
_TRAIN_LOG_STD = flags.DEFINE_bool("train_log_std", False, "Also fit the Gaussian std (it shrinks on "
                                   "near-deterministic demos, leaving RL little exploration).")


def env_spec(cfg):
  """The EnvSpec of cfg's env: built once (no reset, nothing simulated) and closed."""
  import jax  # pylint: disable=g-import-not-at-top

  from ebrl.errors import UserError  # pylint: disable=g-import-not-at-top
  from sim_adapters import is_device_env, make_adapter  # pylint: disable=g-import-not-at-top
  from sim_adapters.envpool_adapter import UnsupportedEnvError  # pylint: disable=g-import-not-at-top

  try:
    if is_device_env(cfg.env.name):
      from sim_adapters.mjx import make_device_sim  # pylint: disable=g-import-not-at-top
      env = make_device_sim(cfg.env.name, jax.local_device_count(), max_episode_steps=cfg.env.max_episode_steps)
    else:
      extra = {}
      if "chunk_size" in cfg.policy and cfg.policy.chunk_size > 1:  # Action chunks: the env's action is a chunk.
        extra = dict(chunk_size=cfg.policy.chunk_size, reward_type=cfg.env.get("reward_type", "chunk"),
                     gamma=cfg.algorithm.gamma)
      env = make_adapter(cfg.env.name, 1, num_threads=1, seed=cfg.seed, max_episode_steps=cfg.env.max_episode_steps,
                         from_pixels=cfg.env.from_pixels, render_size=cfg.env.render_size, **extra)
  except (UnsupportedEnvError, ValueError, RuntimeError) as e:
    raise UserError(str(e)) from None
  try:
    return env.spec
  finally:
    env.close()


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}; use --demos=..., --out=... and --config.<key>=<value> flags")
  if not _DEMOS.value:
    common.fail("--demos is required: an .npz with 'actions' and 'obs/<key>' arrays")
  if not _OUT.value:
    common.fail("--out is required: the directory to save the cloned params in")
  for name, value in (("steps", _STEPS.value), ("batch_size", _BATCH.value), ("learning_rate", _LR.value)):
    if value <= 0:
      common.fail(f"--{name}={value} must be positive")
  cfg = common.config_value(_CONFIG)
  common.enable_compilation_cache()
  import jax  # pylint: disable=g-import-not-at-top

  from ebrl import validation  # pylint: disable=g-import-not-at-top
  from ebrl import warm_start  # pylint: disable=g-import-not-at-top
  from ebrl import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from ebrl.errors import UserError  # pylint: disable=g-import-not-at-top
  from policies import IncompatibleObservationError, make_policy  # pylint: disable=g-import-not-at-top

  validation.validate(cfg, jax.local_device_count())
  try:
    demos = warm_start.load_demos(_DEMOS.value)
  except ValueError as e:
    raise UserError(str(e)) from None
  out = os.path.abspath(_OUT.value)
  if os.path.exists(os.path.join(out, warm_start.PARAMS_DIR)):
    raise UserError(f"--out='{_OUT.value}' already holds params; choose a new directory (they are never overwritten)")
  workdir_lib.check_writable(out, flag="out")
  spec = env_spec(cfg)
  try:
    num = warm_start.check_demos(demos, spec)
    policy = make_policy(cfg.policy.name, spec, cfg.policy)
  except (ValueError, IncompatibleObservationError) as e:
    raise UserError(str(e)) from None

  key = jax.random.PRNGKey(cfg.seed)
  init_key, train_key, eval_key = jax.random.split(key, 3)
  params = policy.init(init_key)
  frozen = () if _TRAIN_LOG_STD.value else ("log_std",)
  # The start loss is measured with the demo normaliser, as training sees it.
  start = warm_start.dataset_loss(policy, policy.update_normalizer(params, demos["obs"], jax.numpy.ones(num)),
                                  demos, eval_key)
  print(f"bc loss at start: {start:.4f} ({num} demo steps, env {spec.name}, policy {policy.name})", flush=True)
  log = lambda step, loss: print(f"  step {step}/{_STEPS.value}: minibatch loss {loss:.4f}", flush=True)
  params, losses = warm_start.bc_train(policy, params, demos, _STEPS.value, _BATCH.value, _LR.value, train_key,
                                       frozen=frozen, chunk=max(1, min(500, _STEPS.value // 4 or 1)), log=log)
  end = warm_start.dataset_loss(policy, params, demos, eval_key)
  print(f"bc loss at end: {end:.4f}", flush=True)
  meta = dict(env=spec.name, policy=policy.name, demos=os.path.abspath(_DEMOS.value), demo_steps=num,
              steps=_STEPS.value, batch_size=_BATCH.value, learning_rate=_LR.value, frozen=list(frozen),
              loss_start=start, loss_end=end, final_minibatch_loss=float(losses[-1]),
              config=json.loads(cfg.to_json_best_effort()))
  try:
    path = warm_start.save_params(out, params, meta)
  except ValueError as e:
    raise UserError(str(e)) from None
  print(f"params saved to {path}")


def cli() -> None:
  """The `ebrl-bc` console command (pyproject.toml): the same flags as `python -m launch.bc`."""
  common.run(main)


if __name__ == "__main__":
  cli()
