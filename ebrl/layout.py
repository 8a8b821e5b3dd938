"""RunLayout: every size a run derives from its config, computed once.

Why one place: validation, the env builders, the learner's schedule, the
resource planner and every scheduler need the same numbers (how many env
groups, how many envs each, how many samples an update takes, how many
updates the budget pays for). Each is derived once, by `ebrl.spec.derive_layout`
when a run's spec is built (and once more from a resource plan, which sizes the
groups for the machine), so nothing else can disagree with it. The module sits
at the bottom of the import graph.

What each field means for each scheduler:
* sync, random: one group of all envs, one update per `rollout_length` steps of every env.
* pipelined: `pipelined.num_partitions` groups ("env partitions") that take turns within a rollout.
* ebrl: `ebrl.num_groups` groups stepping independently; an update takes
  `segments_per_update` finished segments of `rollout_length` steps.

In a run over several processes the sizes are one process's share: its envs,
its groups, the segments it gives each update (`num_processes` times that is
the update's batch); the update count is the run's.
"""

from __future__ import annotations

import dataclasses
import math



def envs_per_group(num_envs: int, num_groups: int) -> int:
  """Envs in each of num_groups equal groups (validation rejects a remainder)."""
  return num_envs // num_groups


@dataclasses.dataclass(frozen=True)
class RunLayout:
  """The sizes of one run (see the module docstring)."""

  num_envs: int
  num_groups: int
  envs_per_group: int
  rollout_length: int  # Steps (decisions) per env between updates / per segment.
  segments_per_update: int  # Env segments of rollout_length steps in one update.
  samples_per_update: int
  total_updates: int  # Updates the step budget pays for; the rate schedule decays over them.
  recv_batch: int | None  # ebrl on host envs: envs a group's recv returns; None elsewhere.
  max_gen_batch: int | None  # ebrl on host envs: rows the sampler merges into one call.
  gen_batch_fixed: bool  # ebrl.max_gen_batch set by the user: a re-plan keeps it.
  sim_threads: int  # EnvPool worker threads of each group's pool (0 = one per usable core).
  thread_affinity_offset: int  # EnvPool's first pinned core; -1 = not pinned.
  chunk_size: int  # Actions per decision.
  gamma: float  # The learner's discount per transition (one transition = one chunk).
  # A run over several processes: each holds `num_envs` of the run's num_processes * num_envs
  # envs and gives `segments_per_update` segments to every update (ebrl/spec.py's `share`).
  num_processes: int = 1
  process_index: int = 0

  @property
  def run_num_envs(self) -> int:
    """Every process's envs: the run's num_envs."""
    return self.num_envs * self.num_processes

  @property
  def env_id_offset(self) -> int:
    """This process's first env in the run's numbering (the learner's per-env statistics)."""
    return self.num_envs * self.process_index

  def updates_for(self, total_env_steps: int) -> int:
    """Updates a budget other than the config's pays for (benchmarks and tests run shorter)."""
    return total_updates(self.samples_per_update * self.num_processes, total_env_steps)


def total_updates(samples_per_update: int, total_env_steps: int) -> int:
  """Updates a budget of total_env_steps pays for (at least one)."""
  return max(1, math.ceil(total_env_steps / samples_per_update))
