"""What this machine offers a resource planner: cores, memory, JAX devices, GPUs and MPS.

The planner sizes stages from what the process may actually use (the affinity
mask, not every core the kernel sees) and decides between MPS processes and
threads from whether MPS can start here. Taking the inventory never raises and
never changes anything: on a machine without a GPU or driver it reports "no GPU"
with the reason, so the same plan degrades to threads and says why.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Any

MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_SERVER = "nvidia-cuda-mps-server"
_COMM_LEN = 15  # The kernel truncates /proc/<pid>/comm to 15 characters.
_GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class GpuInfo:
  index: int  # NVML index (PCI bus order; CUDA_VISIBLE_DEVICES does not renumber it).
  name: str
  memory_bytes: int
  sm_count: int | None  # From JAX's device core_count; None where JAX does not run on GPUs.
  uuid: str
  compute_mode: str | None = None  # "default", "exclusive_process", "prohibited", ...


@dataclasses.dataclass(frozen=True)
class MpsStatus:
  control_binary: str | None
  daemon_running: bool  # Any MPS control daemon or server, ours or system-wide.
  can_start: bool
  reason: str  # Why MPS cannot start here, or "".


@dataclasses.dataclass(frozen=True)
class Inventory:
  cpu_cores: tuple[int, ...]
  cpu_total: int
  cpu_model: str
  memory_total_bytes: int
  memory_available_bytes: int
  jax_platform: str
  jax_devices: list[str]
  gpus: tuple[GpuInfo, ...]
  mps: MpsStatus
  gpu_error: str = ""  # Why no GPU was found (pynvml's message), or "".

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["cpu_cores"] = list(self.cpu_cores)
    d["gpus"] = [dataclasses.asdict(g) for g in self.gpus]
    return d

  def summary_lines(self) -> list[str]:
    cores = list(self.cpu_cores)
    lines = [f"cpu: {len(cores)} usable cores {cores} of {self.cpu_total} ({self.cpu_model})",
             f"memory: {self.memory_total_bytes / _GIB:.1f} GiB total, "
             f"{self.memory_available_bytes / _GIB:.1f} GiB available",
             f"jax: {self.jax_platform}, {len(self.jax_devices)} device{'s' * (len(self.jax_devices) != 1)}"]
    if not self.gpus:
      lines.append(f"gpu: none found ({self.gpu_error or 'no reason given'})")
    for g in self.gpus:
      sms = f"{g.sm_count} SMs" if g.sm_count is not None else "SMs unknown"
      lines.append(f"gpu {g.index}: {g.name}, {g.memory_bytes / _GIB:.1f} GiB, {sms}, "
                   f"compute mode {g.compute_mode or 'unknown'}")
    running = ", daemon running" if self.mps.daemon_running else ""
    if self.mps.can_start:
      lines.append(f"mps: can start ({self.mps.control_binary}){running}")
    else:
      lines.append(f"mps: cannot start: {self.mps.reason}{running}")
    return lines

  def fingerprint(self) -> dict[str, Any]:
    """The facts a stage profile depends on: a profile taken under the same ones is reusable."""
    import jax  # pylint: disable=g-import-not-at-top

    return {"cpu_model": self.cpu_model, "cpu_cores": list(self.cpu_cores),
            "gpus": [g.name for g in self.gpus], "jax_platform": self.jax_platform,
            "jax_version": jax.__version__}


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  import platform  # pylint: disable=g-import-not-at-top
  return platform.processor() or "unknown"


def _meminfo() -> tuple[int, int]:
  """(MemTotal, MemAvailable) in bytes; /proc/meminfo gives kB."""
  values = {}
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
          values[key] = int(rest.split()[0]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  total = values.get("MemTotal", 0)
  return total, values.get("MemAvailable", total)


def mps_processes_running() -> bool:
  """Whether any MPS control daemon or server runs on this machine (any user, any pipe dir)."""
  names = {MPS_CONTROL[:_COMM_LEN], MPS_SERVER[:_COMM_LEN]}
  try:
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
  except OSError:
    return False
  for pid in pids:
    try:
      with open(f"/proc/{pid}/comm") as f:
        if f.read().strip() in names:
          return True
    except OSError:  # The process ended, or is not ours to read.
      continue
  return False


def _sm_counts() -> dict[int, int]:
  """SM count per GPU index from JAX, when JAX runs on GPUs (NVML has no SM-count query).

  JAX numbers the GPUs it sees, so the indices match NVML's only when every GPU is
  visible; callers drop the counts otherwise.
  """
  import jax  # pylint: disable=g-import-not-at-top

  if jax.default_backend() != "gpu":
    return {}
  counts = {}
  for d in jax.devices():
    count = getattr(d, "core_count", None)
    if isinstance(count, int):
      hw = getattr(d, "local_hardware_id", None)
      counts[d.id if hw is None else hw] = count
  return counts


_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


def _gpus() -> tuple[tuple[GpuInfo, ...], str]:
  """Every GPU NVML reports, or () and why not."""
  try:
    import pynvml  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    return (), f"pynvml: {e}"
  try:
    pynvml.nvmlInit()
  except (pynvml.NVMLError, OSError) as e:
    return (), f"pynvml: {e}"
  try:
    found = []
    for i in range(pynvml.nvmlDeviceGetCount()):
      h = pynvml.nvmlDeviceGetHandleByIndex(i)
      try:
        mode = _MODES.get(pynvml.nvmlDeviceGetComputeMode(h), "unknown")
      except pynvml.NVMLError:
        mode = None
      name, uuid = pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetUUID(h)
      found.append(GpuInfo(index=i, name=name.decode() if isinstance(name, bytes) else name,
                           memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total), sm_count=None,
                           uuid=uuid.decode() if isinstance(uuid, bytes) else uuid, compute_mode=mode))
    return tuple(found), "" if found else "pynvml: no devices"
  except (pynvml.NVMLError, OSError) as e:
    return (), f"pynvml: {e}"
  finally:
    try:
      pynvml.nvmlShutdown()
    except (pynvml.NVMLError, OSError):
      pass


def gpus() -> tuple[tuple[GpuInfo, ...], str]:
  """This machine's NVIDIA GPUs through NVML (without starting JAX), and why none were found."""
  return _gpus()


