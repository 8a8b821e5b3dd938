"""Offscreen rendering for host simulators: the GL library and render-cheap assets.

Why `ensure_gl`: EnvPool's MuJoCo pixel envs create their own EGL context, but
MuJoCo's GL loader only finds GL functions in libraries loaded globally into the
process. Without that, the first rendered reset ends the process (MuJoCo's
mju_error calls exit) with "an OpenGL platform library has not been loaded into
this process". Loading libEGL (and libGL) with RTLD_GLOBAL first fixes it.

Why `render_assets_path`: MetaWorld's scene asks for a 4096x4096 shadow map and
4x multisampling. Without a GPU (Mesa llvmpipe) that costs ~90 ms of CPU per
rendered step at 64x64; without them ~9 ms (physics alone is ~0.1 ms). EnvPool
loads its XMLs from the `base_path` config key, so a copy of the MetaWorld
assets with `<quality shadowsize="0" offsamples="0"/>` passed as base_path makes
EnvPool's own renderer cheap. The images are the same apart from the (soft)
shadows; physics is untouched (only <visual> settings change).

Cameras: EnvPool's `render_camera_id` picks the camera (-1: MuJoCo's free
camera). Every MetaWorld task has the same six cameras from xyz_base.xml, in
the order of METAWORLD_CAMERAS. An id past the model's cameras aborts the
process inside EnvPool, so ids are checked here where the cameras are known.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import tempfile
import threading
import warnings

METAWORLD_CAMERAS = ("topview", "corner", "corner2", "corner3", "behindGripper", "gripperPOV")
_METAWORLD_SUBDIR = os.path.join("mujoco", "metaworld", "assets")
_PATCH_VERSION = 1  # Bump when the patch changes: the cache key includes it.
_QUALITY_TAG = re.compile(r"<quality\b[^>]*/?>")

_lock = threading.Lock()
_gl_backend: str | None = None
_gl_handles: list = []  # Keeps the loaded libraries referenced.

_OSMESA_SONAMES = ("libOSMesa.so.8", "libOSMesa.so.6", "libOSMesa.so")  # Debian: libosmesa6.


class GLUnavailableError(RuntimeError):
  """No offscreen GL library can be loaded; the message names the package to install."""


def _load_global(soname: str):
  try:
    return ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL)
  except OSError:
    found = ctypes.util.find_library(soname.split(".so")[0].removeprefix("lib"))
    return ctypes.CDLL(found, mode=ctypes.RTLD_GLOBAL) if found else None


def _promote_envpool_egl() -> list:
  """Makes the libEGL bundled with EnvPool global if `import envpool` already loaded it.

  EnvPool's wheel bundles its own libEGL (envpool.libs/libEGL-<hash>.so), and
  `import envpool` loads every EnvPool module, binding them to it. If the
  system libEGL were then the global one, MuJoCo would look up GL functions in a
  second GL dispatch without a current context ("gladLoadGL error", which ends
  the process). Promoting the already loaded bundled copy keeps one GL stack.
  When EnvPool is imported after ensure_gl, it binds to the global system libEGL
  instead, which is equally consistent.
  """
  spec = importlib.util.find_spec("envpool")
  if spec is None or not spec.submodule_search_locations:
    return []
  libs = os.path.join(os.path.dirname(next(iter(spec.submodule_search_locations))), "envpool.libs")
  handles = []
  for path in sorted(glob.glob(os.path.join(libs, "libEGL*.so*"))):
    try:  # RTLD_NOLOAD: only promotes a copy that is already loaded.
      handles.append(ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL | os.RTLD_NOLOAD))
    except OSError:
      pass
  return handles


def _load_backend(backend: str) -> list | None:
  """Loads the backend's libraries globally; None when its required library is missing."""
  if backend == "egl":
    # Order matters: MuJoCo's GL loader uses the first EGL in the global scope, which must be the one
    # EnvPool's context was made current with (see _promote_envpool_egl).
    bundled = _promote_envpool_egl()
    egl = _load_global("libEGL.so.1")
    if egl is None and not bundled:
      return None
    gl = _load_global("libGL.so.1")  # Optional: glvnd's libEGL alone is enough for MuJoCo's loader.
    return bundled + [h for h in (egl, gl) if h is not None]
  if backend == "osmesa":
    for soname in _OSMESA_SONAMES:
      lib = _load_global(soname)
      if lib is not None:
        return [lib]
    return None
  raise ValueError(f"unknown GL backend {backend!r}")


