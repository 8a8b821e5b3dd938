"""One acting step per backend, shared by training and evaluation.

Why shared: what a policy sees and does must be the same when it is trained
and when it is evaluated (clipping to the env's bounds, which part of a raw
action the env gets, where the step is timed). Host envs step with
`host_step`; device simulators run `device_policy_step` inside a `lax.scan`
body, and `device_unroll` is the one T-step scan the fused rollout, the ebrl
device groups and the device evaluator share.
"""

from __future__ import annotations

import contextlib
from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from ebrl import normalizer
from ebrl.sampler import Actions, Sampler
from policies.base import action_size, state_value
from sim_adapters.base import StepBatch


def host_step(sampler: Sampler, adapter, obs: dict, clock=None) -> tuple[Actions, int, StepBatch]:
  """Actions for every env of `adapter` from the newest params, then one env step with them.
  Returns the actions, the params version that made them and the step's batch; `clock` (a
  StageClock) times generation as `gen` and the step as `sim`."""
  stage = clock.stage if clock is not None else (lambda name: contextlib.nullcontext())
  with stage("gen"):
    acts, version = sampler.act(obs)
  with stage("sim"):
    result = adapter.step(acts.env_action)
  return acts, version, result


def device_policy_step(sim, policy) -> Callable:
  """(params, sim_state, key) -> (next sim_state, (raw action, logp, value)): one policy sample and
  one step of every env of the DeviceSim, inlined into the caller's scan (not a nested jit)."""
  low, high = jnp.asarray(sim.spec.action_low), jnp.asarray(sim.spec.action_high)
  step = sim._step  # pylint: disable=protected-access

  def act_and_step(params, state, key: jax.Array):
    action, logp, value, _ = policy.sample(params, state.obs, key)
    env_action = jnp.clip(action[..., :sim.spec.action_dim], low, high)
    return step(state, sim.place_action(env_action)), (action, logp, value)

  return act_and_step


class Finished(NamedTuple):
  """Per step and env: whether an episode ended there, and its figures."""

  done: jax.Array  # bool [T, N]
  ret: jax.Array  # f32 [T, N]
  length: jax.Array  # int32 [T, N]
  success: jax.Array  # f32 [T, N]


def device_unroll(sim, policy, horizon: int, gamma: float):
  """(params, sim_state, key) -> (sim_state, rows): T steps of policy sample + sim step for every
  env, as one lax.scan (traced inside the caller's jit). rows hold [T, N] obs, actions, logp,
  values, rewards, bootstrap, done and Finished. A truncated episode bootstraps from the value of
  its final observation: `bootstrap` is gamma * V(final_obs) on that step (0 elsewhere), which the
  learner adds to the step's reward after scaling it, and the step counts as terminal
  (ebrl/scheduler/device_sync.py says why). The sync rollout, the ebrl device groups and the
  device evaluator all unroll with it.

  params are the policy's, plus "value_norm" (the ParamStore's `with_value_stats`): the critic
  predicts standardised returns, and the truncation bootstrap is folded in return units.
  """
  act_and_step = device_policy_step(sim, policy)
  value = lambda params, obs: state_value(policy, params, obs, action_size(policy, sim.spec))

  def scan(params, state, key: jax.Array):
    def body(state, k):
      obs = state.obs
      nxt, (action, logp, v) = act_and_step(params, state, k)
      # Bootstrap truncated episodes from their final observation (computed only when one ended).
      v_final = jax.lax.cond(jnp.any(nxt.truncated), lambda: value(params, nxt.final_obs),
                             lambda: jnp.zeros_like(v))
      v_final = normalizer.unstandardize(params["value_norm"], v_final)
      row = dict(obs=obs, actions=action, logp=logp, values=v, rewards=nxt.reward,
                 bootstrap=jnp.where(nxt.truncated, gamma * v_final, 0.0), done=nxt.done,
                 fin=Finished(nxt.done, nxt.done_return, nxt.done_length, nxt.done_success))
      return nxt, row

    state, rows = jax.lax.scan(body, state, jax.random.split(key, horizon))
    chex.assert_shape(rows["done"], (horizon, sim.num_envs))
    return state, rows

  return scan, value


def device_random_step(sim) -> Callable:
  """(sim_state, key) -> next sim_state with uniform random actions: the simulator's own speed."""
  low, high = jnp.asarray(sim.spec.action_low), jnp.asarray(sim.spec.action_high)
  step = sim._step  # pylint: disable=protected-access

  def random_step(state, key: jax.Array):
    a = jax.random.uniform(key, (sim.num_envs, sim.spec.action_dim), minval=low, maxval=high)
    return step(state, sim.place_action(a))

  return random_step
