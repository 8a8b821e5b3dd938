"""launch.bench end to end: every named scheduler in one run, and the bench.json others read.

Tiny shapes and one-second windows: this checks the contract, not the figures.
Each reported figure is held against something the bench did not compute: the
run's own summary.json (kept with --workdir), the test's clock around the bench
process and the CPU the kernel charged to it, and what each scheduler can and
cannot do (sync's stages never overlap; random trains nothing).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_ENVS, ROLLOUT, WARMUP = 8, 8, 2
TINY = [f"--num_envs={NUM_ENVS}", "--seconds=1", f"--warmup_updates={WARMUP}", f"--config.rollout_length={ROLLOUT}",
        "--config.policy.hidden=(16,16)", "--config.algorithm.epochs=1", "--config.algorithm.num_minibatches=2"]
# os.times counts CPU in clock ticks (10 ms): a one-second window's CPU share is that coarse.
CPU_TICK_SLACK = 0.05


class BenchRun:
  """One launch.bench process: its bench.json and stdout, and what the test measured of it."""

  def __init__(self, tmp_path, *args):
    self.workdir = tmp_path / "runs"
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    cpu0, t0 = _children_cpu_s(), time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "launch.bench", *TINY, *args, f"--out={out}",
                           f"--workdir={self.workdir}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    self.wall_s, self.cpu_s = time.monotonic() - t0, _children_cpu_s() - cpu0
    assert proc.returncode == 0, proc.stderr[-3000:]
    self.data, self.stdout = json.loads(out.read_text()), proc.stdout

  def summary(self, name: str) -> dict:
    """summary.json the scheduler's own run wrote: the trainer's count, not the bench's window."""
    return json.loads((self.workdir / name / "summary.json").read_text())


def _children_cpu_s() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def _lanes(name: str, r: dict, stage: str) -> int:
  """Threads a stage runs on. Its busy time cannot exceed the window on each; ebrl's sim runs one
  thread per env group (two by default, or as its resource plan says) and the clock adds them up."""
  if stage != "sim" or not name.startswith("ebrl"):
    return 1
  return r.get("resources", {}).get("plan", {}).get("num_groups", 2)


def check_result_contract(run: BenchRun, name: str) -> None:
  """What every scheduler's result must satisfy, whatever its figures."""
  r, summary, cores = run.data["results"][name], run.summary(name), run.data["machine"]["usable_cores"]
  per_update = NUM_ENVS * ROLLOUT
  # The window lies inside the run: after the warm-up updates' env steps, within the trainer's lifetime.
  assert 0 < r["env_steps"] <= summary["env_steps"] - WARMUP * per_update, name
  assert 1.0 <= r["window_s"] <= summary["wall_s"], name
  # The rate is the window's steps over a time no longer than the bench process lived.
  assert r["env_steps"] / run.wall_s <= r["e2e_env_steps_per_s"] <= summary["env_steps"] / r["window_s"], name
  assert r["rollout_env_steps_per_s"] >= r["e2e_env_steps_per_s"], name
  assert set(r["stage_busy"]) == {"sim", "gen", "train"}, name
  for stage, busy in r["stage_busy"].items():
    assert 0.0 <= busy <= _lanes(name, r, stage) + 0.01, (name, stage, busy)
  # CPU: no more than the usable cores, and within what the kernel charged the whole process.
  assert 0.0 < r["cpu_cores_used"] <= cores + CPU_TICK_SLACK, name
  assert r["cpu_us_per_env_step"] * r["env_steps"] / 1e6 <= run.cpu_s, name
  # No schedule of this scheduler's CPU work per step beats every core busy all the time.
  assert r["work_conserving_env_steps_per_s"] >= r["e2e_env_steps_per_s"] * cores / (cores + CPU_TICK_SLACK), name
  for key in ("force_started", "stale_dropped"):
    assert isinstance(r[key], int) and r[key] >= 0, (name, key)
    assert r[key] == summary.get(key, 0), (name, key)


