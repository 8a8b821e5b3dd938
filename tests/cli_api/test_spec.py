"""The run spec: every config key reaches it typed, once; components below the API see no config."""

from __future__ import annotations

import ast
import dataclasses
import os

import ml_collections
import pytest

from ebrl.defaults import flatten, get_config
from ebrl.errors import UserError
from ebrl.spec import derive_layout, translate
from ebrl.validation import check_devices, resolve

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Where each config key lives in the spec when its path differs from the config's.
RENAMED = {"ebrl.": "async_.", "pipelined.num_partitions": "num_partitions", "placement": "learner_placement",
           **{k: f"outputs.{k}" for k in ("target_success", "log_every_s", "checkpoint_every_s", "keep_checkpoints",
                                          "resume", "warm_start", "eval_episodes")}}


def _spec_path(key: str) -> str:
  for old, new in RENAMED.items():
    if key == old or (old.endswith(".") and key.startswith(old)):
      return new + key[len(old):] if old.endswith(".") else new
  return key


def _get(obj, path: str):
  for part in path.split("."):
    obj = getattr(obj, part)
  return obj


def test_every_config_key_reaches_the_spec_with_its_value():
  """A key added to the defaults without a place in the spec would never reach a component."""
  for scheduler, other in (("ebrl", "pipelined."), ("pipelined", "ebrl.")):  # Each holds its own section.
    cfg = get_config()
    cfg.scheduler = scheduler
    spec = resolve(cfg)
    for key, value in flatten(cfg).items():
      if not key.startswith(other):
        got = _get(spec, _spec_path(key))
        assert got == (tuple(value) if isinstance(value, (list, tuple)) else value), key


def test_the_spec_is_frozen_and_holds_no_config_dict():
  spec = resolve(get_config())
  with pytest.raises(dataclasses.FrozenInstanceError):
    spec.num_envs = 8  # type: ignore[misc]
  with pytest.raises(dataclasses.FrozenInstanceError):
    spec.algorithm.gamma = 0.5  # type: ignore[misc]
  todo = [spec]
  while todo:
    obj = todo.pop()
    assert not isinstance(obj, ml_collections.ConfigDict), obj
    if dataclasses.is_dataclass(obj):
      todo.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
    elif isinstance(obj, dict):
      todo.extend(obj.values())
    elif isinstance(obj, (list, tuple)):
      todo.extend(obj)


def test_async_settings_exist_only_for_the_async_scheduler():
  cfg = get_config()
  sync = resolve(cfg)
  assert sync.async_ is None and sync.max_staleness == 0 and sync.layout.recv_batch is None
  cfg.scheduler, cfg.ebrl.max_staleness, cfg.ebrl.max_wait_ms = "ebrl", 3, 2.5
  run = resolve(cfg)
  assert run.max_staleness == 3 and run.async_.max_wait_s == pytest.approx(0.0025)
  # Two groups of 32 envs, each recv half a group, every group's ready batch in one generation call.
  assert (run.layout.num_groups, run.layout.envs_per_group, run.layout.recv_batch, run.layout.max_gen_batch) == (
      2, 32, 16, 32)
  cfg.scheduler, cfg.pipelined.num_partitions = "pipelined", 4
  assert resolve(cfg).layout.num_groups == 4


def test_a_multitask_env_is_known_by_its_tasks():
  cfg = get_config()
  cfg.env.name, cfg.num_envs, cfg.scheduler = "MetaWorld/MT10", 20, "ebrl"
  run = resolve(cfg)
  assert len(run.tasks) == 10 and run.layout.num_groups == 1 and run.layout.recv_batch == 19
  assert resolve(get_config()).tasks is None


def test_a_plan_sizes_the_layout_from_the_same_spec():
  cfg = get_config()
  cfg.scheduler = "ebrl"
  run = resolve(cfg)
  plan = type("Plan", (), dict(num_groups=4, recv_batch=8, max_gen_batch=24, sim_threads=1, thread_affinity_offset=0))
  layout = derive_layout(run, plan)
  assert (layout.num_groups, layout.envs_per_group, layout.recv_batch, layout.max_gen_batch) == (4, 16, 8, 24)
  assert layout.total_updates == run.layout.total_updates and layout.gamma == run.layout.gamma


@pytest.mark.parametrize("key, value, message", [
    ("ebrl.num_groups", 3, "ebrl.num_groups=3 must divide num_envs=64"),
    ("ebrl.recv_batch", 40, "ebrl.recv_batch=40 must be in [0, 32]"),
    ("algorithm.num_minibatches", 3, "algorithm.num_minibatches=3 must divide num_envs * rollout_length"),
])
def test_sizes_that_do_not_divide_are_one_line_errors(key, value, message):
  cfg = get_config()
  cfg.scheduler = "ebrl"
  section, name = key.split(".")
  cfg[section][name] = value
  with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]").replace("*", r"\*")):
    resolve(cfg)


def test_device_checks_wait_for_the_device_count():
  cfg = get_config()
  cfg.num_envs, cfg.devices.train = 6, "0,1,2,3"
  run = resolve(cfg)  # No device count yet (an MPS daemon starts before JAX counts devices).
  with pytest.raises(UserError, match="num_envs=6 must be divisible by the 4 devices of the learner mesh"):
    check_devices(run, 4)
  with pytest.raises(UserError, match="devices.train"):
    check_devices(run, 2)  # Device 3 does not exist on two devices.


def test_a_saved_config_translates_without_checks():
  """config.json of a finished run reads back even where a check would now fail (its warm start
  directory is gone): it was checked when the run started."""
  cfg = get_config()
  cfg.warm_start = "/no/such/dir"
  with pytest.raises(UserError, match="warm_start"):
    resolve(cfg)
  assert translate(cfg).outputs.warm_start == "/no/such/dir"


# Below the API and the launchers, nothing reads a config dict: only these modules touch ml_collections
# (the resolver and the defaults, the Python API and the bench/profile entry points that build configs,
# evaluation reading a saved config.json, and the Trainer, which resolves a config it is handed).
READS_CONFIG = {"ebrl/api.py", "ebrl/benchmark.py", "ebrl/defaults.py", "ebrl/evaluation.py", "ebrl/profiling.py",
                "ebrl/spec.py", "ebrl/validation.py", "ebrl/trainer.py"}
CONFIG_CALLS = {"to_json_best_effort", "copy_and_resolve_references", "get_config"}


def _touches_config(path: str) -> bool:
  tree = ast.parse(open(path).read(), path)
  for node in ast.walk(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
      if any(n and n.split(".")[0] == "ml_collections" for n in names):
        return True
    if isinstance(node, ast.Attribute) and node.attr in CONFIG_CALLS:
      return True
  return False


def test_config_dicts_are_read_only_by_the_resolver_and_the_api():
  touching = set()
  for package in ("ebrl", "sim_adapters", "policies"):
    for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
      for name in files:
        path = os.path.join(dirpath, name)
        if name.endswith(".py") and _touches_config(path):
          touching.add(os.path.relpath(path, ROOT))
  assert touching <= READS_CONFIG, sorted(touching - READS_CONFIG)

