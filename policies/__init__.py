"""Flax policies behind one contract; `make_policy` builds one by name."""

from __future__ import annotations

from policies.base import IncompatibleObservationError, Policy
from sim_adapters.base import EnvSpec

POLICY_NAMES = ("mlp",)


def make_policy(name: str, spec: EnvSpec, cfg) -> Policy:
  """Builds policy `name` for env `spec`; cfg is the config's `policy` section."""
  if name == "mlp":
    from policies.mlp import MLPPolicy
    return MLPPolicy(spec, hidden=tuple(cfg.hidden), init_log_std=float(cfg.init_log_std))
  raise ValueError(f"unknown policy '{name}'; valid: {', '.join(POLICY_NAMES)}")


__all__ = ["IncompatibleObservationError", "POLICY_NAMES", "Policy", "make_policy"]