def test_bench_runs_schedulers_side_by_side_and_writes_the_contract(tmp_path):
  run = BenchRun(tmp_path, "--env=MetaWorld/Reach-v3", "--schedulers=random,sync,ebrl")
  data = run.data
  assert data["env"] == "MetaWorld/Reach-v3" and data["policy"] == "mlp" and data["num_envs"] == NUM_ENVS
  assert data["machine"]["usable_cores"] == len(os.sched_getaffinity(0))
  assert set(data["results"]) == {"random", "sync", "ebrl"}
  for name in data["results"]:
    check_result_contract(run, name)
  # The schedulers ran one after another inside the bench process.
  assert sum(r["window_s"] for r in data["results"].values()) <= run.wall_s
  per_update = NUM_ENVS * ROLLOUT
  for name in ("random", "sync"):  # The window opens after update WARMUP and closes after the last one.
    r, summary = data["results"][name], run.summary(name)
    assert r["env_steps"] == summary["env_steps"] - WARMUP * per_update, name
  random = data["results"]["random"]  # Random actions: no policy, no learning.
  assert run.summary("random")["policy_version"] == 0
  assert random["stage_busy"]["train"] == 0.0 and random["stage_busy"]["gen"] == 0.0
  assert random["rollout_env_steps_per_s"] == random["e2e_env_steps_per_s"]
  sync = data["results"]["sync"]  # One update per rollout; its stages take turns, never overlap.
  assert run.summary("sync")["policy_version"] == run.summary("sync")["env_steps"] // per_update
  busy = sync["stage_busy"]
  assert sum(busy.values()) <= 1.0 + 0.01
  # Time not spent training covers at least the simulator's and the sampler's.
  assert sync["rollout_env_steps_per_s"] <= sync["env_steps"] / ((busy["sim"] + busy["gen"]) * sync["window_s"])
  ebrl = data["results"]["ebrl"]  # Training overlaps its rollout: the rollout rate is the e2e rate.
  assert ebrl["rollout_env_steps_per_s"] == ebrl["e2e_env_steps_per_s"]
  assert 0.0 <= ebrl["staleness_mean"] <= 2.0  # eta = 2 by default
  assert sync["staleness_mean"] == 0.0  # On-policy.
  for a, b in (("sync", "random"), ("ebrl", "sync"), ("ebrl", "random")):
    ratio = data["ratios"][f"{a}_over_{b}"]
    assert ratio == pytest.approx(data["results"][a]["e2e_env_steps_per_s"] / data["results"][b]["e2e_env_steps_per_s"])
  assert "ebrl_over_pipelined" not in data["ratios"]  # pipelined did not run
  assert (tmp_path / "bench_timeline.png").stat().st_size > 0
  assert "ebrl_over_sync" in run.stdout
  header = next(l for l in run.stdout.splitlines() if l.startswith("scheduler"))
  assert header.split()[-2:] == ["forced", "stale"]
  for name, r in data["results"].items():
    row = next(l for l in run.stdout.splitlines() if l.startswith(f"{name} "))
    assert row.split()[-2:] == [str(r["force_started"]), str(r["stale_dropped"])], row


@pytest.mark.slow  # StragglerAdapter is tested alone in test_straggler.py; this adds a bench run around it.
def test_bench_with_stragglers_records_them(tmp_path):
  run = BenchRun(tmp_path, "--env=MetaWorld/MT10", "--num_envs=10", "--schedulers=sync",
                 "--straggler_fraction=0.2", "--straggler_slowdown=3")
  assert run.data["stragglers"] == {"fraction": 0.2, "slowdown": 3.0}
  assert run.data["num_envs"] == 10
  check_result_contract(run, "sync")
  trained = json.loads((run.workdir / "sync" / "config.json").read_text())["env"]  # Wired into the run itself.
  assert (trained["straggler_fraction"], trained["straggler_slowdown"]) == (0.2, 3.0)


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
  prof.write_text(json.dumps({"profile": _synthetic_profile(NUM_ENVS)}))
  run = BenchRun(tmp_path, "--env=MetaWorld/Reach-v3", "--schedulers=ebrl", "--resources=naive,auto",
                 f"--config.quotas.profile={prof}")
  data = run.data
  assert set(data["results"]) == {"ebrl+naive", "ebrl+auto"}
  for name in data["results"]:
    check_result_contract(run, name)
  a, n = data["results"]["ebrl+auto"], data["results"]["ebrl+naive"]
  assert a["resources"]["mode"] == "auto" and n["resources"]["mode"] == "naive"
  assert data["ratios"]["auto_over_naive"] == pytest.approx(a["e2e_env_steps_per_s"] / n["e2e_env_steps_per_s"])
  bound = data["bound"]
  assert bound["env_steps_per_s"] > 0
  for name, r in data["results"].items():
    assert bound["fraction"][name] == pytest.approx(r["e2e_env_steps_per_s"] / bound["env_steps_per_s"])
    assert r["resources"]["predicted_env_steps_per_s"] > 0
  assert "auto_over_naive" in run.stdout and "work-conserving bound" in run.stdout


