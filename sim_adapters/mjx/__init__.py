"""GPU-batched MJX simulators behind the DeviceSim contract.

Names: `mjx:<PlaygroundName>` (MuJoCo Playground: the DM Control suite, and the
manipulation/locomotion tasks whose Menagerie models ship on PyPI) and
`brax:<name>` (Brax environments on their MJX backend). Names are checked
without importing Playground or Brax, so a typo is reported before any
compile; loading happens in `make_device_sim`.
"""

from __future__ import annotations

from sim_adapters.mjx.names import PREFIXES, check_device_env_name, device_env_names, is_device_env


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
