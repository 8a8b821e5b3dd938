"""Which samples an off-policy update may use: the staleness bound, as the learner applies it."""

from __future__ import annotations


def fresh_mask(learner_version, sample_version, max_staleness: int):
  """Samples an update at `learner_version` may use: at most max_staleness versions old.

  Works on NumPy and JAX arrays alike (the learner calls it inside its jit).
  """
  return (learner_version - sample_version) <= max_staleness
