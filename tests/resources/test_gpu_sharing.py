"""GPU sharing for stage processes, without a GPU: the MPS daemon started before JAX with this
process a client, the learner process's SM share and memory cap, and the one-line fallbacks."""

from __future__ import annotations

import pytest

from ebrl.resources import gpu_sharing
from ebrl.resources.inventory import GpuInfo, MpsStatus
from ebrl.spec import translate
from launch.configs import default


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
  monkeypatch.setattr(gpu_sharing, "_current", None)
  monkeypatch.setattr(gpu_sharing, "_mps", None)
  monkeypatch.setattr(gpu_sharing, "_restore", {})


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
  return translate(cfg)


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
  assert environ["XLA_CLIENT_MEM_FRACTION"] == str(gpu_sharing.GEN_MEM_FRACTION)
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in environ  # jaxlib refuses both names at once.
  assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in environ  # Generation keeps every SM.
  change = sharing.learner_env(35, environ=environ)
  assert dict(change["env"]) == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "35",
                                 "XLA_CLIENT_MEM_FRACTION": str(gpu_sharing.LEARNER_MEM_FRACTION),
                                 "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}  # The pipe dir is inherited as is.
  assert change["unset_env"] == ()
  assert gpu_sharing.begin(_cfg()) is sharing  # The daemon serves every later run of this process.
  stopped = FakeDaemon.stopped
  sharing.close()
  assert FakeDaemon.stopped == stopped + 1


@pytest.mark.parametrize("name", ["XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"])
def test_a_users_memory_fraction_wins_under_either_name_and_no_second_name_is_set(name):
  """jaxlib raises at backend start when both names are set: a user's XLA_CLIENT_MEM_FRACTION
  (the current name) must not get the old name beside it."""
  environ = {name: "0.2"}
  gpu_sharing.begin(_cfg(), status=lambda: ((_gpu(),), OK), daemon_factory=FakeDaemon, environ=environ,
                    backend_started=lambda: False)
  assert {k: v for k, v in environ.items() if "MEM_FRACTION" in k} == {name: "0.2"}


def test_the_learner_process_drops_inherited_allocator_and_fraction_variables():
  """The child inherits this process's environment: a platform allocator (which ignores any
  fraction) and this process's fraction under the old name must be removed there, not kept."""
  sharing = gpu_sharing.GpuSharing("mps", "note", FakeDaemon())
  inherited = {"PATH": "/bin", "XLA_PYTHON_CLIENT_ALLOCATOR": "platform", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9",
               "CUDA_MPS_PIPE_DIRECTORY": FakeDaemon.pipe_dir}
  change = sharing.learner_env(40, environ=inherited)
  assert change["unset_env"] == ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_MEM_FRACTION")
  assert dict(change["env"])["XLA_CLIENT_MEM_FRACTION"] == str(gpu_sharing.LEARNER_MEM_FRACTION)
  child = {k: v for k, v in inherited.items() if k not in change["unset_env"]} | dict(change["env"])
  assert "PATH" not in dict(change["env"]) and child["PATH"] == "/bin"
  assert [k for k in child if "MEM_FRACTION" in k] == ["XLA_CLIENT_MEM_FRACTION"]


def test_each_run_decides_again_and_only_the_daemon_is_kept():
  """A notebook's runs: an 'off' run does not make a later placement=processes run say the wrong
  thing, and a daemon, once started, serves later runs instead of a second one starting."""
  environ = {}
  assert gpu_sharing.begin(_cfg(placement="threads"), environ=environ).mode == "off"
  started = FakeDaemon.started
  sharing = gpu_sharing.begin(_cfg(), status=lambda: ((_gpu(),), OK), daemon_factory=FakeDaemon,
                              environ=environ, backend_started=lambda: False)
  assert sharing.mode == "mps" and FakeDaemon.started == started + 1
  assert gpu_sharing.begin(_cfg(placement="auto")).mode == "off"
  assert gpu_sharing.current().mode == "off"
  assert gpu_sharing.begin(_cfg(), daemon_factory=FakeDaemon) is sharing and FakeDaemon.started == started + 1


def test_a_run_that_fails_before_jax_starts_gives_the_daemon_and_variables_back():
  environ = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
  before = dict(environ)
  gpu_sharing.begin(_cfg(), status=lambda: ((_gpu(),), OK), daemon_factory=FakeDaemon, environ=environ,
                    backend_started=lambda: False)
  stopped = FakeDaemon.stopped
  gpu_sharing.abandon(environ=environ, backend_started=lambda: True)  # A client now: the daemon stays.
  assert FakeDaemon.stopped == stopped and "CUDA_MPS_PIPE_DIRECTORY" in environ
  gpu_sharing.abandon(environ=environ, backend_started=lambda: False)
  assert FakeDaemon.stopped == stopped + 1 and environ == before and gpu_sharing.current() is None


def test_the_python_api_rejects_a_bad_config_before_starting_mps(monkeypatch):
  """Config checks come first: a rejected request leaves no daemon and no variable behind."""
  import os  # pylint: disable=g-import-not-at-top

  import ebrl  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(gpu_sharing, "_status", lambda: ((_gpu(),), OK))
  monkeypatch.setattr(gpu_sharing.mps, "MpsDaemon", FakeDaemon)
  started, environ = FakeDaemon.started, dict(os.environ)
  with pytest.raises(ebrl.UserError, match="num_envs=7"):
    ebrl.train(overrides={"scheduler": "ebrl", "placement": "processes", "num_envs": 7,
                          "ebrl.num_groups": 2}, workdir="/nonexistent/never-made")
  assert FakeDaemon.started == started and dict(os.environ) == environ and gpu_sharing.current() is None
  with pytest.raises(ebrl.UserError, match="second_interrupt='later'"):
    ebrl.train(overrides={"scheduler": "ebrl", "placement": "processes"}, second_interrupt="later")


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
  assert environ == {} and sharing.learner_env(50) == {"env": (), "unset_env": ()}


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
