"""The demo format's names, its byte-stable writer and its manifest check (ebrl/demos/__init__.py
documents the format itself).

Why a writer of our own: `np.savez` stamps every entry with the current time, so two recordings of
the same episodes would differ in bytes; here entries carry a fixed timestamp and a fixed order,
and a file appears only complete (written beside, then renamed).
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from typing import Any, Mapping, Sequence

import numpy as np

from ebrl.errors import UserError

FORMAT = "ebrl-demos"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SHARD_DIR = "shards"

STEP_KEYS = ("actions", "expert_actions", "rewards", "success")  # Beside obs/<key>, one row per step.
EPISODE_KEYS = ("episode_length", "episode_task", "episode_instruction", "episode_success", "episode_return",
                "episode_env", "episode_index")  # Beside final_obs/<key>, one row per episode.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # The earliest a zip entry can say: fixed, so the bytes are.


class DemoFormatError(UserError):
  """A demo directory that cannot be read as this format (one line naming it and what is wrong)."""


def shard_name(index: int) -> str:
  return f"{SHARD_DIR}/{index:05d}.npz"


def _atomic_write(path: str, data: bytes) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)


def write_npz(path: str, arrays: Mapping[str, np.ndarray]) -> int:
  """Writes `arrays` as an .npz np.load reads, the same bytes for the same arrays; returns its size."""
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w", allowZip64=True) as zf:
    for name, value in arrays.items():
      entry = io.BytesIO()
      np.lib.format.write_array(entry, np.ascontiguousarray(value), allow_pickle=False)
      info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
      info.external_attr = 0o644 << 16
      zf.writestr(info, entry.getvalue(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=1)
  data = buf.getvalue()
  _atomic_write(path, data)
  return len(data)


def pack_shard(episodes: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
  """The arrays of one shard from episode records (ebrl/demos/recorder.py's): per-step arrays
  concatenated in episode order, per-episode values stacked."""
  obs_keys = list(episodes[0]["obs"])
  out: dict[str, np.ndarray] = {}
  for key in obs_keys:
    out[f"obs/{key}"] = np.concatenate([e["obs"][key] for e in episodes])
  for key in STEP_KEYS:
    out[key] = np.concatenate([e[key] for e in episodes])
  for key in obs_keys:
    out[f"final_obs/{key}"] = np.stack([e["final_obs"][key] for e in episodes])
  out["episode_length"] = np.array([len(e["actions"]) for e in episodes], np.int32)
  for key, dtype in (("task", np.int32), ("instruction", np.int32), ("success", np.bool_),
                     ("return", np.float32), ("env", np.int32), ("index", np.int32)):
    out[f"episode_{key}"] = np.array([e[f"episode_{key}"] for e in episodes], dtype)
  return out


def write_manifest(directory: str, manifest: Mapping[str, Any]) -> None:
  _atomic_write(os.path.join(directory, MANIFEST), (json.dumps(manifest, indent=1) + "\n").encode())


def read_manifest(directory: str) -> dict:
  """The manifest of demo directory `directory`, checked: DemoFormatError (one line) when the
  directory is missing or empty, the manifest unreadable, of another format or version, or a shard
  it lists is missing."""
  shown = f"demo directory '{directory}'"
  if not os.path.isdir(directory):
    raise DemoFormatError(f"{shown} does not exist; record one with python -m launch.demos --out=DIR")
  path = os.path.join(directory, MANIFEST)
  if not os.path.isfile(path):
    what = (f"has no {MANIFEST} (not a demo set, or an unfinished recording)" if os.listdir(directory)
            else "is empty")
    raise DemoFormatError(f"{shown} {what}; record one with python -m launch.demos --out=DIR")
  try:
    with open(path) as f:
      manifest = json.load(f)
  except (OSError, ValueError) as e:
    raise DemoFormatError(f"{path} is not readable JSON ({' '.join(str(e).split())})") from None
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
    got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
    raise DemoFormatError(f"{path} is not an {FORMAT} manifest (format {got!r})")
  if manifest.get("version") != FORMAT_VERSION:
    raise DemoFormatError(f"{path} is {FORMAT} version {manifest.get('version')!r}; this EBRL reads version "
                          f"{FORMAT_VERSION} (record the demos again with this version's launch.demos)")
  missing = [s["file"] for s in manifest.get("shards", []) if not os.path.isfile(os.path.join(directory, s["file"]))]
  if missing:
    raise DemoFormatError(f"{shown} lacks {len(missing)} shard(s) its manifest lists, first {missing[0]}")
  return manifest
