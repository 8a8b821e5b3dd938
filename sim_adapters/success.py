"""Success-aligned rewards for RL fine-tuning on MetaWorld: a bonus on success, episodes that end there.

Why: MetaWorld's protocol runs a fixed 500-step episode with a dense shaped
reward and counts an episode a success if any of its steps succeeds. A policy
trained on that return is paid as much for hovering near the goal after
success as for reaching it. Three options change what training sees (evaluation
keeps MetaWorld's protocol):
  success_bonus   added to the reward of every step whose row reports success.
  dense_scale     the factor on the env's own (shaped) reward; 0 leaves the bonus
                  alone, a sparse success reward. MetaWorld's shaping pays for
                  being near a goal (a hammer by the nail, a peg at the hole) up
                  to 8-10 a step without success; whether that makes fine-tuning
                  trade success for shaping on tasks that need a precise last move
                  is not yet measured (BENCHMARKS.md, "Fine-tuning on MT50, continued").
  end_on_success  the first step that reports success ends the episode as a true
                  terminal (terminated=True, no bootstrap), and the env is reset
                  in place of its next step: the next row of that env is a
                  `reset_step` row (the action sent is ignored), exactly as after
                  an episode EnvPool ended itself. The env never steps on in the
                  old episode while the learner thinks it ended.

The wrapper sits on the per-step adapter (below action chunks, so a chunk ends
at the success step like at any episode end, and the bonus is counted per
action in the chunk's reward). Reset rows are left alone: no transition led
there. The episode tracker counts the rows as returned, so returns, lengths and
successes are those of the shortened episodes.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from sim_adapters.base import StepBatch, Wrapper


def _finite_non_negative(x) -> bool:
  return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) and x >= 0


def check_options(bonus, end_on_success, dense_scale=1.0) -> None:
  """ValueError (one line) unless `bonus` and `dense_scale` are finite numbers >= 0, `end_on_success` a
  bool, and some reward is left (a bonus where the dense reward is scaled to 0)."""
  if not _finite_non_negative(bonus):
    raise ValueError(f"success_bonus={bonus!r} must be a finite number >= 0 (0 = no bonus)")
  if not isinstance(end_on_success, (bool, np.bool_)):
    raise ValueError(f"end_on_success={end_on_success!r} must be True or False")
  if not _finite_non_negative(dense_scale):
    raise ValueError(f"dense_reward_scale={dense_scale!r} must be a finite number >= 0 (1 = the env's reward, "
                     "0 = the success bonus alone)")
  if dense_scale == 0 and not bonus:
    raise ValueError("dense_reward_scale=0 with success_bonus=0 leaves no reward at all; set success_bonus > 0")


class SuccessAdapter(Wrapper):
  """Wraps a SimAdapter; scales its reward by `dense_scale`, adds `bonus` on success rows and
  (end_on_success) ends episodes there."""

  def __init__(self, inner, bonus: float = 0.0, end_on_success: bool = False, dense_scale: float = 1.0):
    check_options(bonus, end_on_success, dense_scale)
    if not inner.spec.has_success:
      raise ValueError(f"env '{inner.spec.name}' reports no success; success_bonus and end_on_success need one")
    self.inner, self.bonus, self.end_on_success = inner, float(bonus), bool(end_on_success)
    self.dense_scale = float(dense_scale)
    self.num_envs = inner.num_envs
    self.spec = inner.spec
    self.success_ends = 0  # Episodes this wrapper ended at a success.

  def __getattr__(self, name: str):
    return getattr(self.inner, name)

  def reset(self) -> None:
    self.inner.reset()

  def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
    self.inner.send(actions, env_ids)

  def recv(self) -> StepBatch:
    b = self.inner.recv()
    if self.dense_scale != 1.0:
      b = dataclasses.replace(b, reward=(b.reward * np.float32(self.dense_scale)).astype(np.float32))
    hit = (b.success > 0) & ~b.reset_step  # NaN (no success signal) compares False.
    if not hit.any():
      return b
    changes = {}
    if self.bonus:
      changes["reward"] = (b.reward + np.float32(self.bonus) * hit).astype(np.float32)
    if self.end_on_success:
      end = hit & ~b.terminated
      if end.any():
        # The env did not end this episode itself (an episode it truncated here resets anyway):
        # its next row is a reset, as after any episode end.
        fresh = end & ~b.truncated
        if fresh.any():
          self.inner.reset_envs(b.env_ids[fresh])
        self.success_ends += int(end.sum())
        changes["terminated"] = b.terminated | end
        changes["truncated"] = b.truncated & ~end  # A true terminal: no bootstrap.
    return dataclasses.replace(b, **changes) if changes else b
