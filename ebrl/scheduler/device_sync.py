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
the scan records gamma * V(final_obs) for that step (Rollout.bootstrap, which
the learner adds to the step's reward once it has scaled it) and marks it
terminal, which gives GAE exactly the targets it would compute had the env
stayed on the final observation for one more row.

`random` runs the same scan with uniform random actions and no learning: the
device simulator's own speed.
"""

from __future__ import annotations

from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from ebrl.acting import Finished, device_random_step, device_unroll
from ebrl.scheduler.context import RunContext, Scheduler, UpdateReport, report, update_and_publish
from ebrl.telemetry.episodes import EpisodeTracker
from ebrl.types import Rollout, TrainState
from policies.base import Policy
from sim_adapters.mjx.device_sim import DeviceSim, SimState


def add_finished_episodes(tracker: EpisodeTracker, finished: Finished) -> None:
  """Hands the episodes that ended during a collect (measured on the device) to the tracker."""
  done = np.asarray(finished.done)
  if done.any():
    tracker.add_finished(np.asarray(finished.ret)[done], np.asarray(finished.length)[done],
                         np.asarray(finished.success)[done])


def make_collect(sim: DeviceSim, policy: Policy, horizon: int, gamma: float):
  """Jitted (params, sim_state, key, version) -> (sim_state, Rollout, Finished): the sync update's
  Rollout, values bootstrapped from the obs after the last step."""
  scan, value = device_unroll(sim, policy, horizon, gamma)

  def collect(params, state: SimState, key: jax.Array, version: jax.Array):
    state, rows = scan(params, state, key)
    values = jnp.concatenate([rows["values"], value(params, state.obs)[None]])
    done = rows["done"]
    rollout = Rollout(obs=rows["obs"], actions=rows["actions"], logp=rows["logp"], values=values,
                      rewards=rows["rewards"], terminated=done, done=done, valid=jnp.ones_like(done),
                      version=jnp.full(done.shape, version, jnp.int32), bootstrap=rows["bootstrap"])
    return state, rollout, rows["fin"]

  return jax.jit(collect, donate_argnums=(1,))


def make_random_collect(sim: DeviceSim, horizon: int):
  """Jitted (sim_state, key) -> (sim_state, Finished) with uniform random actions."""
  random_step = device_random_step(sim)

  def collect(state: SimState, key: jax.Array):
    def body(state, k):
      nxt = random_step(state, k)
      return nxt, Finished(nxt.done, nxt.done_return, nxt.done_length, nxt.done_success)

    return jax.lax.scan(body, state, jax.random.split(key, horizon))

  return jax.jit(collect, donate_argnums=(0,))


def device_keys(seed: int, env_seed: int) -> tuple[jax.Array, jax.Array]:
  """(reset key, action key) of a device run: initial states follow the launch's env seed (fresh
  on resume), actions the run seed and the sampler's call counter, so a resumed run continues
  its key sequence."""
  return (jax.random.fold_in(jax.random.PRNGKey(env_seed), 0x5EED),
          jax.random.fold_in(jax.random.PRNGKey(seed), 0xAC7))


class DeviceSyncScheduler(Scheduler):
  """scheduler=sync (PPO) or random on a DeviceSim, each rollout one jitted call."""

  def __init__(self, ctx: RunContext, learn: bool = True):
    self.ctx = ctx
    self.learn = self.learns = learn
    self.sim: DeviceSim = ctx.device_sim
    self.reset_key, self.key = device_keys(ctx.seed, ctx.env_seed)

  def run(self, state: TrainState) -> Iterator[UpdateReport]:
    """Yields a report per rollout (an update's with learn, else the same state's) for as long as
    the caller takes them."""
    ctx, sim, clock = self.ctx, self.sim, self.ctx.clock
    horizon = ctx.layout.rollout_length
    lc = ctx.learner.cfg
    collect = (make_collect(sim, ctx.policy, horizon, lc.gamma) if self.learn
               else make_random_collect(sim, horizon))
    with clock.stage("sim"):
      sim_state = sim.reset(self.reset_key)
      jax.block_until_ready(sim_state)
    while True:
      key = jax.random.fold_in(self.key, ctx.sampler.take_call())
      with clock.stage("sim"):
        if self.learn:
          params, version = ctx.params.latest()
          sim_state, rollout, finished = collect(params, sim_state, key, version)
        else:
          sim_state, finished = collect(sim_state, key)
        finished, nan_resets = jax.device_get((finished, sim_state.nan_resets))
      add_finished_episodes(ctx.tracker, finished)
      sim.nan_resets = int(nan_resets)
      ctx.tracker.count_steps(sim.num_envs * horizon)
      if self.learn:
        done = update_and_publish(ctx, state, rollout)
        state = done.state
        yield done
      else:
        yield report(ctx, state, {})