def mps_status(gpus: tuple[GpuInfo, ...], gpu_error: str = "") -> MpsStatus:
  """Whether an MPS daemon can start here. Reads the compute mode, never changes it."""
  binary = shutil.which(MPS_CONTROL)
  allowed = [g for g in gpus if g.compute_mode != "prohibited"]
  if not gpus:
    reason = f"no NVIDIA GPU found; {gpu_error}" if gpu_error else "no NVIDIA GPU found"
  elif not allowed:
    reason = "every GPU's compute mode is prohibited"
  elif binary is None:
    reason = f"{MPS_CONTROL} not found on PATH"
  else:
    reason = ""
  return MpsStatus(control_binary=binary, daemon_running=mps_processes_running(), can_start=not reason,
                   reason=reason)


def take_inventory() -> Inventory:
  """This machine as the planner sees it. Initializes JAX's default backend; never raises."""
  import jax  # pylint: disable=g-import-not-at-top

  gpus, gpu_error = _gpus()
  try:
    platform, devices = jax.default_backend(), [str(d) for d in jax.devices()]
  except RuntimeError as e:  # A backend named in JAX_PLATFORMS failed to start.
    platform, devices = f"unavailable ({str(e).splitlines()[0] if str(e) else type(e).__name__})", []
  counts = _sm_counts() if platform == "gpu" else {}
  if gpus and len(counts) == len(gpus):
    gpus = tuple(dataclasses.replace(g, sm_count=counts.get(g.index)) for g in gpus)
  total, available = _meminfo()
  return Inventory(cpu_cores=tuple(sorted(os.sched_getaffinity(0))), cpu_total=os.cpu_count() or 0,
                   cpu_model=_cpu_model(), memory_total_bytes=total, memory_available_bytes=available,
                   jax_platform=platform, jax_devices=devices, gpus=gpus, mps=mps_status(gpus, gpu_error),
                   gpu_error=gpu_error)