@pytest.mark.slow  # A learner process per entry; learner-process runs are tested in test_learner_process.py.
def test_bench_placements_compare_a_learner_process_with_learner_threads(tmp_path):
  """Each placement is its own entry; the learner process's CPU is counted in the entry's figures."""
  run = BenchRun(tmp_path, "--env=MetaWorld/Reach-v3", "--schedulers=sync,ebrl", "--placements=threads,processes",
                 "--config.ebrl.max_staleness=1")
  data = run.data
  assert list(data["results"]) == ["sync", "ebrl@threads", "ebrl@processes"]
  for name in data["results"]:
    check_result_contract(run, name)
  res = data["results"]
  assert data["ratios"]["processes_over_threads"] == pytest.approx(
      res["ebrl@processes"]["e2e_env_steps_per_s"] / res["ebrl@threads"]["e2e_env_steps_per_s"])
  assert data["ratios"]["ebrl@processes_over_sync"] == pytest.approx(
      res["ebrl@processes"]["e2e_env_steps_per_s"] / res["sync"]["e2e_env_steps_per_s"])
  assert "processes_over_threads" in run.stdout


@pytest.mark.slow  # Several bench entries per round; one round side by side runs by default.
def test_bench_rounds_interleave_entries_and_combine_them(tmp_path):
  """Two rounds of sync and random: each entry's rate is its steps over its windows, every round's
  own rate and ratio are kept, and each round's run has a directory of its own."""
  run = BenchRun(tmp_path, "--env=MetaWorld/Reach-v3", "--schedulers=random,sync", "--rounds=2")
  data = run.data
  assert data["rounds"] == 2
  for name, r in data["results"].items():
    rounds = [json.loads((run.workdir / name / f"round{k}" / "summary.json").read_text()) for k in (1, 2)]
    assert len(r["rounds_e2e"]) == 2 and all(x > 0 for x in r["rounds_e2e"])
    assert r["e2e_env_steps_per_s"] == pytest.approx(r["env_steps"] / r["window_s"])
    assert min(r["rounds_e2e"]) <= r["e2e_env_steps_per_s"] <= max(r["rounds_e2e"])
    assert r["env_steps"] <= sum(s["env_steps"] for s in rounds) and r["window_s"] >= 2.0
    assert r["steal_s"] >= 0.0
  per_round = data["round_ratios"]["sync_over_random"]
  rates = data["results"]
  assert per_round == pytest.approx([s / q for s, q in zip(rates["sync"]["rounds_e2e"], rates["random"]["rounds_e2e"])])
  assert "sync_over_random" in run.stdout and "(rounds: " in run.stdout


@pytest.mark.slow  # Three training runs (about 55 s); its flags' errors are checked in test_launch_errors.py.
def test_process_bench_compares_one_process_with_two_and_a_slow_host(tmp_path):
  """launch.bench --processes=1,2: each entry a training run; the slow host's entry is slower than
  the same two processes unhindered (process 1 runs a quarter of the time, and every update waits
  for its segments)."""
  out = tmp_path / "bench.json"
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "launch.bench", "--processes=1,2", "--schedulers=sync",
                         "--num_envs=4", "--seconds=3", "--slow_share=0.25", "--config.rollout_length=8",
                         "--config.policy.hidden=16,16", "--config.algorithm.epochs=1",
                         "--config.algorithm.num_minibatches=2", f"--out={out}"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  entries = json.loads(out.read_text())["entries"]
  assert set(entries) == {"sync@1p", "sync@2p", "sync@2p+slow"}
  for name, entry in entries.items():
    (window,) = entry["rounds"]
    assert window["seconds"] > 1 and window["updates"] >= 1, (name, window)
    # Rates in samples: every update of 4 envs x 8 steps, whatever the process count.
    assert window["env_steps"] == window["updates"] * 32, (name, window)
    assert len(set(window["params_sha256_by_process"])) == 1
  assert len(entries["sync@2p"]["rounds"][0]["params_sha256_by_process"]) == 2
  assert entries["sync@2p+slow"]["env_steps_per_s"] < 0.75 * entries["sync@2p"]["env_steps_per_s"]
  assert entries["sync@1p"]["vs_first_count"] == 1.0
