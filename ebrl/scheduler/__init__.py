"""Schedulers wire simulation, generation and update: sync | pipelined | ebrl | random.

Each takes a RunContext (ebrl/scheduler/context.py) and runs its loops from a
train state: `make_scheduler(name, ctx).run(state, total_env_steps)`. A run on
a device simulator (ctx.device_sim set: mjx:..., brax:...) runs `sync` and
`random` as one fused on-device rollout per update (device.py) and `ebrl` as
env groups collecting on the device while the learner trains (device_async.py).
"""

from __future__ import annotations

from ebrl.config import DEVICE_SCHEDULERS
from ebrl.scheduler.context import RunContext


def make_scheduler(name: str, ctx: RunContext):
  if ctx.device_sim is not None:
    if name not in DEVICE_SCHEDULERS:
      raise ValueError(f"scheduler '{name}' cannot drive a device env; valid: {', '.join(DEVICE_SCHEDULERS)}")
    if name == "ebrl":
      from ebrl.scheduler.device_async import DeviceAsyncScheduler
      return DeviceAsyncScheduler(ctx)
    from ebrl.scheduler.device import DeviceScheduler
    return DeviceScheduler(ctx, learn=name == "sync")
  if name == "sync":
    from ebrl.scheduler.sync import SyncScheduler
    return SyncScheduler(ctx)
  if name == "pipelined":
    from ebrl.scheduler.pipelined import PipelinedScheduler
    return PipelinedScheduler(ctx)
  if name == "ebrl":
    from ebrl.scheduler.asynchronous import AsyncScheduler
    return AsyncScheduler(ctx)
  if name == "random":
    from ebrl.scheduler.random_actions import RandomScheduler
    return RandomScheduler(ctx)
  raise ValueError(f"unknown scheduler '{name}'")
