"""Atomic Orbax checkpoints of the train state plus JSON run metadata.

Orbax writes each step into a temporary directory and renames it when complete,
so a crash mid-save leaves the previous checkpoints intact. On resume the
newest checkpoint that restores cleanly is used; a corrupt one is reported by
path and skipped, never deleted or overwritten.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import orbax.checkpoint as ocp

from ebrl.errors import UserError


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
    """The JSON metadata of the newest checkpoint whose metadata reads, without its state (cheap:
    a run reads it before it builds anything)."""
    for step in sorted(self._manager.all_steps(), reverse=True):
      try:
        return dict(self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)
      except Exception:  # pylint: disable=broad-except  # Unreadable: restore_latest reports it.
        continue
    return None

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
        self._warn(f"checkpoint {self.path(step)} is corrupt ({reason}); trying an older one")
        bad.append(self.path(step))
    if bad:
      raise UserError(f"no readable checkpoint in {self.directory}: corrupt {', '.join(bad)}; "
                      "nothing can continue from them (start a new run in another workdir)")
    return None

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
