"""A run over several processes: joining through jax.distributed, and one learner over a mesh of
every process's devices that computes exactly what one process over as many devices computes."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from ebrl import distributed
from ebrl.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "distributed_update_check.py")


def _env(devices: int) -> dict[str, str]:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = os.pathsep.join([ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
  env["XLA_FLAGS"] = os.environ["XLA_FLAGS"] + f" --xla_force_host_platform_device_count={devices}"
  return env


def test_two_processes_update_as_one_process_over_two_devices(tmp_path):
  """The same global batch (each process its 2 of the 4 env columns) gives the same params, to
  float rounding, as one process holding all 4 columns on 2 devices; both processes end equal."""
  coordinator = f"localhost:{distributed.free_port()}"
  runs = [([SCRIPT, str(tmp_path / "one.npz"), "1", "0", "none"], _env(2))]
  runs += [([SCRIPT, str(tmp_path / f"p{i}.npz"), "2", str(i), coordinator], _env(1)) for i in range(2)]
  procs = [subprocess.Popen([sys.executable, *args], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for args, env in runs]
  try:
    outputs = [proc.communicate(timeout=240)[0] for proc in procs]
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  for proc, out in zip(procs, outputs):
    assert proc.returncode == 0, out
  one, p0, p1 = outputs
  assert "process_count=1" in one and "local_device_count=2" in one
  assert "process_count=2 process_index=0" in p0 and "process_count=2 process_index=1" in p1
  for out in (p0, p1):  # Each process gives 2 env columns of a global batch of 4.
    assert "local_rewards_shape=(8, 2) global_rewards_shape=(8, 4)" in out
    assert "local_device_count=1" in out and "version=2" in out
  params = [dict(np.load(tmp_path / name)) for name in ("one.npz", "p0.npz", "p1.npz")]
  assert float(params[0]["changed"]) > 1e-3  # The updates moved the params.
  assert set(params[0]) == set(params[1]) == set(params[2])
  for key in params[0]:
    np.testing.assert_array_equal(params[1][key], params[2][key], err_msg=key)  # Identical on both processes.
    np.testing.assert_allclose(params[1][key], params[0][key], rtol=1e-6, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("identity, says", [
    (distributed.ProcessIdentity(num_processes=2, process_id=0), "missing --coordinator_address"),
    (distributed.ProcessIdentity("localhost:1234", 2, 2), "--process_id=2 must be in [0, 1]"),
    (distributed.ProcessIdentity("localhost:1234", 2, -1), "--process_id=-1 must be in [0, 1]"),
    (distributed.ProcessIdentity("localhost:1234", 0, 0), "--num_processes=0 must be at least 1"),
    (distributed.ProcessIdentity("localhost", 2, 0), "--coordinator_address='localhost' is not host:port"),
    (distributed.ProcessIdentity("localhost:70000", 2, 0), "is not host:port (a port in 1-65535)"),
    (distributed.ProcessIdentity(local_device_ids=(0,)), "--local_device_ids chooses"),
    (distributed.ProcessIdentity("h:1", 2, 0, local_device_ids=(0, 0)), "must be distinct device indices"),
])
def test_bad_process_identity_is_one_line(identity, says):
  with pytest.raises(UserError) as e:
    distributed.check(identity)
  assert says in str(e.value) and "\n" not in str(e.value)


def test_one_process_without_flags_joins_nothing(monkeypatch):
  for name in [n for n in os.environ if n.startswith(("SLURM_", "OMPI_", "PMI_"))]:
    monkeypatch.delenv(name)
  assert distributed.initialize(distributed.ProcessIdentity()) == 1
  assert distributed.initialize(distributed.ProcessIdentity("localhost:1234", 1, 0)) == 1


def test_a_cluster_is_asked_only_where_its_launcher_set_a_task(monkeypatch):
  """A shell inside an allocation (SLURM_JOB_ID, SLURM_NTASKS=4) starting one python is one
  process; srun's tasks (SLURM_PROCID and the rest) are a cluster of SLURM_NTASKS."""
  for name in [n for n in os.environ if n.startswith(("SLURM_", "OMPI_", "PMI_"))]:
    monkeypatch.delenv(name)
  monkeypatch.setenv("SLURM_JOB_ID", "7")
  monkeypatch.setenv("SLURM_NTASKS", "4")
  assert distributed.detected_cluster() is None
  for name, value in (("SLURM_PROCID", "1"), ("SLURM_LOCALID", "1"), ("SLURM_STEP_NODELIST", "node[1-2]")):
    monkeypatch.setenv(name, value)
  assert distributed.detected_cluster() == "SlurmCluster"
