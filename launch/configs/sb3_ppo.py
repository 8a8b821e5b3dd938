"""Stable-Baselines3's PPO, as its MetaWorld harness runs it, in EBRL (`--config=launch/configs/sb3_ppo.py`).

The preset that reproduces the peer (`shared/peers/sb3_ppo_metaworld.py`: PPO("MlpPolicy") over
VecNormalize(norm_obs, norm_reward, gamma=0.99), 64 envs x 128 steps, 10 epochs of 8 minibatches
of 1,024, lr 3e-4, 64x64 tanh actor and critic) so that EBRL's PPO can be checked against it and
each difference from EBRL's default measured alone. What EBRL's default shares with it:
separate orthogonally initialised tanh MLPs (gains sqrt(2), 0.01 policy, 1 value), a state-
independent log-std starting at 0, Gaussian actions clipped to the bounds by the env side with
the log-prob of the unclipped sample, advantages normalised per minibatch, truncated episodes
bootstrapped from the value of their final observation, Adam with eps 1e-5, gradients clipped
to a global norm of 0.5, no value clipping, no entropy bonus, observations standardised by
running statistics and clipped to +-10, and (since the 50-task sweep in BENCHMARKS.md made them
the default) the first two below, which this preset pins so that it keeps reproducing the peer
whatever the default becomes, and the third, which only this preset sets:

- rewards divided by a running std of the discounted return and clipped to +-10
  (VecNormalize's norm_reward; `algorithm.reward_norm`), not multiplied by a fixed scale;
- the value loss weighted as SB3 weighs it: vf_coef * mean((V - R)^2), where EBRL's loss is
  vf_coef * 0.5 * mean((V - R)^2), so vf_coef = 1.0 here;
- observations counted and normalised at every env step as they arrive, the final observation of
  an ended episode normalised but not counted (VecNormalize's norm_obs timing;
  `algorithm.obs_norm_update=every_step`, ebrl/step_normalizer.py): the policy acts and the update
  trains on exactly those inputs. EBRL's default counts a rollout's observations once, after the
  update's epochs (`after`); BENCHMARKS.md ("PPO from scratch on the 50 MetaWorld tasks") measures
  the timings against each other.

What is left between the two runs is the random numbers (initialisation, action noise, minibatch
order) and EnvPool's reset row, which EBRL masks out of the update (tests/sim_adapters/test_autoreset_equivalence.py).
"""

from ebrl import defaults


def get_config():
  c = defaults.get_config()
  c.algorithm.reward_norm = True
  c.algorithm.reward_scale = 1.0
  c.algorithm.vf_coef = 1.0
  c.algorithm.obs_norm_update = "every_step"
  return c
