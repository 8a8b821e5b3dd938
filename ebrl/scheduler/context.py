"""What a scheduler is given, and what it gives back after every update.

Why a bundle and not the Trainer: a scheduler owns only its loops. It reads
the envs, the sampler, the learner, the param store, the clock and the
episode tracker it is handed, counts its env steps on the tracker, and yields
an `UpdateReport` per update to the driver (ebrl/driver.py), which records
it, asks the tuners and hands their `Knobs` back through `apply`. Nothing
flows the other way: a scheduler calls no callback and knows nothing of the
run's outputs, so it can later run with stages in other processes or hosts.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Iterator

import jax

from ebrl.layout import RunLayout
from ebrl.learner import Learner
from ebrl.param_store import ParamStore
from ebrl.sampler import Sampler
from ebrl.telemetry.episodes import EpisodeTracker
from ebrl.telemetry.stages import StageClock
from ebrl.tuning import Knobs, UpdateReport
from ebrl.types import TrainState
from policies.base import Policy
from sim_adapters.base import EnvSpec


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
  tracker: EpisodeTracker  # Episodes and the env step count.
  stop: threading.Event = dataclasses.field(default_factory=threading.Event)  # Ctrl-C, a deadline: stop soon.
  host_envs: Any = None  # sim_adapters.groups.EnvGroups of host simulators, or None.
  device_sim: Any = None  # sim_adapters.mjx.DeviceSim, or None.
  seed: int = 0  # The run's seed (device action keys).
  env_seed: int = 0  # This launch's env seed (initial states; fresh on resume).
  max_staleness: int = 0  # ebrl: eta, the bound on a sample's policy lag.
  max_wait_s: float = 0.001  # ebrl on host envs: the longest a generation batch waits to fill.
  # ebrl on host envs: pins each stage's threads to its quota (ebrl.resources.manager.ResourceManager), or None.
  pinning: Any = None


def update_and_publish(ctx: RunContext, state: TrainState, batch, *, segments: bool = False, lane: str | None = None,
                       on_publish: Callable[[TrainState], None] | None = None,
                       force_started: int = 0) -> UpdateReport:
  """The tail of every scheduler's update: the update (timed as `train`), its end awaited, the new
  params published (then `on_publish`, e.g. to raise a queue's version); returns its report."""
  update = ctx.learner.update_segments if segments else ctx.learner.update
  with ctx.clock.stage("train", lane=lane):
    state, metrics = update(state, batch)
    jax.block_until_ready(state)
  ctx.params.publish(state)
  if on_publish is not None:
    on_publish(state)
  return report(ctx, state, metrics, force_started)


def report(ctx: RunContext, state: TrainState, metrics: dict, force_started: int = 0) -> UpdateReport:
  return UpdateReport(state=state, metrics=metrics, env_steps=ctx.tracker.env_steps, busy_s=ctx.clock.snapshot(),
                      time=time.time(), force_started=force_started)


class Scheduler:
  """What the driver (ebrl/driver.py) sees of a scheduler: reports out, knobs in."""

  # Its reports are updates, and a budget counts updates; else (random actions) rollouts, and a
  # budget counts env steps.
  learns = True
  # Training runs beside the rollout, so the rollout rate is the end-to-end rate (benchmarks).
  overlaps_training = False

  def run(self, state: TrainState) -> Iterator[UpdateReport]:
    """Yields a report per update, from `state` on, for as long as the caller takes them (a caller
    that stops closes the generator); ends early only when ctx.stop is set."""
    raise NotImplementedError

  def apply(self, knobs: Knobs) -> None:
    """A tuner's knobs (ebrl/tuning.py); those this scheduler does not have are ignored."""
    del knobs
