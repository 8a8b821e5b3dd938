"""launch/scaling.py: the bytes a learner over several hosts all-reduces per update, the hosts it
scales to on paper, and its bad flags in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from ebrl import scaling
from tiny_configs import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("update_s, allreduce_bytes, gbps", [(1.0, 1e7, 25.0), (0.02, 3e5, 100.0), (5.0, 4e8, 25.0)])
def test_at_the_host_count_it_gives_the_all_reduce_is_a_tenth_of_the_update(update_s, allreduce_bytes, gbps):
  hosts = scaling.hosts_within(update_s, allreduce_bytes, gbps)
  ring_s = 2 * (hosts - 1) / hosts * allreduce_bytes * 8 / (gbps * 1e9)
  np.testing.assert_allclose(ring_s, 0.1 * update_s / hosts, rtol=1e-12)
  assert scaling.hosts_within(update_s, allreduce_bytes, 4 * gbps) > hosts  # A faster link: more hosts.


def test_measure_counts_every_trainable_parameter_once_per_optimiser_step():
  cfg = tiny_config()  # mlp on MetaWorld/Reach-v3.
  row = scaling.measure(cfg, seconds=0.05)
  assert (row["policy"], row["env"]) == ("mlp", "MetaWorld/Reach-v3")
  from policies.mlp import MLPPolicy  # pylint: disable=g-import-not-at-top
  from sim_adapters import make_adapter  # pylint: disable=g-import-not-at-top

  adapter = make_adapter("MetaWorld/Reach-v3", 1)
  try:
    net = MLPPolicy(adapter.spec, hidden=(16, 16)).init(jax.random.key(0))["net"]
  finally:
    adapter.close()
  params = sum(np.size(x) for x in jax.tree.leaves(net))
  assert row["params"] == params
  assert row["optimizer_steps_per_update"] == cfg.algorithm.epochs * cfg.algorithm.num_minibatches == 2
  assert row["allreduce_bytes_per_update"] == 4 * params * 2
  assert row["samples_per_update"] == cfg.num_envs * cfg.rollout_length and row["update_s"] > 0


@pytest.mark.parametrize("flag, says", [("--policies=mlp,rnn", "--policies=mlp,rnn: choose from mlp, cnn, vla, flow"),
                                        ("--seconds=nan", "--seconds=nan must be a finite number > 0"),
                                        ("--out=/proc/ebrl-nope/s.json", "is not writable")])
def test_bad_flags_are_one_line_exit_2(flag, says):
  proc = subprocess.run([sys.executable, "-m", "launch.scaling", flag], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and says in lines[0], proc.stderr
