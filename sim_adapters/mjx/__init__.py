"""GPU-batched MJX simulators behind the DeviceSim contract.

Names: `mjx:<PlaygroundName>` (MuJoCo Playground: the DM Control suite, and the
manipulation/locomotion tasks whose Menagerie models ship on PyPI) and
`brax:<name>` (Brax environments on their MJX backend). Names are checked
without importing Playground or Brax, so a typo is reported before any
compile; loading happens in `make_device_sim`.
"""

from __future__ import annotations

import difflib

from sim_adapters.mjx.backends import BRAX_ENVS, PLAYGROUND_MENAGERIE_ENVS

PREFIXES = ("mjx:", "brax:")

# The Playground DM Control suite (mujoco_playground.dm_control_suite.ALL_ENVS);
# a test checks this list against the installed package.
PLAYGROUND_DM_CONTROL_ENVS = (
    "AcrobotSwingup", "AcrobotSwingupSparse", "BallInCup", "CartpoleBalance", "CartpoleBalanceSparse",
    "CartpoleSwingup", "CartpoleSwingupSparse", "CheetahRun", "FingerSpin", "FingerTurnEasy", "FingerTurnHard",
    "FishSwim", "HopperHop", "HopperStand", "HumanoidStand", "HumanoidWalk", "HumanoidRun", "PendulumSwingup",
    "PointMass", "ReacherEasy", "ReacherHard", "SwimmerSwimmer6", "WalkerRun", "WalkerStand", "WalkerWalk")


def is_device_env(name: str) -> bool:
  """Whether `name` selects a device simulator (mjx:... or brax:...)."""
  return name.startswith(PREFIXES)


def device_env_names() -> tuple[str, ...]:
  return (tuple(f"mjx:{n}" for n in PLAYGROUND_DM_CONTROL_ENVS + PLAYGROUND_MENAGERIE_ENVS)
          + tuple(f"brax:{n}" for n in BRAX_ENVS))


def check_device_env_name(name: str) -> None:
  """Raises ValueError naming the closest valid device env names."""
  names = device_env_names()
  if name in names:
    return
  prefix = name.split(":", 1)[0] + ":"
  pool = [n for n in names if n.startswith(prefix)] or list(names)
  lowered = {n.lower(): n for n in pool}
  close = difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.6)
  hint = ", ".join(lowered[c] for c in close) if close else ", ".join(pool[:4]) + ", ..."
  raise ValueError(f"unknown env '{name}'; closest valid names: {hint}")


def load_core_env(name: str, max_episode_steps: int = 0):
  """The unbatched CoreEnv for a checked device env name."""
  from sim_adapters.mjx import backends

  check_device_env_name(name)
  backend, task = name.split(":", 1)
  if backend == "mjx":
    return backends.load_playground(task, max_episode_steps)
  return backends.load_brax(task, max_episode_steps)


def make_device_sim(name: str, num_envs: int, *, max_episode_steps: int = 0, mesh=None):
  """Builds the DeviceSim for `name` (checked first; nothing is compiled here)."""
  from sim_adapters.mjx.device_sim import DeviceSim

  check_device_env_name(name)
  return DeviceSim(load_core_env(name, max_episode_steps), num_envs, mesh=mesh)


__all__ = ["PREFIXES", "check_device_env_name", "device_env_names", "is_device_env", "load_core_env",
           "make_device_sim"]
