"""Runs in the peer's interpreter (Stable-Baselines3 + torch): one PPO update's inputs and outputs.

  <peer python> launch/peer_side/sb3_update_dump.py --peer_dir=<dir of the harness> \
      --env=MetaWorld/DialTurn-v3 --updates_before=3 --out=update.npz

Builds PPO as the harness does (64 EnvPool envs x 128 steps under VecNormalize, 64x64 tanh actor
and critic, lr 3e-4, 10 epochs) but with one minibatch of the whole batch, so that the update is
deterministic given its data: no shuffling changes a full-batch gradient. After `updates_before`
updates it collects one more rollout and saves the buffer (observations as normalised, actions,
rewards with truncations' bootstraps, episode starts, values, log-probs, advantages, returns; in
[T, N] order), the policy and Adam's moments before the update, the policy after it, and what SB3
logged. `launch.peer_update_check` replays that update in EBRL's learner and compares.
"""

import argparse
import importlib
import sys

import numpy as np


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--peer_dir", required=True, help="directory of sb3_ppo_metaworld.py and envpool_sb3_vecenv.py")
  p.add_argument("--env", default="MetaWorld/DialTurn-v3")
  p.add_argument("--updates_before", type=int, default=3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", required=True)
  a = p.parse_args()
  sys.path.insert(0, a.peer_dir)
  # Looked up by name: these are the peer's libraries, in the peer's interpreter, never EBRL's
  # dependencies (nothing of EBRL's imports them, and its Bazel targets do not list them).
  torch = importlib.import_module("torch")
  EnvpoolSB3VecEnv = importlib.import_module("envpool_sb3_vecenv").EnvpoolSB3VecEnv  # pylint: disable=invalid-name
  PPO = importlib.import_module("stable_baselines3").PPO  # pylint: disable=invalid-name
  vec_env = importlib.import_module("stable_baselines3.common.vec_env")
  VecMonitor, VecNormalize = vec_env.VecMonitor, vec_env.VecNormalize  # pylint: disable=invalid-name

  torch.set_num_threads(1)
  n_envs, n_steps = 64, 128
  venv = VecNormalize(VecMonitor(EnvpoolSB3VecEnv(a.env, n_envs, num_threads=2, seed=a.seed, partially_observable=False)),
                      norm_obs=True, norm_reward=True, gamma=0.99)
  model = PPO("MlpPolicy", venv, n_steps=n_steps, batch_size=n_envs * n_steps, n_epochs=10, learning_rate=3e-4,
              gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.0,
              policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64])), device="cpu", seed=a.seed, verbose=0)
  _, callback = model._setup_learn(total_timesteps=10**9, callback=None)  # pylint: disable=protected-access
  callback.on_training_start(locals(), globals())
  for i in range(a.updates_before + 1):
    model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=n_steps)
    if i < a.updates_before:
      model.train()
  buf = model.rollout_buffer
  # Copied before train(): its minibatch generator flattens the buffer in place.
  data = {k: np.array(getattr(buf, k), np.float32) for k in
          ("observations", "actions", "rewards", "episode_starts", "values", "log_probs", "advantages", "returns")}
  before = {k: v.detach().numpy().copy() for k, v in model.policy.state_dict().items()}
  names = [n for n, _ in model.policy.named_parameters()]
  adam, step = {}, 0
  for i, n in enumerate(names):
    st = model.policy.optimizer.state_dict()["state"].get(i)
    if st:
      adam[n + ".m"], adam[n + ".v"] = st["exp_avg"].numpy().copy(), st["exp_avg_sq"].numpy().copy()
      step = int(st["step"])
  model.train()
  after = {k: v.detach().numpy().copy() for k, v in model.policy.state_dict().items()}
  logged = {k.split("/", 1)[1]: np.array(float(v)) for k, v in model.logger.name_to_value.items()}
  np.savez(a.out, **data, adam_step=np.array(step), **{"before/" + k: v for k, v in before.items()},
           **{"after/" + k: v for k, v in after.items()}, **{"adam/" + k: v for k, v in adam.items()},
           **{"logged/" + k: v for k, v in logged.items()})
  print(f"wrote {a.out}: {a.updates_before} updates before, Adam step {step}")


if __name__ == "__main__":
  main()
