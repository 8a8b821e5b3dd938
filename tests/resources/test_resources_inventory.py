"""The inventory on this machine (no GPU): it reports what it finds and never raises."""

from __future__ import annotations

import json
import os

from ebrl.resources.inventory import Inventory, MpsStatus, mps_status, take_inventory


def test_cpu_and_memory_match_the_process():
  inv = take_inventory()
  assert isinstance(inv, Inventory)
  assert inv.cpu_cores == tuple(sorted(os.sched_getaffinity(0)))
  assert inv.cpu_total == os.cpu_count()
  assert inv.cpu_model
  assert inv.memory_total_bytes > 0
  assert 0 < inv.memory_available_bytes <= inv.memory_total_bytes
  assert inv.jax_platform == "cpu"
  assert inv.jax_devices


def test_no_gpu_is_reported_with_a_reason():
  inv = take_inventory()
  assert inv.gpus == ()
  assert inv.gpu_error
  lines = inv.summary_lines()
  gpu_lines = [l for l in lines if l.startswith("gpu")]
  assert gpu_lines == [f"gpu: none found ({inv.gpu_error})"]
  assert lines[0].startswith(f"cpu: {len(inv.cpu_cores)} usable cores {list(inv.cpu_cores)} of {inv.cpu_total}")
  assert any(l.startswith("mps: cannot start: no NVIDIA GPU found") for l in lines)


def test_to_dict_is_json_and_fingerprint_is_stable():
  a, b = take_inventory(), take_inventory()
  d = json.loads(json.dumps(a.to_dict()))
  assert d["cpu_cores"] == list(a.cpu_cores)
  assert d["mps"]["can_start"] is False
  assert a.fingerprint() == b.fingerprint()
  assert set(a.fingerprint()) == {"cpu_model", "cpu_cores", "gpus", "jax_platform", "jax_version"}
  json.dumps(a.fingerprint())


def test_mps_cannot_start_here():
  status = take_inventory().mps
  assert isinstance(status, MpsStatus)
  assert status.can_start is False
  assert status.reason and "\n" not in status.reason


def test_mps_status_reads_the_compute_mode():
  from ebrl.resources.inventory import GpuInfo

  gpu = GpuInfo(index=0, name="Fake", memory_bytes=1 << 30, sm_count=None, uuid="GPU-0", compute_mode="prohibited")
  status = mps_status((gpu,))
  assert not status.can_start
  assert "prohibited" in status.reason
