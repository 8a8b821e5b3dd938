"""Schedulers wire simulation, generation and update: sync | pipelined | ebrl | random.

Each takes a RunContext (ebrl/scheduler/context.py) and runs its loops from a
train state, yielding a report per update: `make_scheduler(name, ctx).run(state)`,
driven by ebrl/driver.py. A run on
a device simulator (ctx.device_sim set: mjx:..., brax:...) runs `sync` and
`random` as one fused on-device rollout per update (device_sync.py) and `ebrl` as
env groups collecting on the device while the learner trains (device_async.py).
"""

from __future__ import annotations

from ebrl.scheduler.context import RunContext


def make_scheduler(name: str, ctx: RunContext):
  """The scheduler `name` over ctx's envs (ebrl/validation.py has checked that it can drive them)."""
  if ctx.device_sim is not None:
    if name == "ebrl":
      from ebrl.scheduler.device_async import DeviceAsyncScheduler
      return DeviceAsyncScheduler(ctx)
    if name in ("sync", "random"):
      from ebrl.scheduler.device_sync import DeviceSyncScheduler
      return DeviceSyncScheduler(ctx, learn=name == "sync")
  elif name == "sync":
    from ebrl.scheduler.sync import SyncScheduler
    return SyncScheduler(ctx)
  elif name == "pipelined":
    from ebrl.scheduler.pipelined import PipelinedScheduler
    return PipelinedScheduler(ctx)
  elif name == "ebrl":
    from ebrl.scheduler.host_async import HostAsyncScheduler
    return HostAsyncScheduler(ctx)
  elif name == "random":
    from ebrl.scheduler.random import RandomScheduler
    return RandomScheduler(ctx)
  raise ValueError(f"no scheduler '{name}' for {'device' if ctx.device_sim is not None else 'host'} envs")
