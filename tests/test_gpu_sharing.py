"""GPU sharing for stage processes, without a GPU: the MPS daemon started before JAX with this
process a client, the learner process's SM share and memory cap, and the one-line fallbacks."""

from __future__ import annotations

import pytest

from ebrl.resources import gpu_sharing
from ebrl.resources.inventory import GpuInfo, MpsStatus
from launch.configs import default


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
  monkeypatch.setattr(gpu_sharing, "_current", None)


class FakeDaemon:
  started = stopped = 0
  pipe_dir, log_dir = "/tmp/ebrl-mps-test/pipe", "/tmp/ebrl-mps-test/log"

  def start(self):
    FakeDaemon.started += 1
    return self

  def stop(self):
    FakeDaemon.stopped += 1


def _cfg(placement="processes", scheduler="ebrl", env="MetaWorld/Reach-v3"):
  cfg = default.get_config()
  cfg.scheduler, cfg.placement, cfg.env.name = scheduler, placement, env
  return cfg


def _gpu():
  fields = {f: None for f in GpuInfo.__dataclass_fields__}
  fields.update(index=0, name="H200", compute_mode="default")
  return GpuInfo(**fields)


OK = MpsStatus(control_binary="/usr/bin/nvidia-cuda-mps-control", daemon_running=False, can_start=True, reason="")


def test_mps_starts_before_jax_and_makes_this_process_a_client():
  environ = {}
  sharing = gpu_sharing.begin(_cfg(), status=lambda: ((_gpu(),), OK), daemon_factory=FakeDaemon, environ=environ,
                              backend_started=lambda: False)
  assert sharing.mode == "mps" and "MPS daemon started" in sharing.note
  assert environ["CUDA_MPS_PIPE_DIRECTORY"] == FakeDaemon.pipe_dir
  assert environ["CUDA_MPS_LOG_DIRECTORY"] == FakeDaemon.log_dir
  assert environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == str(gpu_sharing.GEN_MEM_FRACTION)
  assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in environ  # Generation keeps every SM.
  env = dict(sharing.learner_env(35))
  assert env == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "35", "CUDA_MPS_PIPE_DIRECTORY": FakeDaemon.pipe_dir,
                 "XLA_PYTHON_CLIENT_MEM_FRACTION": str(gpu_sharing.LEARNER_MEM_FRACTION),
                 "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
  assert gpu_sharing.begin(_cfg()) is sharing  # Once per process.
  stopped = FakeDaemon.stopped
  sharing.close()
  assert FakeDaemon.stopped == stopped + 1


def test_a_users_memory_fraction_wins():
  environ = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.2"}
  gpu_sharing.begin(_cfg(), status=lambda: ((_gpu(),), OK), daemon_factory=FakeDaemon, environ=environ,
                    backend_started=lambda: False)
  assert environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2"


@pytest.mark.parametrize("gpus,status,started,expected", [
    ((), OK, False, "no NVIDIA GPU: stage processes time-share the CPU cores"),
    ((_gpu(),), MpsStatus(None, False, False, "nvidia-cuda-mps-control not found on PATH"), False,
     "MPS cannot start (nvidia-cuda-mps-control not found on PATH): stage processes time-share the GPU"),
    ((_gpu(),), OK, True, "JAX's backend started before MPS could"),
])
def test_without_mps_the_run_time_shares_and_says_why_in_one_line(gpus, status, started, expected):
  environ = {}
  sharing = gpu_sharing.begin(_cfg(), status=lambda: (gpus, status), daemon_factory=FakeDaemon, environ=environ,
                              backend_started=lambda: started)
  assert sharing.mode == "time-share" and expected in sharing.note and "\n" not in sharing.note
  assert environ == {} and sharing.learner_env(50) == ()


def test_a_daemon_that_fails_to_start_falls_back():
  class Broken:
    def start(self):
      raise RuntimeError("nvidia-cuda-mps-control -d failed: permission denied")

  sharing = gpu_sharing.begin(_cfg(), status=lambda: ((_gpu(),), OK), daemon_factory=Broken, environ={},
                              backend_started=lambda: False)
  assert sharing.mode == "time-share" and "permission denied" in sharing.note


@pytest.mark.parametrize("cfg", [_cfg(placement="threads"), _cfg(placement="auto"),
                                 _cfg(scheduler="sync", placement="auto"), _cfg(env="mjx:CartpoleBalance")])
def test_runs_that_keep_one_process_start_nothing(cfg):
  environ = {}
  sharing = gpu_sharing.begin(cfg, status=lambda: ((_gpu(),), OK), daemon_factory=FakeDaemon, environ=environ,
                              backend_started=lambda: False)
  assert sharing.mode == "off" and sharing.note == "" and environ == {}


def test_the_learners_share_follows_its_part_of_the_gpu_time():
  assert gpu_sharing.learner_sm_percent(0, gen_s_per_step=1e-6, train_s_per_step=3e-6) == 75
  assert gpu_sharing.learner_sm_percent(0, gen_s_per_step=1e-6, train_s_per_step=1e-4) == 90  # Capped.
  assert gpu_sharing.learner_sm_percent(0, gen_s_per_step=1e-4, train_s_per_step=1e-6) == 10
  assert gpu_sharing.learner_sm_percent(40, gen_s_per_step=1e-6, train_s_per_step=3e-6) == 40  # The user's.
  assert gpu_sharing.learner_sm_percent(0, 0.0, 0.0) == 50
