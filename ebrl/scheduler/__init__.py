"""Schedulers wire simulation, generation and update: sync | pipelined | ebrl.

A run on a device simulator (trainer.device_sim set: mjx:..., brax:...) runs
`sync` and `random` as one fused on-device rollout per update (device.py) and
`ebrl` as env groups collecting on the device while the learner trains
(device_async.py).
"""

from __future__ import annotations

from ebrl.config import DEVICE_SCHEDULERS


def make_scheduler(name: str, trainer):
  if getattr(trainer, "device_sim", None) is not None:
    if name not in DEVICE_SCHEDULERS:
      raise ValueError(f"scheduler '{name}' cannot drive device env '{trainer.cfg.env.name}'; "
                       f"valid: {', '.join(DEVICE_SCHEDULERS)}")
    if name == "ebrl":
      from ebrl.scheduler.device_async import DeviceAsyncScheduler
      return DeviceAsyncScheduler(trainer)
    from ebrl.scheduler.device import DeviceScheduler
    return DeviceScheduler(trainer, learn=name == "sync")
  if name == "sync":
    from ebrl.scheduler.sync import SyncScheduler
    return SyncScheduler(trainer)
  if name == "pipelined":
    from ebrl.scheduler.pipelined import PipelinedScheduler
    return PipelinedScheduler(trainer)
  if name == "ebrl":
    from ebrl.scheduler.asynchronous import AsyncScheduler
    return AsyncScheduler(trainer)
  if name == "random":
    from ebrl.scheduler.random_actions import RandomScheduler
    return RandomScheduler(trainer)
  raise ValueError(f"unknown scheduler '{name}'")
