"""One acting step per backend, shared by training and evaluation.

Why shared: what a policy sees and does must be the same when it is trained
and when it is evaluated (clipping to the env's bounds, which part of a raw
action the env gets, where the step is timed). Host envs step with
`host_step`; device simulators run `device_policy_step` inside a `lax.scan`
body (the fused rollout, the ebrl device groups and the device evaluator).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import jax
import jax.numpy as jnp

from ebrl.sampler import Actions, Sampler
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


def device_random_step(sim) -> Callable:
  """(sim_state, key) -> next sim_state with uniform random actions: the simulator's own speed."""
  low, high = jnp.asarray(sim.spec.action_low), jnp.asarray(sim.spec.action_high)
  step = sim._step  # pylint: disable=protected-access

  def random_step(state, key: jax.Array):
    a = jax.random.uniform(key, (sim.num_envs, sim.spec.action_dim), minval=low, maxval=high)
    return step(state, sim.place_action(a))

  return random_step