def ensure_gl() -> str:
  """Makes offscreen MuJoCo rendering possible in this process; returns "egl" or "osmesa".

  Sets MUJOCO_GL=egl when unset and loads the backend's libraries with
  RTLD_GLOBAL, once per process (later calls return the cached backend).
  MUJOCO_GL=osmesa is honoured; a non-offscreen value (glfw) warns and uses egl.
  Falls back to OSMesa when EGL is missing (MUJOCO_GL is then set to osmesa);
  raises GLUnavailableError naming the Debian packages when neither loads.
  """
  global _gl_backend
  with _lock:
    if _gl_backend is not None:
      return _gl_backend
    requested = os.environ.get("MUJOCO_GL", "").lower() or "egl"
    if requested not in ("egl", "osmesa"):  # e.g. glfw: not offscreen, and EnvPool uses EGL anyway.
      warnings.warn(f"MUJOCO_GL={requested} is not an offscreen backend; using egl (or osmesa)", RuntimeWarning)
      requested = "egl"
    order = [requested] + [b for b in ("egl", "osmesa") if b != requested]
    for backend in order:
      handles = _load_backend(backend)
      if handles is not None:
        _gl_handles.extend(handles)
        os.environ["MUJOCO_GL"] = backend
        os.environ.setdefault("PYOPENGL_PLATFORM", backend)
        if backend != requested:
          warnings.warn(f"MUJOCO_GL={requested} unavailable; rendering with {backend}", RuntimeWarning)
        _gl_backend = backend
        return backend
    raise GLUnavailableError(
        "no offscreen OpenGL library: neither libEGL.so.1 nor libOSMesa.so could be loaded; "
        "install libegl1 and libgl1-mesa-dri (EGL, what EnvPool needs) or libosmesa6")


def ensure_envpool_gl() -> None:
  """ensure_gl for EnvPool pixel envs, which render through EGL only."""
  if ensure_gl() != "egl":
    raise GLUnavailableError("EnvPool renders pixel observations through EGL only and libEGL.so.1 could not "
                             "be loaded; install libegl1 and libgl1-mesa-dri")


def default_assets_root() -> str:
  """The asset root EnvPool's MetaWorld tasks load from by default."""
  from envpool.registration import asset_base_path

  return asset_base_path("envpool_assets", _METAWORLD_SUBDIR)


def cache_root() -> str:
  """EBRL_CACHE_DIR, else $XDG_CACHE_HOME/ebrl, else ~/.cache/ebrl."""
  explicit = os.environ.get("EBRL_CACHE_DIR")
  if explicit:
    return explicit
  xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(xdg, "ebrl")


def patch_quality(xml: str) -> str:
  """Turns off shadow maps and multisampling in every <quality> tag of an MJCF text."""

  def fix(m: re.Match) -> str:
    tag = re.sub(r'\s(shadowsize|offsamples)\s*=\s*"[^"]*"', "", m.group(0))
    return re.sub(r"^<quality", '<quality shadowsize="0" offsamples="0"', tag)

  return _QUALITY_TAG.sub(fix, xml)


def _cache_key(src_root: str) -> str:
  try:
    version = importlib.metadata.version("envpool-assets")
  except importlib.metadata.PackageNotFoundError:
    version = "unknown"
  where = hashlib.sha1(os.path.realpath(src_root).encode()).hexdigest()[:8]
  return f"metaworld-{version}-{where}-p{_PATCH_VERSION}"


