"""Schedulers wire simulation, generation and update: sync | pipelined | ebrl."""

from __future__ import annotations


def make_scheduler(name: str, trainer):
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
