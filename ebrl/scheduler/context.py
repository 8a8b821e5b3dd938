"""What a scheduler is given: the run's stages, its sizes and where its results go.

Why a bundle and not the Trainer: a scheduler owns only its loops. It reads
the envs, the sampler, the learner, the param store, the clock and the
episode tracker it is handed, and reports through `RunLog` (env steps taken,
each update's state and metrics, whether to stop). The Trainer builds this
bundle and owns every output (metrics, checkpoints, summary), so a scheduler
can later run with stages in other processes or hosts without reaching into
a run object.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

from ebrl.layout import RunLayout
from ebrl.learner import Learner
from ebrl.param_store import ParamStore
from ebrl.sampler import Sampler
from ebrl.telemetry.episodes import EpisodeTracker
from ebrl.telemetry.stages import StageClock
from ebrl.types import TrainState
from policies.base import Policy
from sim_adapters.base import EnvSpec


@dataclasses.dataclass(frozen=True)
class RunLog:
  """Where a scheduler's progress goes (the Trainer's own methods, see ebrl/trainer.py)."""

  add_env_steps: Callable[[int], None]  # n env steps taken; their episodes are with the tracker.
  after_update: Callable[[TrainState, dict], None]  # An update made this state: log, checkpoint.
  should_stop: Callable[[int], bool]  # Budget (env steps) spent, deadline passed or stop requested.
  note_force_started: Callable[[int], None]  # Segments started beyond the staleness capacity.


@dataclasses.dataclass(frozen=True)
class RunContext:
  layout: RunLayout
  spec: EnvSpec
  action_size: int  # Width of a raw policy action (a flow policy's carries its chain).
  policy: Policy
  sampler: Sampler
  learner: Learner
  params: ParamStore
  clock: StageClock
  tracker: EpisodeTracker
  log: RunLog
  host_envs: Any = None  # sim_adapters.groups.EnvGroups of host simulators, or None.
  device_sim: Any = None  # sim_adapters.mjx.DeviceSim, or None.
  seed: int = 0  # The run's seed (device action keys).
  env_seed: int = 0  # This launch's env seed (initial states; fresh on resume).
  max_staleness: int = 0  # ebrl: eta, the bound on a sample's policy lag.
  max_wait_s: float = 0.001  # ebrl on host envs: the longest a generation batch waits to fill.
  resources: Any = None  # ebrl.resources.manager.ResourceManager, or None.
  overlap: Any = None  # ebrl.resources.overlap.OverlapSwitch: the queue listens for its admission; or None.


def update_and_publish(ctx: RunContext, state: TrainState, batch, *, segments: bool = False, lane: str | None = None,
                       on_publish: Callable[[TrainState], None] | None = None) -> TrainState:
  """The tail of every scheduler's update: the update (timed as `train`), its end awaited, the new
  params published (then `on_publish`, e.g. to raise a queue's version), the update logged."""
  update = ctx.learner.update_segments if segments else ctx.learner.update
  with ctx.clock.stage("train", lane=lane):
    state, metrics = update(state, batch)
    jax.block_until_ready(state)
  ctx.params.publish(state)
  if on_publish is not None:
    on_publish(state)
  ctx.log.after_update(state, metrics)
  return state
