"""Which local devices each stage computes on: generation, training, and device simulators.

Why sub-meshes: in one process XLA runs the computations it is given for one
device one after another, so a sampler and a learner on the same device queue
behind each other. With several devices, each stage gets a sub-mesh of its own
(as Podracer's Sebulba gives actors and learners their own cores) and both run
at once; params move learner -> generation devices as a device-to-device copy
(ParamStore.publish places them), never through the host.

config.devices.{gen,train,sim}, each a string:
- ""      the default: training on every local device, generation on device 0,
          a device simulator on every device (generation runs inside its scan,
          so a device env generates on the simulator's devices);
- "auto"  a split chosen from the stages' demand (`auto_split`);
- "k"     a count: blocks taken in order (generation first, training next);
- "i,j,..." explicit local device indices (stages may share devices).
"""

from __future__ import annotations

import dataclasses

from ebrl.errors import UserError

STAGES = ("gen", "train", "sim")


@dataclasses.dataclass(frozen=True)
class DevicePlacement:
  """Local device indices per stage."""
  gen: tuple[int, ...]
  train: tuple[int, ...]
  sim: tuple[int, ...]

  @property
  def split(self) -> bool:
    """Whether generation and training compute on disjoint devices."""
    return not set(self.gen) & set(self.train)

  def to_dict(self) -> dict:
    return {"gen": list(self.gen), "train": list(self.train), "sim": list(self.sim)}


def _parse(stage: str, value, num_devices: int) -> tuple[str, object]:
  """("default" | "auto" | "count" | "list", payload) for one stage's setting."""
  text = str(value).strip()
  shown = f"devices.{stage}={value!r}"
  valid = f"valid: '' (default), 'auto', a count in [1, {num_devices}], or local device indices such as '0,1'"
  if text == "":
    return "default", None
  if text == "auto":
    return "auto", None
  parts = [p.strip() for p in text.split(",")]
  if not all(p.isdigit() for p in parts):
    raise UserError(f"{shown} is not a device setting; {valid}")
  numbers = [int(p) for p in parts]
  if len(numbers) == 1 and "," not in text:  # A count.
    if not 1 <= numbers[0] <= num_devices:
      raise UserError(f"{shown} asks for {numbers[0]} devices; this process has {num_devices} local "
                      f"device(s); {valid}")
    return "count", numbers[0]
  bad = [n for n in numbers if n >= num_devices]
  if bad:
    raise UserError(f"{shown} names device {bad[0]}; this process has devices 0..{num_devices - 1}")
  if len(set(numbers)) != len(numbers):
    raise UserError(f"{shown} names a device more than once")
  return "list", tuple(numbers)


def auto_split(num_devices: int, gen_cost: float = 1.0, train_cost: float = 1.0) -> tuple[int, int]:
  """(generation devices, training devices) for `num_devices` disjoint devices, in proportion to
  the two stages' costs per env step (at least one each); one device is shared (1, 1)."""
  if num_devices < 2:
    return 1, 1
  gen = round(num_devices * gen_cost / max(gen_cost + train_cost, 1e-12))
  gen = min(max(gen, 1), num_devices - 1)
  return gen, num_devices - gen


def resolve(devices, num_devices: int, device_env: bool, gen_cost: float = 1.0,
            train_cost: float = 1.0) -> DevicePlacement:
  """The placement `devices` (config.devices) asks for on `num_devices` local devices. A UserError
  names a setting that cannot be met, before anything is built."""
  settings = {s: _parse(s, getattr(devices, s, ""), num_devices) for s in STAGES}
  everything = tuple(range(num_devices))
  if device_env and settings["gen"][0] != "default":
    raise UserError(f"devices.gen={devices.gen!r} cannot apply to a device env: its policy acts inside the "
                    "simulator's scan, on the simulator's devices; set devices.sim instead")
  if not device_env and settings["sim"][0] != "default":
    raise UserError(f"devices.sim={devices.sim!r} applies to device envs (mjx:, brax:) only; host envs "
                    "simulate on CPU cores")
  if settings["gen"][0] == "auto" or settings["train"][0] == "auto":
    gen_n, train_n = auto_split(num_devices, gen_cost, train_cost)
    auto = {"gen": ("count", gen_n), "train": ("count", train_n)} if num_devices > 1 else {
        "gen": ("list", (0,)), "train": ("list", (0,))}  # One device: both stages share it.
    for stage in ("gen", "train"):
      if settings[stage][0] == "auto":
        settings[stage] = auto[stage]
  if settings["sim"][0] == "auto":
    settings["sim"] = ("default", None)
  # Counts take blocks in order: generation (or the simulator) first, then training.
  next_free = 0
  chosen = {}
  for stage in ("sim", "gen", "train") if device_env else ("gen", "train"):
    kind, payload = settings[stage]
    if kind == "list":
      chosen[stage] = payload
    elif kind == "count":
      if next_free + payload > num_devices:
        asked = " + ".join(f"devices.{s}={settings[s][1]}" for s in STAGES if settings[s][0] == "count")
        raise UserError(f"{asked} asks for more than the {num_devices} local device(s); lower a count or "
                        "name shared devices as indices")
      chosen[stage] = tuple(range(next_free, next_free + payload))
      next_free += payload
  sim = chosen.get("sim", everything)
  gen = sim if device_env else chosen.get("gen", (0,))
  train = chosen.get("train", everything)
  return DevicePlacement(gen=gen, train=train, sim=sim if device_env else ())


def demand_split_note(placement: DevicePlacement, num_devices: int) -> str:
  """One line for the run's log: where each stage computes."""
  if num_devices == 1:
    return "devices: one local device, shared by generation and training (time-shared)"
  share = "disjoint" if placement.split else "shared"
  return (f"devices: generation on {list(placement.gen)}, training on {list(placement.train)}"
          + (f", simulator on {list(placement.sim)}" if placement.sim else "") + f" ({share})")

