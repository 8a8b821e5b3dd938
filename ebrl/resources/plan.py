"""A resource plan: which cores and batch sizes every stage gets, and what that predicts.

Stages are the three of docs/ARCHITECTURE.md (sim, gen, train) plus the host bookkeeping every schedule pays
per env step (closing transitions, queueing segments), which competes for the
same cores:

  sim       EnvPool workers and the threads that recv/send for them
  render    the render stage's draws (runs with env.render_stage only: the
            render thread and Mesa's rasterizer threads)
  gen       the sampler: policy inference on ready envs
  train     the learner's update
  assemble  per-step bookkeeping on the host (assembler, episode tracker)
"""

from __future__ import annotations

import dataclasses
from typing import Any

STAGES = ("sim", "render", "gen", "train", "assemble")  # A plan holds the ones its run has.
MODES = ("auto", "naive", "manual")


@dataclasses.dataclass(frozen=True)
class Plan:
  mode: str
  cpu_sets: dict[str, tuple[int, ...]]  # Stage -> cores its threads may run on.
  sim_threads: int  # EnvPool worker threads per pool.
  thread_affinity_offset: int  # EnvPool's first pinned core; -1 = not pinned.
  num_groups: int
  recv_batch: int  # Envs a group's recv returns (ebrl).
  max_gen_batch: int  # Rows the sampler merges into one generation call.
  max_wait_ms: float
  num_minibatches: int
  stage_cost_us: dict[str, float]  # CPU µs per env step of each stage under this plan.
  predicted_rates: dict[str, float]  # Env steps/s each stage sustains with its quota.
  predicted_env_steps_per_s: float  # The bottleneck stage's rate.
  bottleneck: str
  placement: str = "threads"  # The learner beside generation ("threads") or in its own process.
  learner_sm_percent: int = 0  # Under MPS, the learner process's SM share (planner.learner_share); 0 = none.
  barrier: bool = False  # Rollout and updates in turn (the sync schedule; the run's overlap probe may switch).
  notes: tuple[str, ...] = ()

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["cpu_sets"] = {k: list(v) for k, v in self.cpu_sets.items()}
    return d

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "Plan":
    d = dict(d)
    d["cpu_sets"] = {k: tuple(v) for k, v in d["cpu_sets"].items()}
    d["notes"] = tuple(d.get("notes", ()))
    d.pop("gpu", None)  # Older plans carried an unused GPU split.
    return cls(**d)

  def replace(self, **changes) -> "Plan":
    return dataclasses.replace(self, **changes)
