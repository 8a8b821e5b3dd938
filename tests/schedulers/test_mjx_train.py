"""Device envs through the trainer: CLI errors, a tiny fused PPO run, and evaluation on both backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tiny_configs import run_to_end

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}

ERRORS = {
    "unknown_mjx_name": (["--config.env.name=mjx:CartpoleBalanse"], "mjx:CartpoleBalance"),
    "unknown_brax_name": (["--config.env.name=brax:antt"], "brax:ant"),
    "pixels_on_device_env": (["--config.env.name=brax:ant", "--config.env.from_pixels=True"], "env.from_pixels=True"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_bad_device_input_is_one_line_exit_2(case, tmp_path):
  args, expected = ERRORS[case]
  proc = subprocess.run([sys.executable, "-m", "launch.train", "--progress=false", *args,
                         f"--workdir={tmp_path / 'run'}"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], proc.stderr
  assert not (tmp_path / "run" / "checkpoints").exists()


def _tiny_cfg(**overrides):
  from launch.configs.default import get_config

  cfg = get_config()
  cfg.env.name = "mjx:CartpoleBalance"
  cfg.env.max_episode_steps = 10
  cfg.num_envs, cfg.rollout_length, cfg.total_env_steps = 4, 8, 96
  cfg.algorithm.num_minibatches = 2
  cfg.log_every_s = 0.0
  for k, v in overrides.items():
    setattr(cfg, k, v)
  return cfg


def test_fused_ppo_run_writes_the_usual_outputs(tmp_path):
  trainer, summary = run_to_end(_tiny_cfg(), tmp_path)
  assert summary["env"] == "mjx:CartpoleBalance" and summary["env_steps"] == 96
  assert summary["policy_version"] == 3  # 96 steps / (4 envs * 8 steps) updates.
  # 10-step episodes: every env finished at least 2 episodes in 24 steps.
  assert summary["episodes"] >= 8 and 0 < summary["final_episode_return"] <= 10.0
  assert summary["final_success_rate"] is None  # Cartpole has no success signal.
  for name in ("config.json", "metrics.jsonl", "summary.json", "trace.json", "plots/learning_curve.png"):
    assert (tmp_path / name).exists(), name
  assert os.listdir(tmp_path / "checkpoints")
  rows = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  for key in ("env_steps", "env_steps_per_s", "success_rate", "episode_return", "episode_length",
              "policy_version", "time_sim_s", "time_train_s", "nan_resets", "loss"):
    assert key in rows[-1], key
  assert rows[-1]["episode_length"] == 10.0
  assert trainer.tracker.episodes == summary["episodes"]


@pytest.mark.slow  # Random actions on a DeviceSim: the benchmarks' reference, a minute of compiles on CPU.
def test_random_scheduler_on_device_env(tmp_path):
  _, summary = run_to_end(_tiny_cfg(scheduler="random"), tmp_path)
  assert summary["env_steps"] == 96 and summary["policy_version"] == 0 and summary["episodes"] >= 8


@pytest.mark.slow
def test_eval_on_both_backends(tmp_path):
  run_to_end(_tiny_cfg(), tmp_path)
  for env, limit in (("mjx:CartpoleBalance", 10), ("CartpoleBalance-v1", 10)):
    out = tmp_path / f"{env.replace(':', '_')}.json"
    proc = subprocess.run([sys.executable, "-m", "launch.eval", f"--checkpoint={tmp_path}", f"--env={env}",
                           "--episodes=4", f"--out={out}"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["env"] == env and result["trained_on"] == "mjx:CartpoleBalance"
    assert result["episodes"] == 4 and result["episode_length"] == limit
    assert 0 < result["episode_return"] <= limit and result["checkpoint_env_steps"] == 96


def test_eval_rejects_an_env_with_other_observations(tmp_path):
  (tmp_path / "config.json").write_text(_tiny_cfg().to_json())
  proc = subprocess.run([sys.executable, "-m", "launch.eval", f"--checkpoint={tmp_path}", "--env=HalfCheetah-v4"],
                        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "trained on 'mjx:CartpoleBalance'" in proc.stderr and "'HalfCheetah-v4'" in proc.stderr
