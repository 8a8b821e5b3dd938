"""MPS process environments and the private control daemon, against a fake control binary."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from ebrl.resources import mps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Logs argv, the daemon env and (for the interactive client, no args) stdin.
FAKE = """#!/bin/sh
echo "argv:$*" >> {log}
echo "pipe:$CUDA_MPS_PIPE_DIRECTORY" >> {log}
echo "logdir:$CUDA_MPS_LOG_DIRECTORY" >> {log}
if [ $# -eq 0 ]; then echo "stdin:$(cat)" >> {log}; fi
"""


def _fake(tmp_path, body: str = FAKE) -> tuple[str, str]:
  log = tmp_path / "calls.log"
  path = tmp_path / "nvidia-cuda-mps-control"
  path.write_text(body.format(log=log))
  path.chmod(0o755)
  return str(path), str(log)


def test_stage_env_values():
  base = {"PATH": "/bin", "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_ALLOCATOR": "platform",
          "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}
  env = mps.stage_env(25, 0.45, "/run/pipe", base=base, visible_devices=(0, 2))
  # The fraction under jaxlib's current name only (it refuses both), no allocator that ignores it.
  assert env == {"PATH": "/bin", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "XLA_CLIENT_MEM_FRACTION": "0.45",
                 "XLA_PYTHON_CLIENT_PREALLOCATE": "true", "CUDA_MPS_PIPE_DIRECTORY": "/run/pipe",
                 "CUDA_VISIBLE_DEVICES": "0,2"}
  assert mps.env_change(env, base) == (
      {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "XLA_CLIENT_MEM_FRACTION": "0.45",
       "XLA_PYTHON_CLIENT_PREALLOCATE": "true", "CUDA_MPS_PIPE_DIRECTORY": "/run/pipe", "CUDA_VISIBLE_DEVICES": "0,2"},
      ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_MEM_FRACTION"))
  bare = mps.stage_env(100, 1, None, base={})
  assert bare == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "XLA_CLIENT_MEM_FRACTION": "1.0",
                  "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}


def test_stage_env_defaults_to_a_copy_of_os_environ():
  before = dict(os.environ)
  env = mps.stage_env(50, 0.5, None)
  assert env["PATH"] == os.environ["PATH"] and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
  assert dict(os.environ) == before


@pytest.mark.parametrize("sm, mem, named", [(0, 0.5, "sm_percent=0"), (101, 0.5, "sm_percent=101"),
                                            (50.5, 0.5, "sm_percent=50.5"), (True, 0.5, "sm_percent=True"),
                                            (50, 0, "mem_fraction=0"), (50, 1.5, "mem_fraction=1.5"),
                                            (50, float("nan"), "mem_fraction=nan")])
def test_stage_env_rejects_bad_values(sm, mem, named):
  with pytest.raises(ValueError) as e:
    mps.stage_env(sm, mem, None, base={})
  message = str(e.value)
  assert named in message and "\n" not in message
  assert ("[1, 100]" if named.startswith("sm") else "(0, 1]") in message


def test_daemon_commands_and_env():
  assert mps.start_command() == ["nvidia-cuda-mps-control", "-d"]
  assert mps.stop_command() == ["nvidia-cuda-mps-control"]
  assert mps.QUIT == "quit\n"
  env = mps.daemon_env("/p", "/l", base={"A": "1"})
  assert env == {"A": "1", "CUDA_MPS_PIPE_DIRECTORY": "/p", "CUDA_MPS_LOG_DIRECTORY": "/l"}


def test_check_split():
  mps.check_split({"gen": 60, "train": 60}, {"gen": 0.5, "train": 0.5})  # SMs may over-subscribe.
  mps.check_split({"gen": 30, "train": 70}, {"gen": 0.1, "train": 0.2, "sim": 0.7})  # Sums to 1 up to rounding.
  with pytest.raises(ValueError, match=r"sum to 1\.2 > 1\.0 \(gen=0\.6, train=0\.6\)"):
    mps.check_split({"gen": 50, "train": 50}, {"gen": 0.6, "train": 0.6})
  with pytest.raises(ValueError, match="sm_percent=0"):
    mps.check_split({"gen": 0}, {"gen": 0.5})


def test_daemon_runs_privately_and_stops_once(tmp_path):
  binary, log = _fake(tmp_path)
  daemon = mps.MpsDaemon(binary=binary)
  with daemon:
    root = os.path.dirname(daemon.pipe_dir)
    assert os.path.dirname(root) == tempfile.gettempdir()
    assert os.path.basename(root).startswith("ebrl-mps-")
    assert os.path.isdir(daemon.pipe_dir) and os.path.isdir(daemon.log_dir)
    assert not daemon.pipe_dir.startswith("/tmp/nvidia-mps")
    env = daemon.stage_env(40, 0.4, base={})
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == daemon.pipe_dir
    with open(log) as f:
      assert f.read().splitlines() == ["argv:-d", f"pipe:{daemon.pipe_dir}", f"logdir:{daemon.log_dir}"]
  assert not os.path.exists(root)
  with open(log) as f:
    calls = f.read().splitlines()
  assert calls[3:] == ["argv:", f"pipe:{root}/pipe", f"logdir:{root}/log", "stdin:quit"]
  daemon.stop()  # Idempotent: no second quit.
  with open(log) as f:
    assert f.read().splitlines() == calls
  assert not daemon.running


def test_failing_daemon_start_names_stderr(tmp_path):
  binary, _ = _fake(tmp_path, "#!/bin/sh\necho boom >&2\necho second line >&2\nexit 1\n")
  daemon = mps.MpsDaemon(binary=binary)
  with pytest.raises(RuntimeError) as e:
    daemon.start()
  assert "boom" in str(e.value) and "\n" not in str(e.value)
  assert not daemon.running


def test_missing_binary_is_one_line(tmp_path):
  with pytest.raises(RuntimeError) as e:
    mps.MpsDaemon(binary=str(tmp_path / "nvidia-cuda-mps-control")).start()
  assert "not found" in str(e.value) and "\n" not in str(e.value)


def test_runner_is_injectable():
  calls = []

  def runner(cmd, **kw):
    calls.append((cmd, kw.get("input"), kw["env"]["CUDA_MPS_PIPE_DIRECTORY"]))
    return subprocess.CompletedProcess(cmd, 0, "", "")

  daemon = mps.MpsDaemon(binary=sys.executable, runner=runner).start()
  pipe = daemon.pipe_dir
  daemon.stop()
  assert calls == [([sys.executable, "-d"], None, pipe), ([sys.executable], "quit\n", pipe)]


def test_mps_bench_without_gpu_is_one_line_exit_2(tmp_path):
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "launch.mps_bench", f"--out={tmp_path / 'out.json'}"], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, proc.stderr
  assert lines[0].startswith("error: mps_bench needs an NVIDIA GPU")
  assert "Traceback" not in proc.stderr + proc.stdout
  assert not (tmp_path / "out.json").exists()