def render_assets_path(src_root: str | None = None, cache_dir: str | None = None) -> str:
  """Returns a base_path whose MetaWorld scenes render without shadows or multisampling.

  The MetaWorld assets (6 MB) are copied once into `cache_dir` (default
  cache_root()/assets), keyed by the envpool-assets version, the source path and
  the patch version, and their <quality> tags patched. Safe across processes:
  the copy is built in a temporary folder and renamed into place. Only valid
  as base_path for MetaWorld tasks (the copy holds nothing else).
  """
  src_root = src_root or default_assets_root()
  src = os.path.join(src_root, _METAWORLD_SUBDIR)
  if not os.path.isdir(src):
    raise FileNotFoundError(f"no MetaWorld assets under {src_root}")
  cache_dir = cache_dir or os.path.join(cache_root(), "assets")
  dest = os.path.join(cache_dir, _cache_key(src_root))
  marker = os.path.join(dest, ".complete")
  if os.path.exists(marker):
    return dest
  os.makedirs(cache_dir, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".tmp-", dir=cache_dir)
  try:
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is readable like any other.
    shutil.copytree(src, os.path.join(tmp, _METAWORLD_SUBDIR))
    patched = 0
    for folder, _, files in os.walk(tmp):
      for f in files:
        if not f.endswith(".xml"):
          continue
        path = os.path.join(folder, f)
        with open(path, encoding="utf-8") as fh:
          text = fh.read()
        new = patch_quality(text)
        if new != text:
          with open(path, "w", encoding="utf-8") as fh:
            fh.write(new)
          patched += 1
    if not patched:
      raise RuntimeError(f"no <quality> tag found in the MetaWorld assets under {src_root}; nothing to patch")
    with open(os.path.join(tmp, ".complete"), "w", encoding="utf-8") as fh:
      fh.write(f"patched {patched} files from {src}\n")
    try:
      os.rename(tmp, dest)
    except OSError:  # Another process finished first (dest exists and is not empty).
      if not os.path.exists(marker):
        raise
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp, ignore_errors=True)
  return dest


def camera_id(env_name: str, camera: int | str) -> int:
  """Maps a camera (id, or a MetaWorld camera name) to EnvPool's render_camera_id."""
  metaworld = env_name.startswith("MetaWorld/")
  if isinstance(camera, str):
    if camera.lstrip("-").isdigit():
      camera = int(camera)
    elif metaworld and camera in METAWORLD_CAMERAS:
      return METAWORLD_CAMERAS.index(camera)
    elif metaworld:
      raise ValueError(f"unknown MetaWorld camera '{camera}'; valid: {', '.join(METAWORLD_CAMERAS)} "
                       "or an id (-1: free camera)")
    else:
      raise ValueError(f"camera names are known for MetaWorld tasks only; pass a camera id for '{env_name}' "
                       "(-1: free camera)")
  camera = int(camera)
  if camera < -1 or (metaworld and camera >= len(METAWORLD_CAMERAS)):
    top = len(METAWORLD_CAMERAS) - 1 if metaworld else "ncam-1"
    raise ValueError(f"render camera id {camera} is out of range for '{env_name}'; valid: -1 (free camera) .. {top}")
  return camera


def pixel_env_kwargs(env_name: str, kwargs: dict) -> dict:
  """What an EnvPool pixel env needs before it is built: GL loaded, cheap MetaWorld assets.

  Returns a copy of kwargs with base_path set for MetaWorld tasks (unless the
  caller chose one) and render_camera_id checked. If the cheap copy cannot be
  made (e.g. an unwritable cache), warns and keeps EnvPool's assets.
  """
  kwargs = dict(kwargs)
  if "render_camera_id" in kwargs:
    kwargs["render_camera_id"] = camera_id(env_name, kwargs["render_camera_id"])
  ensure_envpool_gl()
  if env_name.startswith("MetaWorld/") and "base_path" not in kwargs:
    try:
      kwargs["base_path"] = render_assets_path()
    except (OSError, RuntimeError) as e:
      warnings.warn(f"render-cheap MetaWorld assets unavailable ({e}); rendering with shadows (~10x slower)",
                    RuntimeWarning)
  return kwargs


__all__ = ["GLUnavailableError", "METAWORLD_CAMERAS", "cache_root", "camera_id", "default_assets_root",
           "ensure_envpool_gl", "ensure_gl", "patch_quality", "pixel_env_kwargs", "render_assets_path"]
