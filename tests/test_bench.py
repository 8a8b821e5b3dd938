"""launch.bench end to end: every named scheduler in one run, and the bench.json others read.

Tiny shapes and one-second windows: this checks the contract (keys, ratios,
CPU accounting, timeline figure, stragglers wired in), not the figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--num_envs=8", "--seconds=1", "--warmup_updates=2", "--config.rollout_length=8",
        "--config.policy.hidden=(16,16)", "--config.algorithm.epochs=1", "--config.algorithm.num_minibatches=2"]


def _bench(tmp_path, *args):
  out = tmp_path / "bench.json"
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "launch.bench", *TINY, *args, f"--out={out}"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(out.read_text()), proc.stdout


def test_bench_runs_schedulers_side_by_side_and_writes_the_contract(tmp_path):
  data, stdout = _bench(tmp_path, "--env=MetaWorld/Reach-v3", "--schedulers=random,sync,ebrl")
  assert data["env"] == "MetaWorld/Reach-v3" and data["policy"] == "mlp" and data["num_envs"] == 8
  assert data["machine"]["usable_cores"] == len(os.sched_getaffinity(0))
  assert set(data["results"]) == {"random", "sync", "ebrl"}
  for name, r in data["results"].items():
    assert r["env_steps"] > 0 and r["window_s"] >= 1.0, name
    assert r["e2e_env_steps_per_s"] == pytest.approx(r["env_steps"] / r["window_s"])
    assert r["rollout_env_steps_per_s"] >= r["e2e_env_steps_per_s"]
    assert set(r["stage_busy"]) == {"sim", "gen", "train"}
    assert 0.0 < r["cpu_cores_used"] <= data["machine"]["usable_cores"] + 0.5
    # The work-conserving rate is this scheduler's CPU work per step spread over every core.
    assert r["work_conserving_env_steps_per_s"] == pytest.approx(
        data["machine"]["usable_cores"] * 1e6 / r["cpu_us_per_env_step"])
    assert r["work_conserving_env_steps_per_s"] >= r["e2e_env_steps_per_s"] * 0.9
  assert data["results"]["random"]["stage_busy"]["train"] == 0.0
  ebrl = data["results"]["ebrl"]  # Training overlaps its rollout: the rollout rate is the e2e rate.
  assert ebrl["rollout_env_steps_per_s"] == ebrl["e2e_env_steps_per_s"]
  assert data["results"]["ebrl"]["staleness_mean"] <= 2.0  # eta = 2 by default
  for a, b in (("sync", "random"), ("ebrl", "sync"), ("ebrl", "random")):
    ratio = data["ratios"][f"{a}_over_{b}"]
    assert ratio == pytest.approx(data["results"][a]["e2e_env_steps_per_s"] / data["results"][b]["e2e_env_steps_per_s"])
  assert "ebrl_over_pipelined" not in data["ratios"]  # pipelined did not run
  assert (tmp_path / "bench_timeline.png").stat().st_size > 0
  assert "ebrl_over_sync" in stdout


def test_bench_with_stragglers_records_them(tmp_path):
  data, _ = _bench(tmp_path, "--env=MetaWorld/MT10", "--num_envs=10", "--schedulers=sync",
                   "--straggler_fraction=0.2", "--straggler_slowdown=3")
  assert data["stragglers"] == {"fraction": 0.2, "slowdown": 3.0}
  assert data["results"]["sync"]["env_steps"] > 0


def _synthetic_profile(n: int) -> dict:
  """A small, self-consistent profile (CPU µs) so the bench plans without calibrating."""
  sim = [{"cores": c, "threads": c, "batch": n, "async": False, "env_steps_per_s": c * 1e4, "cpu_us_per_step": 100.0}
         for c in (1, 2)]
  sim += [{"cores": 2, "threads": 2, "batch": b, "async": True, "env_steps_per_s": 2e6 / (100.0 + 400.0 / b),
           "cpu_us_per_step": 100.0 + 400.0 / b} for b in (n // 4, n // 2)]
  gen = [{"batch": 1 << k, "wall_us": 200.0 + (1 << k), "cpu_us": 200.0 + (1 << k)}
         for k in range((n - 1).bit_length() + 1)]
  return {"fingerprint": {}, "shape": {"num_envs": n}, "sim": sim, "gen": gen,
          "train": [{"samples": 64, "wall_s": 64e-5, "cpu_s": 64e-5}],
          "assemble": [{"batch": 1, "cpu_us": 5.0}, {"batch": n, "cpu_us": 10.0}]}


def test_bench_resource_modes_report_ratio_prediction_and_bound(tmp_path):
  prof = tmp_path / "profile.json"
  prof.write_text(json.dumps({"profile": _synthetic_profile(8)}))
  data, stdout = _bench(tmp_path, "--env=MetaWorld/Reach-v3", "--schedulers=ebrl", "--resources=naive,auto",
                        f"--config.quotas.profile={prof}")
  assert set(data["results"]) == {"ebrl+naive", "ebrl+auto"}
  a, n = data["results"]["ebrl+auto"], data["results"]["ebrl+naive"]
  assert data["ratios"]["auto_over_naive"] == pytest.approx(a["e2e_env_steps_per_s"] / n["e2e_env_steps_per_s"])
  bound = data["bound"]
  assert bound["env_steps_per_s"] > 0
  for name, r in data["results"].items():
    assert bound["fraction"][name] == pytest.approx(r["e2e_env_steps_per_s"] / bound["env_steps_per_s"])
    assert r["resources"]["predicted_env_steps_per_s"] > 0
  assert "auto_over_naive" in stdout and "work-conserving bound" in stdout
