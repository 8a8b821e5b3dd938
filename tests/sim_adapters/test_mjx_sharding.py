"""Envs sharded over 4 (fake CPU) devices step exactly as on 1 device.

Each env's physics, reset keys and policy samples depend only on its own row,
so the sharded fused rollout must reproduce the single-device trajectories.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "mjx_shard_check.py")


def _run(out, devices: int) -> str:
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  env["XLA_FLAGS"] = os.environ["XLA_FLAGS"]  # conftest: XLA on the calling thread, compile-fast passes.
  if devices > 1:
    env["XLA_FLAGS"] += f" --xla_force_host_platform_device_count={devices}"
  proc = subprocess.run([sys.executable, SCRIPT, str(out), str(devices)], env=env, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


@pytest.mark.slow  # Two fresh processes compiling the fused rollout; the host split is test_device_split.py.
def test_sharded_rollout_matches_single_device(tmp_path):
  one, four = tmp_path / "one.npz", tmp_path / "four.npz"
  log1, log4 = _run(one, 1), _run(four, 4)
  assert "state_sharding_devices=1" in log1
  assert "state_sharding_devices=4" in log4
  assert "rollout_obs_shards=[(6, 2, 5)]" in log4  # 8 envs, 2 per device.
  a, b = np.load(one), np.load(four)
  assert set(a.files) == set(b.files)
  assert int(a["episodes"]) >= 8  # Auto-resets happened inside the rollouts.
  for k in a.files:
    np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-5, err_msg=k)
