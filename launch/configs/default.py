"""The default run: goal-observable MetaWorld/Reach-v3, MLP policy, sync PPO on the CPU.

Override any field on the command line, e.g.
  python -m launch.train --config.env.name=CartpoleBalance-v1 --config.num_envs=64
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.env = ml_collections.ConfigDict(dict(
      name="MetaWorld/Reach-v3",
      num_threads=0,  # EnvPool worker threads; 0 = one per usable core.
      max_episode_steps=0,  # 0 = the task's own limit.
      from_pixels=False,  # Camera images as obs["pixels"] (needs a pixel policy).
      render_size=64,
  ))
  c.num_envs = 32
  c.rollout_length = 32  # T: steps per env between updates.
  c.total_env_steps = 600_000
  c.target_success = 0.9
  c.seed = 0
  c.scheduler = "sync"
  c.policy = ml_collections.ConfigDict(dict(name="mlp", hidden=(64, 64), init_log_std=-0.5))
  c.algorithm = ml_collections.ConfigDict(dict(
      name="ppo",
      gamma=0.99,
      gae_lambda=0.95,
      clip_eps=0.2,
      value_clip_eps=0.0,
      vf_coef=0.5,
      ent_coef=0.0,
      normalize_advantages=True,
      epochs=4,
      num_minibatches=4,
      learning_rate=3e-4,
      lr_schedule="constant",
      max_grad_norm=0.5,
      reward_scale=0.1,
  ))
  c.resume = False
  c.log_every_s = 2.0
  c.checkpoint_every_s = 30.0
  c.keep_checkpoints = 3
  return c
