"""The default run: goal-observable MetaWorld/Reach-v3, MLP policy, sync PPO on the CPU.

Every key a run config has is here (a key not here is a typo). Override any field
on the command line, e.g.
  python -m launch.train --config.env.name=CartpoleBalance-v1 --config.num_envs=64
or from Python: `ebrl.train(overrides={"env.name": "CartpoleBalance-v1"})`.
"""

from typing import Any, Mapping

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.env = ml_collections.ConfigDict(dict(
      name="MetaWorld/Reach-v3",
      num_threads=0,  # EnvPool worker threads; 0 = one per usable core.
      max_episode_steps=0,  # 0 = the task's own limit.
      from_pixels=False,  # Camera images as obs["pixels"] (needs a pixel policy).
      render_size=64,
      # With from_pixels: state and pixels, drawn by EBRL's render stage (one render thread,
      # its own resource quota) instead of EnvPool's pixel-only pools.
      render_stage=False,
      # Injected stragglers (benchmarks): this fraction of envs takes `slowdown` times
      # longer per step; step_ms fixes one env's step time (0 = measured).
      straggler_fraction=0.0,
      straggler_slowdown=1.0,
      straggler_step_ms=0.0,
      # Injected demand shift (benchmarks): from shift_at_s seconds into the run, every env
      # step costs shift_sim_us more CPU in the simulator stage (0 = never).
      shift_at_s=0.0,
      shift_sim_us=0.0,
      # With action chunks (policy.chunk_size > 1): a chunk's reward is the sum of its actions'
      # rewards ("chunk"), or their discounted sum with gamma^K between chunks ("action").
      reward_type="chunk",
      # Training on MetaWorld host envs only (evaluation keeps MetaWorld's protocol): added to the
      # reward of every step that reports success; end each episode at its first success (a true
      # terminal, the env reset for its next episode). sim_adapters/success.py.
      success_bonus=0.0,
      end_on_success=False,
      dense_reward_scale=1.0,  # MetaWorld: factor on its shaped reward (0 = the success bonus alone).
  ))
  c.num_envs = 64
  c.rollout_length = 128  # T: steps per env between updates (64 x 128 = 8,192 samples per update).
  c.total_env_steps = 600_000
  c.target_success = 0.9
  c.seed = 0
  c.scheduler = "sync"
  c.policy = ml_collections.ConfigDict(dict(
      name="mlp",
      hidden=(64, 64),
      init_log_std=0.0,
      # mlp, cnn: bounds of the action std (log_std clipped to [log min_std, log max_std] in the
      # forward pass); 0.0 = no bound on that side.
      min_std=0.0,
      max_std=0.0,
      chunk_size=1,  # Actions per decision; every env executes its chunk and returns on its own.
      channels=(16, 32, 32),  # cnn: conv channels (strided 3x3 / 4x4 layers on 64x64 pixels).
      bins=256,  # vla: action token bins per dimension (OpenVLA).
      width=64,  # vla: token width.
      depth=2,  # vla: transformer blocks.
      heads=4,  # vla: attention heads.
      decode="parallel",  # vla: "parallel" (OpenVLA-OFT) or "autoregressive" action tokens.
      # vla: the value head reads stop_gradient of the trunk's features, so the value loss does not
      # move the trunk the actor shares (RLinf / piRL's fine-tuning recipe).
      detach_critic=False,
      # vla: () = a linear value head on the trunk's [CLS] feature; layer sizes = a critic MLP of its own
      # over [CLS], the normalised state and the task one-hot (fine-tuning: see launch/configs/finetune.py).
      vla_critic_hidden=(),
      flow_steps=4,  # flow: noisy Euler steps of the sampling chain.
      flow_init_log_std=-1.0,  # flow: initial log noise scale per step.
      flow_min_log_std=-4.0,  # flow: floor of the log noise scale (fine-tuning: e.g. log(0.05) = -3.0).
      flow_hidden=(256, 256),  # flow: the velocity net's layers (`hidden` sizes the other policies).
      # flow: fine-tune only the last K denoising steps (DPPO); the first flow_steps - K use a frozen
      # copy of the velocity net, params["base"]. 0 = every step.
      flow_finetune_steps=0,
  ))
  c.algorithm = ml_collections.ConfigDict(dict(
      name="ppo",  # "ppo" or "grpo" (critic-free group-relative advantages; scheduler=sync only)
      group_size=8,  # grpo: consecutive envs sharing an env seed (same initial states); divides num_envs
      gamma=0.99,
      gae_lambda=0.95,
      clip_eps=0.2,
      value_clip_eps=0.0,
      # The loss is vf_coef * 0.5 * mean((V - R)^2): 1.0 weighs the critic as SB3's PPO does (its
      # vf_coef 0.5 without the half). BENCHMARKS.md "PPO from scratch on the 50 MetaWorld tasks".
      vf_coef=1.0,
      ent_coef=0.0,
      normalize_advantages=True,
      epochs=10,
      num_minibatches=8,
      learning_rate=3e-4,
      lr_schedule="constant",  # Or "linear": to 0 over the updates total_env_steps pays for.
      max_grad_norm=0.5,
      # Stop an update's remaining minibatch steps once one measures approx KL > 1.5 * target_kl
      # (0 = every epoch runs).
      target_kl=0.0,
      reward_scale=1.0,
      # Rewards divided by a running std of each env's discounted return (as Stable-Baselines3's
      # VecNormalize), before reward_scale multiplies them (ebrl/normalizer.py normalize_rewards).
      # On by default: a fixed scale left MetaWorld's returns (hundreds to thousands) so large that
      # the value loss filled the 0.5 gradient-norm clip (norm 3-11) and the policy barely moved
      # (KL ~1e-3 per update); normalised, the norm stays 0.3-0.6 and tasks that stalled learn.
      reward_norm=True,
      # When the observation statistics take an update's batch: "after" its epochs, "before"
      # them, or "every_step" as each env step returns it (VecNormalize's timing; scheduler=sync,
      # host envs, mlp; ebrl/step_normalizer.py), or "frozen": never (a warm start's statistics stay as
      # pre-training fitted them). ebrl/learner.py LearnerConfig says how.
      obs_norm_update="after",
      # The critic predicts returns standardised by running statistics of its targets, whose
      # history weighs as at most value_norm_count samples.
      value_norm=False,
      value_norm_count=100_000,
      # Off-policy correction of stale samples (scheduler=ebrl): "decoupled_ppo" or "vtrace".
      correction="decoupled_ppo",
      behaviour_weight_clip=2.0,  # Decoupled PPO: cap on prox / behaviour (stale samples).
      vtrace_rho_clip=1.0,  # V-trace: truncation of the importance weight in targets and advantages.
      vtrace_c_clip=1.0,  # V-trace: truncation of the trace-cutting coefficients.
      # Fine-tuning from warm_start: the first critic_warmup_updates updates train only the critic
      # (the acting policy stays bit-identical), and ref_kl_coef weighs a KL penalty toward the
      # warm-start params (0 = none).
      critic_warmup_updates=0,
      ref_kl_coef=0.0,
      # With critic_warmup_ev > 0 the warm-up ends once the critic explains that fraction of the value
      # targets' variance (critic_warmup_updates caps it); ref_kl_mode "mean" penalises only a Gaussian
      # policy's mean moving from the reference's (in its std), "sample" the whole KL on the batch's actions.
      critic_warmup_ev=0.0,
      ref_kl_mode="sample",
      # Actor and critic with Adam states, gradient clips and rates of their own when either is > 0
      # (0 = learning_rate); both 0: one Adam over every parameter.
      actor_learning_rate=0.0,
      critic_learning_rate=0.0,
      # The demonstration term: bc_coef * bc_decay**update times the policy's imitation loss (launch.sft's)
      # on bc_batch_size demo steps per minibatch step, from bc_demos ("" = the demos the warm start was
      # pre-trained on, named by its sft.json). 0 = off.
      bc_coef=0.0,
      bc_decay=1.0,
      bc_batch_size=256,
      bc_demos="",
      # PPO's ratio per "decision" (an action or a chunk) or per "token" (vla: each action token's
      # ratio clipped on its own; a chunk of 4 x 4 dims is 16 tokens, whose product ratio leaves the
      # clip range after tiny per-token moves; flow: each denoising step's, DPPO's denoising MDP).
      ratio_level="decision",
  ))
  # scheduler=ebrl: env groups on their own threads, dynamic generation batches, async learner.
  c.ebrl = ml_collections.ConfigDict(dict(
      num_groups=0,  # 0 = auto: 1 for a multi-task MetaWorld env (its task pools are independent), else 2.
      recv_batch=0,  # Envs EnvPool returns per recv; 0 = half a group (multi-task: all but one per task pool);
      # all envs of a group = the fully batched layout (sync-mode pools, every env steps together).
      max_gen_batch=0,  # Most rows in one generation batch; 0 = recv_batch * num_groups.
      max_wait_ms=1.0,  # Longest wait for more ready envs before generating.
      max_staleness=2,  # eta: no sample used is more than eta policy versions old.
      segments_per_update=0,  # Segments of rollout_length steps per update; 0 = num_envs.
  ))
  # scheduler=pipelined: envs in stages that take turns (RLinf's pipeline_stage_num).
  c.pipelined = ml_collections.ConfigDict(dict(num_partitions=2))
  # How the ebrl scheduler's stages get cores and batch sizes (ebrl/resources/):
  # off = the ebrl.* sizes, every thread on every core; auto = profile, plan and re-plan
  # on drift; naive = equal split of the cores between sim, gen and train, no feedback;
  # manual = the quotas below. Other schedulers keep their fixed layout. On a device simulator
  # only auto applies: it probes overlap against a barrier (ebrl/resources/overlap.py).
  # Local devices per stage (ebrl/resources/devices.py): "" default (train on all, generate on device
  # 0, a device simulator on all), "auto", a count ("2"), or indices ("0,1"; stages may share).
  c.devices = ml_collections.ConfigDict(dict(gen="", train="", sim=""))
  c.resources = "off"
  # Where the ebrl learner runs (host envs): "threads" (beside generation, one process),
  # "processes" (a spawned learner process: segments and params through shared memory; on a GPU
  # each process can hold an MPS SM share), "auto" = the plan's choice (threads without a plan).
  c.placement = "auto"
  c.quotas = ml_collections.ConfigDict(dict(
      profile="",  # profile.json to plan from (launch.profile); "" = measured at start, cached.
      control_interval_s=5.0,  # resources=auto: controller window; 0 = no runtime feedback.
      overlap_probe_s=1.0,  # resources=auto, fully batched plan or device sim: A/B windows of overlap vs barrier; 0 = off.
      sim_cores="",  # resources=manual: core lists like "0-3".
      gen_cores="",
      train_cores="",
      render_cores="",  # resources=manual with env.render_stage: "" = beside sim.
      sim_threads=0,  # resources=manual: EnvPool threads per pool; 0 = one per sim core.
      # placement=processes under MPS: the learner process's SM percentage; 0 = its part of the
      # profiled GPU time per env step (generation keeps every SM).
      learner_sm_percent=0,
      # placement=processes: the learner process's CPU scheduling. "idle" (SCHED_IDLE) runs it only on
      # cycles the rollout leaves, so the rollout's sim -> gen chain keeps its speed and the learner
      # fills its gaps; "normal" competes on equal terms; "auto" = idle where the learner computes on
      # the CPU, normal on an accelerator (there its host thread only launches kernels, and delaying
      # those behind a busy simulator would idle the GPU).
      learner_priority="auto",
  ))
  c.warm_start = ""  # Policy params to start from: a launch.train workdir/checkpoint or a launch.sft --out dir.
  # Evaluation episodes (per task on a multi-task env) of the policy the run starts from and of the
  # one it ends with, on env seeds training never uses: summary.json's start_eval and final_eval.
  # 0 = none.
  c.eval_episodes = 0
  c.resume = False
  c.log_every_s = 2.0
  c.checkpoint_every_s = 30.0
  c.keep_checkpoints = 3
  return c


def flatten(config: Mapping | ml_collections.ConfigDict, prefix: str = "") -> dict[str, Any]:
  """{"env.name": ..., "algorithm.gamma": ...}: a config (a ConfigDict, or the plain nested dicts a
  workdir's config.json holds) as dotted keys, the form the CLI and `ebrl.train(overrides=...)` take."""
  out = {}
  for key, value in config.items():
    if isinstance(value, (Mapping, ml_collections.ConfigDict)):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out
