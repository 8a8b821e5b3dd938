"""A run's workdir: never silently reused, and resumed only with the config that made it.

Why: a fresh run in a used workdir would append to the old metrics.jsonl, skip
checkpoint steps that already exist and later resume from the old run's
checkpoint; a resume with another env, policy or shape would fail deep inside
Orbax (or, worse, train on). Both are told apart from a real resume before
anything is built, and before config.json is rewritten.
"""

from __future__ import annotations

import json
import os
from typing import Mapping

from ebrl import defaults
from ebrl.errors import UserError

CONFIG_FILE = "config.json"
_RUN_FILES = (CONFIG_FILE, "metrics.jsonl", "summary.json")

# Keys a resumed run may change: budgets, logging, and how the same work is placed and batched.
RESUMABLE_KEYS = ("total_env_steps", "target_success", "resume", "warm_start", "log_every_s",
                  "checkpoint_every_s", "keep_checkpoints", "eval_episodes", "env.num_threads", "resources", "quotas.",
                  "ebrl.num_groups", "ebrl.recv_batch", "ebrl.max_gen_batch", "ebrl.max_wait_ms", "devices.")


def holds_run(path: str) -> bool:
  """Whether `path` has the outputs of a run (its config, metrics or a checkpoint)."""
  if any(os.path.exists(os.path.join(path, f)) for f in _RUN_FILES):
    return True
  ckpt = os.path.join(path, "checkpoints")
  return os.path.isdir(ckpt) and any(d.isdigit() for d in os.listdir(ckpt))


def config_differences(saved: Mapping, config: Mapping) -> list[str]:
  """'key: saved -> now' for every key both configs have that a resume may not change."""
  now = defaults.flatten(config)
  saved = defaults.flatten(saved)
  resumable = lambda k: any(k == r or (r.endswith(".") and k.startswith(r)) for r in RESUMABLE_KEYS)
  return [f"{k}: {saved[k]!r} -> {now[k]!r}" for k in sorted(saved.keys() & now.keys())
          if saved[k] != now[k] and not resumable(k)]


def check_writable(path: str, flag: str = "workdir") -> None:
  """Creates the directory if needed and proves it is writable."""
  try:
    os.makedirs(path, exist_ok=True)
    probe = os.path.join(path, ".write_probe")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise UserError(f"{flag} '{path}' is not writable ({e.strerror}); pass --{flag}=<a writable directory>") from None


def prepare(path: str, config: Mapping, resume: bool) -> None:
  """Creates the workdir, proves it writable, and refuses a used one unless this is its `resume`
  with the same `config` (a run's, as plain data: RunSpec.config) but for the keys a resume may change."""
  check_writable(path)
  if not holds_run(path):
    return
  if not resume:
    raise UserError(f"workdir '{path}' already holds a run; pass --config.resume=True to continue it, "
                    "or another --workdir for a new run")
  saved_path = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(saved_path):
    return
  try:
    with open(saved_path) as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f"cannot read {saved_path} to check the resumed config ({e})") from None
  diff = config_differences(saved, config)
  if diff:
    raise UserError(f"--config.resume=True with a config that differs from the run in '{path}': "
                    f"{'; '.join(diff)}; resume with the run's own config or start a new --workdir")


def write_config(path: str, config: Mapping) -> None:
  """config.json (a run's config as plain data), written atomically (a crash never leaves half of it)."""
  target = os.path.join(path, CONFIG_FILE)
  with open(target + ".tmp", "w") as f:
    json.dump(config, f, indent=2)
  os.replace(target + ".tmp", target)


def check_output_file(name: str, path: str) -> None:
  """UserError unless `path` can be written: its directory is made and a probe written.

  Results are written after minutes of benchmarking or evaluating; an unwritable
  path found only then loses them. An existing file is opened for appending,
  which leaves its content alone; a new one is created and removed again.
  `name` is the parameter as the caller knows it ("out" in the API, "--out" on
  the command line).
  """
  try:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    existed = os.path.exists(path)
    with open(path, "a"):
      pass
    if not existed:
      os.remove(path)
  except OSError as e:
    raise UserError(f"{name}='{path}' is not writable ({e.strerror or e}); "
                    f"pass {name}=<a file path in a writable directory>") from None

