"""Flax policies behind one contract; `make_policy` builds one by name.

  mlp   Gaussian actor-critic on state (chunks: one Gaussian over the K*A chunk);
  cnn   convolutional encoder on pixels (+ state), Gaussian actor-critic;
  vla   transformer over state, instruction and image tokens to discrete action tokens;
  flow  flow-matching action expert with a noise-injected, exactly scored sampling chain.
"""

from __future__ import annotations

from policies.base import IncompatibleObservationError, Policy
from sim_adapters.base import EnvSpec

POLICY_NAMES = ("mlp", "cnn", "vla", "flow")


def instructions_for(spec: EnvSpec) -> list[str] | None:
  """One instruction per task id of a multi-task MetaWorld env (MT10, MT50, a user's list), or a
  single MetaWorld task's own, for language tokens; None for other envs."""
  from sim_adapters.tasks import task_instructions
  return task_instructions(spec.name)


def _std_bounds(cfg) -> dict[str, float]:
  """mlp, cnn: policy.min_std / policy.max_std (0, or absent from an older or partial cfg: no bound)."""
  return {k: float(getattr(cfg, k, 0.0) or 0.0) for k in ("min_std", "max_std")}


def make_policy(name: str, spec: EnvSpec, cfg) -> Policy:
  """Builds policy `name` for env `spec`; `cfg` has the policy settings it reads as attributes (a
  run's ebrl.spec.PolicySettings; the chunk size defaults to 1)."""
  k = int(getattr(cfg, "chunk_size", 1))
  if name == "mlp":
    from policies.mlp import MLPPolicy
    return MLPPolicy(spec, hidden=tuple(cfg.hidden), init_log_std=float(cfg.init_log_std), **_std_bounds(cfg))
  if name == "cnn":
    from policies.cnn import CNNPolicy
    return CNNPolicy(spec, channels=tuple(cfg.channels), hidden=tuple(cfg.hidden),
                     init_log_std=float(cfg.init_log_std), **_std_bounds(cfg))
  if name == "vla":
    from policies.vla import VLAPolicy
    return VLAPolicy(spec, chunk_size=k, bins=int(cfg.bins), width=int(cfg.width), depth=int(cfg.depth),
                     heads=int(cfg.heads), decode=str(cfg.decode), instructions=instructions_for(spec),
                     detach_critic=bool(getattr(cfg, "detach_critic", False)),
                     critic_hidden=tuple(getattr(cfg, "vla_critic_hidden", ())))
  if name == "flow":
    from policies.flow import FlowPolicy
    return FlowPolicy(spec, chunk_size=k, steps=int(cfg.flow_steps),
                      hidden=tuple(getattr(cfg, "flow_hidden", (256, 256))),
                      init_log_std=float(cfg.flow_init_log_std),
                      min_log_std=float(getattr(cfg, "flow_min_log_std", -4.0)),
                      finetune_steps=int(getattr(cfg, "flow_finetune_steps", 0)),
                      instructions=tuple(instructions_for(spec) or ()) if "task" in spec.obs else ())
  raise ValueError(f"unknown policy '{name}'; valid: {', '.join(POLICY_NAMES)}")


__all__ = ["IncompatibleObservationError", "POLICY_NAMES", "Policy", "instructions_for", "make_policy"]
