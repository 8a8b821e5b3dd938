"""RL fine-tuning of a pre-trained policy (`--config=launch/configs/finetune.py`).

  python -m launch.demos --env=MetaWorld/CoffeePull-v3 --episodes_per_task=10 --out=demos/coffee
  python -m launch.sft --config=launch/configs/finetune.py --demos=demos/coffee --out=runs/coffee-sft
  python -m launch.train --config=launch/configs/finetune.py --config.env.name=MetaWorld/CoffeePull-v3 \
      --config.warm_start=runs/coffee-sft --workdir=runs/coffee-rl

Why each setting (README.md, "RL fine-tuning from a pre-trained policy", has the table):
* The exploration noise is chosen, not inherited: launch.sft fits the Gaussian std by maximum
  likelihood on the demos and clips it to [policy.min_std, policy.max_std]; RL keeps it there. The
  floor is 0.2 because an expert's demos fit a std of about 0.05-0.15, too little noise for PPO to
  find anything its mean does not already do (PushBack-v3 went 0.38 -> 0.46 in 1M env steps at a
  floor of 0.05, 0.38 -> 0.98 at 0.2); the default std of 1.0 on actions in [-1, 1] drowns a good
  policy (success 0.02-0.14 where its mean succeeds 0.6-1.0).
* The observation statistics are the demos' and stay frozen (obs_norm_update=frozen): a pre-trained
  network fed inputs normalised by statistics that drift (near-constant demo dims especially) forgets
  what it learned within a few updates.
* The demonstrations stay in the update (bc_coef, DAPG): the imitation loss of pre-training on demo
  rows at every minibatch step, its weight decaying by bc_decay per update, so RL improves on the
  demos instead of wandering from them while the critic is still poor.
* The critic learns first: a fresh critic's advantages are noise, so only the critic trains until it
  explains critic_warmup_ev of the returns' variance (critic_warmup_updates caps it), and actor and
  critic have their own Adam states and rates (a small actor rate, DPPO / RLinf: ~1e-5 to 1e-4).
* Success is what is rewarded: the episode ends at its first success with a bonus of
  10 / (1 - gamma) (MetaWorld's largest step reward, for ever), in per-step units also with action
  chunks (env.reward_type="action": a chunk's reward is its actions' discounted sum). On MetaWorld's
  own dense reward a policy that hovers near the goal without succeeding earns nearly what a
  successful one earns, and fine-tuning from 0.76 success stayed at 0.78 in 1M env steps
  (CoffeePull-v3); evaluation keeps MetaWorld's protocol (500 steps, success at any step).
* Evaluation at the start and end, with mean and with sampled actions (summary.json's success_before
  and success_after).
"""

import math

from ebrl import defaults


def get_config():
  c = defaults.get_config()
  c.total_env_steps = 1_000_000
  c.eval_episodes = 50
  # Success-aligned reward (MetaWorld): an episode ends at its first success with a bonus worth what
  # staying at MetaWorld's largest step reward (10) would earn for ever, 10 / (1 - gamma): ending
  # early then never loses return against hovering, and reaching success sooner is worth more.
  c.env.end_on_success = True
  c.env.success_bonus = round(10.0 / (1.0 - c.algorithm.gamma), 6)  # 1000 at gamma 0.99.
  # The bonus is in per-step units: with action chunks a decision's reward must be its actions'
  # discounted sum, discounted by gamma^K per chunk ("action"). The default "chunk" sums K rewards and
  # discounts once per chunk, so hovering near the goal is worth K x 10 / (1 - gamma), K times the
  # bonus, and RL learns not to succeed (flow on MT10, chunks of 4: Reach 0.76 -> 0.13 in training).
  c.env.reward_type = "action"
  # The pre-trained policy's exploration (launch.sft fits the std within these bounds): at least 0.2
  # (BENCHMARKS.md, "The recipe's exploration floor": 0.05 against 0.2 on 10 tasks).
  c.policy.min_std = 0.2
  c.policy.max_std = 0.5
  c.policy.flow_init_log_std = math.log(0.1)
  c.policy.flow_min_log_std = math.log(0.05)
  c.policy.detach_critic = True  # vla: the value loss does not move the pre-trained trunk.
  # vla: a critic MLP of its own over [CLS], the state and the task one-hot. A linear head on the
  # detached [CLS] explained 0.09-0.14 of the MT10 returns' variance after its 20 warm-up updates, so
  # PPO's advantages were mostly noise. Pre-trained params with a linear head still load (warm starts
  # give a critic of another shape its fresh init: ebrl/warm_start.py).
  c.policy.vla_critic_hidden = (256, 256)
  a = c.algorithm
  a.obs_norm_update = "frozen"
  # The actor's rate must be small against the rate pre-training ended at: from a pre-training decayed
  # to 0 (launch.sft --lr_schedule=cosine) one Adam step at 1e-4 moved the vla 1.4-3.6x target_kl and
  # success fell; 4e-5 moved it about 0.001 an update, every step applied, and raised MT10 0.902 -> 0.922
  # (BENCHMARKS.md, "The vla on MT10 with a critic of its own").
  a.actor_learning_rate = 1e-4
  a.critic_learning_rate = 1e-3
  a.clip_eps = 0.1
  a.critic_warmup_updates = 20
  a.critic_warmup_ev = 0.5
  a.bc_coef = 0.1
  a.bc_decay = 0.98
  a.bc_batch_size = 256
  return c
