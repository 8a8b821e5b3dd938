"""Pixel observations from EnvPool (sim_adapters/render.py): GL loading, cheap assets, cameras.

Rendering is CPU (Mesa llvmpipe) here, so pools are small: 2 envs, a few steps.
A failed GL setup ends the process inside MuJoCo (its errors call exit), so the
import-order checks run in subprocesses.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from sim_adapters import render
from sim_adapters.base import gather_all

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REACH = "MetaWorld/Reach-v3"
needs_gl = pytest.mark.egl("OSMesa")  # EGL or OSMesa: ensure_gl falls back to OSMesa.


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
  monkeypatch.setenv("EBRL_CACHE_DIR", str(tmp_path / "cache"))


def rollout(adapter, steps: int, seed: int = 0) -> list[np.ndarray]:
  """Pixels after reset and after each of `steps` fixed random actions."""
  rng = np.random.default_rng(seed)
  adapter.reset()
  frames = [gather_all(adapter, adapter.num_envs).obs["pixels"].copy()]
  for _ in range(steps):
    actions = rng.uniform(-1, 1, (adapter.num_envs, adapter.spec.action_dim)).astype(np.float32)
    frames.append(adapter.step(actions).obs["pixels"].copy())
  return frames


@needs_gl
def test_ensure_gl_is_idempotent():
  backend = render.ensure_gl()
  loaded = len(render._gl_handles)  # pylint: disable=protected-access
  assert backend in ("egl", "osmesa")
  assert os.environ["MUJOCO_GL"] == backend
  assert render.ensure_gl() == backend
  assert len(render._gl_handles) == loaded  # pylint: disable=protected-access


@pytest.mark.egl
def test_onscreen_mujoco_gl_falls_back_to_egl(monkeypatch):
  monkeypatch.setattr(render, "_gl_backend", None)
  monkeypatch.setenv("MUJOCO_GL", "glfw")
  with pytest.warns(RuntimeWarning, match="not an offscreen backend"):
    assert render.ensure_gl() == "egl"
  assert os.environ["MUJOCO_GL"] == "egl"


def test_missing_gl_names_the_packages(monkeypatch):
  monkeypatch.setattr(render, "_gl_backend", None)
  monkeypatch.setattr(render, "_load_global", lambda soname: None)
  monkeypatch.setattr(render, "_promote_envpool_egl", lambda: [])
  monkeypatch.delenv("MUJOCO_GL", raising=False)
  with pytest.raises(render.GLUnavailableError) as e:
    render.ensure_gl()
  msg = str(e.value)
  assert "\n" not in msg and "libegl1" in msg and "libosmesa6" in msg


@needs_gl
def test_pixels_are_deterministic(make):
  runs = [rollout(make(REACH, 2, seed=3, num_threads=2, from_pixels=True, render_size=64), steps=3)
          for _ in range(2)]
  for a, b in zip(*runs):
    assert a.shape == (2, 3, 64, 64) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, b)
  last = runs[0][-1]
  assert len(np.unique(last)) > 20, "image is (nearly) one colour"
  assert not np.array_equal(runs[0][0], runs[0][-1]), "the arm moved but the image did not change"


@needs_gl
def test_metaworld_pixel_pool_uses_cheap_assets(make):
  adapter = make(REACH, 2, from_pixels=True, render_size=32)
  assert adapter._pool.spec.config.base_path == render.render_assets_path()  # pylint: disable=protected-access


def test_patch_quality():
  xml = '<visual>\n  <quality shadowsize="4096" offsamples="4"/>\n  <headlight ambient=".4 .4 .4"/>\n</visual>'
  out = render.patch_quality(xml)
  assert '<quality shadowsize="0" offsamples="0"/>' in out and "<headlight" in out
  assert render.patch_quality('<quality shadowsize ="2048"/>') == '<quality shadowsize="0" offsamples="0"/>'
  assert render.patch_quality("<mujoco/>") == "<mujoco/>"


def test_render_assets_path_is_cached(tmp_path):
  path = render.render_assets_path()
  assert path.startswith(str(tmp_path))
  scene = os.path.join(path, "mujoco", "metaworld", "assets", "scene", "basic_scene.xml")
  with open(scene, encoding="utf-8") as f:
    text = f.read()
  assert 'shadowsize="0"' in text and 'shadowsize="4096"' not in text
  mtime = os.path.getmtime(scene)
  assert render.render_assets_path() == path and os.path.getmtime(scene) == mtime
  assert not [d for d in os.listdir(os.path.dirname(path)) if d.startswith(".tmp-")]


def test_cheap_assets_keep_physics(make):
  # Only <visual> settings change: the state trajectory is bit-identical.
  runs = []
  for base in (None, render.render_assets_path()):
    from sim_adapters.envpool_adapter import EnvPoolAdapter
    kwargs = {"base_path": base} if base else {}
    adapter = EnvPoolAdapter(REACH, 2, seed=1, partially_observable=False, **kwargs)
    rng = np.random.default_rng(0)
    adapter.reset()
    states = [gather_all(adapter, 2).obs["state"]]
    for _ in range(20):
      states.append(adapter.step(rng.uniform(-1, 1, (2, 4)).astype(np.float32)).obs["state"])
    adapter.close()
    runs.append(np.stack(states))
  np.testing.assert_array_equal(runs[0], runs[1])


@needs_gl
def test_cheap_assets_render_the_same_scene(make):
  # Shadows go, the scene stays: mean per-pixel difference of a few grey levels.
  from sim_adapters.envpool_adapter import EnvPoolAdapter
  frames = []
  for base in (None, render.render_assets_path()):
    kwargs = {"base_path": base} if base else {"base_path": render.default_assets_root()}
    adapter = EnvPoolAdapter(REACH, 1, seed=0, from_pixels=True, render_width=64, render_height=64, **kwargs)
    adapter.reset()
    frames.append(gather_all(adapter, 1).obs["pixels"].astype(np.float32))
    adapter.close()
  assert np.abs(frames[0] - frames[1]).mean() < 12.0


def test_camera_ids():
  assert render.camera_id(REACH, -1) == -1
  assert render.camera_id(REACH, "topview") == 0
  assert render.camera_id(REACH, "gripperPOV") == 5
  assert render.camera_id(REACH, "2") == 2
  assert render.camera_id("CartpoleBalance-v1", 1) == 1
  with pytest.raises(ValueError, match="out of range"):
    render.camera_id(REACH, 6)  # EnvPool itself would abort the process at reset.
  with pytest.raises(ValueError, match="valid: topview"):
    render.camera_id(REACH, "front")
  with pytest.raises(ValueError, match="MetaWorld tasks only"):
    render.camera_id("CartpoleBalance-v1", "track")


def test_render_camera_needs_pixels():
  from sim_adapters import make_adapter
  with pytest.raises(ValueError, match="needs from_pixels"):
    make_adapter(REACH, 1, render_camera="topview")
  with pytest.raises(ValueError, match="out of range"):
    make_adapter(REACH, 1, from_pixels=True, render_camera=9)


@needs_gl
def test_render_camera_changes_the_view(make):
  free = rollout(make(REACH, 1, from_pixels=True, render_size=32), steps=0)[0]
  top = rollout(make(REACH, 1, from_pixels=True, render_size=32, render_camera="topview"), steps=0)[0]
  assert not np.array_equal(free, top)


_ORDER_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from sim_adapters import render
if {envpool_first}:
    import envpool
render.ensure_gl()
import envpool
pool = envpool.make("MetaWorld/Reach-v3", env_type="gymnasium", num_envs=1, from_pixels=True,
                    render_width=16, render_height=16, base_path=render.render_assets_path())
obs, _ = pool.reset()
print("mean", float(obs.mean()))
"""


@needs_gl
@pytest.mark.parametrize("envpool_first", [False, True], ids=["ensure_gl_first", "envpool_imported_first"])
def test_ensure_gl_works_in_either_import_order(envpool_first):
  # `import envpool` binds EnvPool to its bundled libEGL; ensure_gl must not then hand
  # MuJoCo a different one (that ends the process with "gladLoadGL error").
  script = _ORDER_SCRIPT.format(root=ROOT, envpool_first=envpool_first)
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
  assert out.returncode == 0 and "mean" in out.stdout, out.stdout + out.stderr
  assert float(out.stdout.split()[-1]) > 0
