"""Atomic Orbax checkpoints of the train state plus JSON run metadata.

Orbax writes each step into a temporary directory and renames it when complete,
so a crash mid-save leaves the previous checkpoints intact. On resume the
newest checkpoint that restores cleanly is used; a corrupt one is reported by
path and skipped, never deleted or overwritten.

In a run over several processes every process saves and restores together
(Orbax waits for all of them at each call; each writes its part of the
arrays, process 0 the JSON metadata), into one directory they all see. Reading
the metadata alone (`latest_meta`) waits for no one, and a checkpoint that does
not restore is not skipped there: a process cannot tell a corrupt checkpoint
from a lost peer, and processes that fell back to different checkpoints would
train apart.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import jax

import orbax.checkpoint as ocp

from ebrl.errors import UserError


def _saved_steps(directory: str) -> list[int]:
  """The finished checkpoints' steps, newest first (Orbax renames a step's directory to its number
  once every part of it is written)."""
  if not os.path.isdir(directory):
    return []
  return sorted((int(n) for n in os.listdir(directory) if n.isdigit()), reverse=True)


def latest_meta(directory: str) -> dict | None:
  """The JSON metadata of the newest checkpoint in `directory` whose metadata reads, without its
  state and without Orbax (cheap, and waits for no other process: a run reads it before it builds
  anything)."""
  for step in _saved_steps(directory):
    try:
      with open(os.path.join(directory, str(step), "meta", "metadata")) as f:
        return dict(json.load(f))
    except (OSError, ValueError, TypeError):  # Unreadable: restore_latest reports it.
      continue
  return None


class Checkpointer:

  def __init__(self, directory: str, keep: int = 3, warn: Callable[[str], None] = print):
    self.directory = os.path.abspath(directory)
    self._warn = warn
    self._manager = ocp.CheckpointManager(
        self.directory,
        # A save killed half-way leaves its temporary directory; the next launch removes it.
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False,
                                             cleanup_tmp_directories=True),
    )

  def save(self, step: int, state: Any, meta: dict) -> bool:
    """Saves at `step` unless that step already exists (a good one is never overwritten)."""
    if step in self._manager.all_steps():
      return False
    return self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)

  def path(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def latest_meta(self) -> dict | None:
    """See the module's `latest_meta`."""
    return latest_meta(self.directory)

  def restore_latest(self, template: Any) -> tuple[Any, dict] | None:
    """Returns (state, meta) of the newest readable checkpoint, None if there is none."""
    steps = sorted(self._manager.all_steps(), reverse=True)
    bad = []
    for step in steps:
      try:
        out = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(template), meta=ocp.args.JsonRestore()))
        return out.state, dict(out.meta)
      except Exception as e:  # pylint: disable=broad-except  # Orbax raises many kinds.
        reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        if jax.process_count() > 1:  # A lost peer looks the same; no process may fall back alone.
          raise UserError(f"checkpoint {self.path(step)} did not restore in every process of the run ({reason}): "
                          "it is corrupt, or a process was lost while restoring it; check both before resuming "
                          "(an older checkpoint is not tried)") from None
        self._warn(f"checkpoint {self.path(step)} is corrupt ({reason}); trying an older one")
        bad.append(self.path(step))
    if bad:
      raise UserError(f"no readable checkpoint in {self.directory}: corrupt {', '.join(bad)}; "
                      "nothing can continue from them (start a new run in another workdir)")
    return None

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
