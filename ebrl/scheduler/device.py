"""The fused on-device rollout for device simulators (mjx:..., brax:...).

When the simulator and the sampler share a device there is nothing to
pipeline: one jitted `lax.scan` runs T steps of (policy sample, sim step) for
every env without leaving the device, then the existing `Learner.update`
trains on the Rollout it built. Only finished episodes' return, length and
success (kept on the device by the DeviceSim) come back to the host, for the
same telemetry every other run writes. The fused rollout is timed as the
`sim` stage (generation happens inside it), the update as `train`.

A DeviceSim resets a finished env inside the step that ended its episode, so
every row of the rollout is a real transition (`valid` everywhere). A
truncated episode still bootstraps from the value of its final observation:
the scan adds gamma * V(final_obs) / reward_scale to that step's reward and
marks it terminal, which gives GAE exactly the targets it would compute had
the env stayed on the final observation for one more row.

`random` runs the same scan with uniform random actions and no learning: the
device simulator's own speed.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ebrl.telemetry.episodes import EpisodeTracker
from ebrl import normalizer
from ebrl.types import Rollout, TrainState
from policies.base import Policy
from sim_adapters.mjx.device_sim import DeviceSim, SimState


class Finished(NamedTuple):
  """Per step and env: whether an episode ended there, and its figures."""

  done: jax.Array  # bool [T, N]
  ret: jax.Array  # f32 [T, N]
  length: jax.Array  # int32 [T, N]
  success: jax.Array  # f32 [T, N]


def add_finished_episodes(tracker: EpisodeTracker, finished: Finished) -> None:
  """Hands the episodes that ended during a collect (measured on the device) to the tracker."""
  done = np.asarray(finished.done)
  if done.any():
    tracker.add_finished(np.asarray(finished.ret)[done], np.asarray(finished.length)[done],
                         np.asarray(finished.success)[done])


def make_collect(sim: DeviceSim, policy: Policy, horizon: int, gamma: float, reward_scale: float):
  """Jitted (params, sim_state, key, version) -> (sim_state, Rollout, Finished).

  params are the policy's, plus "value_norm" (TrainState.value_norm, see `acting_params`): the
  critic predicts standardised returns, and the truncation bootstrap is folded in return units.
  """
  low, high = jnp.asarray(sim.spec.action_low), jnp.asarray(sim.spec.action_high)
  step = sim._step  # pylint: disable=protected-access  # Inlined into the scan, not a nested jit.

  def value(params, obs):
    n = next(iter(obs.values())).shape[0]
    return policy.evaluate(params, obs, jnp.zeros((n, sim.spec.action_dim)))[2]

  def collect(params, state: SimState, key: jax.Array, version: jax.Array):
    def body(state: SimState, k):
      obs = state.obs
      action, logp, v, _ = policy.sample(params, obs, k)
      nxt = step(state, sim.place_action(jnp.clip(action, low, high)))
      # Bootstrap truncated episodes from their final observation (computed only when one ended).
      v_final = jax.lax.cond(jnp.any(nxt.truncated), lambda: value(params, nxt.final_obs),
                             lambda: jnp.zeros_like(v))
      v_final = normalizer.unstandardize(params["value_norm"], v_final)
      reward = nxt.reward + jnp.where(nxt.truncated, gamma * v_final / reward_scale, 0.0)
      row = dict(obs=obs, actions=action, logp=logp, values=v, rewards=reward, done=nxt.done,
                 fin=Finished(nxt.done, nxt.done_return, nxt.done_length, nxt.done_success))
      return nxt, row

    state, rows = jax.lax.scan(body, state, jax.random.split(key, horizon))
    values = jnp.concatenate([rows["values"], value(params, state.obs)[None]])
    done = rows["done"]
    chex.assert_shape(done, (horizon, sim.num_envs))
    rollout = Rollout(obs=rows["obs"], actions=rows["actions"], logp=rows["logp"], values=values,
                      rewards=rows["rewards"], terminated=done, done=done, valid=jnp.ones_like(done),
                      version=jnp.full(done.shape, version, jnp.int32))
    return state, rollout, rows["fin"]

  return jax.jit(collect, donate_argnums=(1,))


def acting_params(state: TrainState):
  """What a device collect acts with: the policy params and the value statistics."""
  return {**state.params, "value_norm": state.value_norm}


def make_random_collect(sim: DeviceSim, horizon: int):
  """Jitted (sim_state, key) -> (sim_state, Finished) with uniform random actions."""
  low, high = jnp.asarray(sim.spec.action_low), jnp.asarray(sim.spec.action_high)
  step = sim._step  # pylint: disable=protected-access

  def collect(state: SimState, key: jax.Array):
    def body(state, k):
      a = jax.random.uniform(k, (sim.num_envs, sim.spec.action_dim), minval=low, maxval=high)
      nxt = step(state, sim.place_action(a))
      return nxt, Finished(nxt.done, nxt.done_return, nxt.done_length, nxt.done_success)

    return jax.lax.scan(body, state, jax.random.split(key, horizon))

  return jax.jit(collect, donate_argnums=(0,))


class DeviceScheduler:
  """scheduler=sync (PPO) or random on a DeviceSim, each rollout one jitted call."""

  def __init__(self, trainer, learn: bool = True):
    self.t = trainer
    self.learn = learn
    self.sim: DeviceSim = trainer.device_sim
    # Initial states follow the launch's env seed (fresh on resume); actions the run seed and the
    # sampler's call counter, so a resumed run continues the key sequence.
    self.reset_key = jax.random.fold_in(jax.random.PRNGKey(trainer.env_seed), 0x5EED)
    self.key = jax.random.fold_in(jax.random.PRNGKey(trainer.cfg.seed), 0xAC7)
    self._replicated = NamedSharding(self.sim.mesh, P()) if self.sim.mesh is not None else None

  def _params(self):
    params = acting_params(self.t.state)
    return params if self._replicated is None else jax.device_put(params, self._replicated)

  def run(self, total_env_steps: int) -> None:
    t, sim, clock = self.t, self.sim, self.t.clock
    horizon = t.cfg.rollout_length
    lc = t.learner.cfg
    collect = (make_collect(sim, t.policy, horizon, lc.gamma, lc.reward_scale) if self.learn
               else make_random_collect(sim, horizon))
    with clock.stage("sim"):
      state = sim.reset(self.reset_key)
      jax.block_until_ready(state)
    while not t.should_stop(total_env_steps):
      # The sampler's call counter numbers the rollouts, so a resumed run continues the key sequence.
      key = jax.random.fold_in(self.key, t.sampler.calls)
      t.sampler.restore_counter(t.sampler.calls + 1)
      with clock.stage("sim"):
        if self.learn:
          state, rollout, finished = collect(self._params(), state, key, int(t.state.version))
        else:
          state, finished = collect(state, key)
        finished, nan_resets = jax.device_get((finished, state.nan_resets))
      add_finished_episodes(t.tracker, finished)
      sim.nan_resets = int(nan_resets)
      t.add_env_steps(sim.num_envs * horizon)
      metrics = {}
      if self.learn:
        with clock.stage("train"):
          t.state, metrics = t.learner.update(t.state, rollout)
          jax.block_until_ready(t.state)
        t.sampler.set_params(t.state.params, int(t.state.version))
      t.after_update(metrics)
