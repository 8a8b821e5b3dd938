"""Stage placement on devices (config.devices): parsing, errors, and the same numbers on every split.

The equivalence runs tests/device_split_check.py in a fresh process with four
CPU devices: generation on 1 device and training on 3, 2 + 2, all four shared,
and the default must give the same actions and the same update on the same data,
with each array on the devices its stage was given.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from ebrl.errors import UserError
from ebrl.resources import devices

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cfg(gen="", train="", sim=""):
  return ml_collections.ConfigDict({"gen": gen, "train": train, "sim": sim})


@pytest.mark.parametrize("setting,num_devices,device_env,expected", [
    ({}, 1, False, ((0,), (0,), ())),
    ({}, 4, False, ((0,), (0, 1, 2, 3), ())),
    ({"gen": "1", "train": "3"}, 4, False, ((0,), (1, 2, 3), ())),
    ({"gen": "2", "train": "2"}, 4, False, ((0, 1), (2, 3), ())),
    ({"gen": "0,1,2,3", "train": "0,1,2,3"}, 4, False, ((0, 1, 2, 3), (0, 1, 2, 3), ())),
    ({"gen": "3", "train": "0,1"}, 4, False, ((0, 1, 2), (0, 1), ())),
    ({"train": "2"}, 4, False, ((0,), (0, 1), ())),
    ({}, 4, True, ((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3))),
    ({"sim": "2", "train": "2"}, 4, True, ((0, 1), (2, 3), (0, 1))),  # A device env generates on its sim.
    ({"gen": "auto", "train": "auto"}, 1, False, ((0,), (0,), ())),
])
def test_resolve(setting, num_devices, device_env, expected):
  p = devices.resolve(_cfg(**setting), num_devices, device_env)
  assert (p.gen, p.train, p.sim) == expected


def test_auto_splits_by_demand():
  assert devices.auto_split(4, gen_cost=1.0, train_cost=3.0) == (1, 3)
  assert devices.auto_split(4, gen_cost=1.0, train_cost=1.0) == (2, 2)
  assert devices.auto_split(8, gen_cost=10.0, train_cost=1.0) == (7, 1)  # Both keep a device.
  p = devices.resolve(_cfg(gen="auto", train="auto"), 4, False, gen_cost=1.0, train_cost=3.0)
  assert (p.gen, p.train, p.split) == ((0,), (1, 2, 3), True)


@pytest.mark.parametrize("setting,num_devices,device_env,message", [
    ({"gen": "5"}, 4, False, "devices.gen='5' asks for 5 devices; this process has 4 local device(s)"),
    ({"gen": "0"}, 4, False, "devices.gen='0' asks for 0 devices"),
    ({"train": "0,4"}, 4, False, "devices.train='0,4' names device 4; this process has devices 0..3"),
    ({"train": "1,1"}, 4, False, "names a device more than once"),
    ({"gen": "gpu"}, 4, False, "devices.gen='gpu' is not a device setting; valid: '' (default), 'auto'"),
    ({"gen": "3", "train": "2"}, 4, False, "devices.gen=3 + devices.train=2 asks for more than the 4 local"),
    ({"gen": "1"}, 4, True, "cannot apply to a device env"),
    ({"sim": "2"}, 4, False, "applies to device envs (mjx:, brax:) only"),
])
def test_settings_that_cannot_be_met_are_one_line_errors(setting, num_devices, device_env, message):
  with pytest.raises(UserError, match=re.escape(message)):
    devices.resolve(_cfg(**setting), num_devices, device_env)


def test_validation_checks_divisibility_by_the_training_devices():
  from ebrl import validation  # pylint: disable=g-import-not-at-top
  from ebrl.defaults import get_config
  from ebrl.validation import resolve

  cfg = get_config()
  cfg.num_envs, cfg.devices.gen, cfg.devices.train = 10, "1", "3"
  with pytest.raises(UserError, match="num_envs=10 must be divisible by the 3 devices of the learner mesh"):
    validation.check_devices(resolve(cfg), 4)
  cfg.num_envs = 12
  assert validation.check_devices(resolve(cfg), 4).train == (1, 2, 3)


def test_every_split_gives_the_same_actions_and_update(tmp_path):
  out = tmp_path / "split.npz"
  env = {**os.environ, "XLA_FLAGS": os.environ["XLA_FLAGS"] + " --xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": ROOT}
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "device_split_check.py"), str(out)],
                        env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
  lines = {l.split()[0]: l for l in proc.stdout.splitlines() if "placement=" in l}
  assert "published_on=[0] trained_on=[1, 2, 3]" in lines["split_1_3"]
  assert "published_on=[0, 1] trained_on=[2, 3]" in lines["split_2_2"]
  assert "published_on=[0, 1, 2, 3] trained_on=[0, 1, 2, 3]" in lines["shared"]
  data = np.load(out)
  base = {k[len("unsplit/"):]: data[k] for k in data.files if k.startswith("unsplit/")}
  assert any(k.startswith("params/") for k in base) and "action" in base
  for split in ("split_1_3", "split_2_2", "shared"):
    for key, ref in base.items():
      # The same arithmetic up to the order of cross-device sums.
      np.testing.assert_allclose(data[f"{split}/{key}"], ref, rtol=1e-5, atol=1e-6, err_msg=f"{split} {key}")


def test_a_run_trains_on_its_split(tmp_path):
  """The Trainer wires the placement: a 1 + 3 split on four CPU devices trains end to end."""
  env = {**os.environ, "XLA_FLAGS": os.environ["XLA_FLAGS"] + " --xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": ROOT}
  proc = subprocess.run([sys.executable, "-m", "launch.train", "--progress=false", "--config.num_envs=12",
                         "--config.rollout_length=8", "--config.total_env_steps=192", "--config.policy.hidden=(16,16)",
                         "--config.algorithm.num_minibatches=2", "--config.algorithm.epochs=1",
                         "--config.devices.gen=1", "--config.devices.train=3", f"--workdir={tmp_path / 'run'}"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "devices: generation on [0], training on [1, 2, 3] (disjoint)" in proc.stdout + proc.stderr
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["env_steps"] >= 192 and summary["policy_version"] >= 2
