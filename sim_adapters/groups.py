"""Environment groups: the envs of a run split over several independent adapters.

Schedulers that overlap stages drive each group from its own thread (ebrl) or
in turn (pipelined): while one group simulates, another's actions are being
generated. Group g owns global env ids [offsets[g], offsets[g] + num_envs_g).
A run with one group is the plain single-adapter case.
"""

from __future__ import annotations

import dataclasses

import numpy as np


class EnvGroups:

  def __init__(self, adapters: list):
    self.adapters = adapters
    sizes = [a.num_envs for a in adapters]
    self.offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
    self.num_envs = int(sum(sizes))
    self.spec = adapters[0].spec

  def __len__(self) -> int:
    return len(self.adapters)

  def __getitem__(self, g: int):
    return self.adapters[g]

  def to_global(self, g: int, batch):
    """A copy of group g's batch header with its group-local env ids made global."""
    return dataclasses.replace(batch, env_ids=batch.env_ids + self.offsets[g])

  @property
  def nan_resets(self) -> int:
    return sum(a.nan_resets for a in self.adapters)

  def close(self) -> None:
    for a in self.adapters:
      a.close()
