"""The GPU wheel set's repacking: what goes, what stays, RECORD as the wheel now is, pip installs it."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile

import pytest

from launch import wheelset

DIST_INFO = "envpool-1.2.5.dist-info"


def _wheel(path: str, files: dict[str, bytes]) -> str:
  files = dict(files)
  files[f"{DIST_INFO}/METADATA"] = b"Metadata-Version: 2.1\nName: envpool\nVersion: 1.2.5\n"
  files[f"{DIST_INFO}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-any\n"
  record = "".join(wheelset._record_line(n, d) + "\n" for n, d in files.items())  # pylint: disable=protected-access
  files[f"{DIST_INFO}/RECORD"] = (record + f"{DIST_INFO}/RECORD,,\n").encode()
  with zipfile.ZipFile(path, "w") as z:
    for n, d in files.items():
      z.writestr(n, d)
  return path


def test_envpool_loses_unused_families_keeps_its_registry_and_stays_installable(tmp_path):
  src = _wheel(str(tmp_path / "envpool-1.2.5-py3-none-any.whl"), {
      "envpool/__init__.py": b"from envpool import atari, mujoco\n",
      "envpool/atari/__init__.py": b"from .atari_envpool import _AtariEnvPool\n",
      "envpool/atari/registration.py": b"NAMES = ['Pong-v5']\n",
      "envpool/atari/atari_envpool.so": b"\x7fELF" + b"0" * 1000,
      "envpool/mujoco/__init__.py": b"",
      "envpool/mujoco/robotics/__init__.py": b"from envpool.mujoco.robotics_envpool import X\n",
      "envpool/mujoco/robotics_envpool.so": b"\x7fELF" + b"1" * 1000,
  })
  out_dir = tmp_path / "out"
  out_dir.mkdir()
  path, kept, dropped = wheelset.slim(src, str(out_dir))
  assert os.path.basename(path) == os.path.basename(src) and dropped == 1
  with zipfile.ZipFile(path) as z:
    names = set(z.namelist())
    assert "envpool/atari/atari_envpool.so" not in names
    assert "envpool/mujoco/robotics_envpool.so" in names  # The MetaWorld family stays whole.
    assert z.read("envpool/mujoco/robotics/__init__.py").startswith(b"from envpool.mujoco.robotics_envpool")
    assert b"Not in this wheel set" in z.read("envpool/atari/__init__.py")  # Its module went: a stub.
    assert z.read("envpool/atari/registration.py") == b"NAMES = ['Pong-v5']\n"
    # RECORD names every member but itself with its hash and size as it is now, and nothing else.
    rows = [l.split(",") for l in z.read(f"{DIST_INFO}/RECORD").decode().splitlines()]
    assert {r[0] for r in rows} == names
    for name, digest, size in rows:
      if name.endswith("RECORD"):
        continue
      data = z.read(name)
      want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
      assert digest == f"sha256={want}" and int(size) == len(data), name
  target = tmp_path / "site"
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                  "--target", str(target), path], check=True, capture_output=True)
  assert (target / "envpool" / "mujoco" / "robotics_envpool.so").is_file()
  assert not (target / "envpool" / "atari" / "atari_envpool.so").exists()
  probe = "import envpool.atari.registration as r; print(r.NAMES)"
  done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(target)},
                        capture_output=True, text=True, check=True)
  assert "Pong-v5" in done.stdout  # The family registers by name although its envs cannot be made.


def test_asset_packages_keep_only_the_model_files_runs_open(tmp_path):
  files = {"envpool_assets/__init__.py": b"", "envpool_assets/mujoco/metaworld/assets/a.xml": b"<mujoco/>",
           "envpool_assets/procgen/assets/sprite.png": b"png" * 100, "envpool_assets/atari/roms/pong.bin": b"rom"}
  src = _wheel(str(tmp_path / "envpool_assets-0.3.0-py3-none-any.whl"), files)
  out_dir = tmp_path / "out"
  out_dir.mkdir()
  path, _, dropped = wheelset.slim(src, str(out_dir))
  with zipfile.ZipFile(path) as z:
    kept = {n for n in z.namelist() if ".dist-info/" not in n}
  assert kept == {"envpool_assets/__init__.py", "envpool_assets/mujoco/metaworld/assets/a.xml",
                  "envpool_assets/atari/roms/pong.bin"} and dropped == 1


def test_every_wheel_has_a_pin_and_the_set_is_named_once():
  versions = wheelset.pins()
  assert set(versions) == set(wheelset.WHEELS)
  assert versions["envpool"] == "1.2.5" and versions["mujoco"] == versions["mujoco-mjx"]
  assert set(wheelset.ASSET_KEEP) <= set(wheelset.WHEELS)


@pytest.mark.parametrize("args,message", [
    (["--python_version=312"], "--python_version='312' must look like 3.12"),
    (["extra"], "unexpected arguments ['extra']"),
])
def test_bad_input_is_one_line_before_any_download(tmp_path, args, message):
  proc = subprocess.run([sys.executable, "-m", "launch.gpu_wheels", f"--out={tmp_path / 'w'}", *args],
                        capture_output=True, text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
  assert not (tmp_path / "w").exists()


def test_a_used_out_directory_is_refused(tmp_path):
  (tmp_path / "w").mkdir()
  (tmp_path / "w" / "old.whl").write_bytes(b"x")
  proc = subprocess.run([sys.executable, "-m", "launch.gpu_wheels", f"--out={tmp_path / 'w'}"],
                        capture_output=True, text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  assert proc.returncode == 2 and "is not empty" in proc.stderr
  assert os.listdir(tmp_path / "w") == ["old.whl"]
