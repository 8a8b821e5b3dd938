"""Every user mistake gets one line on stderr and exit code 2, before any compile."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = {
    "unknown_env": (["--config.env.name=MetaWorld/Reach-v2"], "MetaWorld/Reach-v3"),
    "unknown_policy": (["--config.policy.name=transformer"], "valid: mlp"),
    "unknown_scheduler": (["--config.scheduler=fastest"], "valid: sync"),
    "unknown_config_key": (["--config.num_env=8"], "num_env"),
    "bad_value_type": (["--config.num_envs=many"], "num_envs"),
    "non_positive_envs": (["--config.num_envs=0"], "num_envs=0"),
    "negative_steps": (["--config.total_env_steps=-5"], "total_env_steps=-5"),
    "non_divisible_minibatches": (["--config.algorithm.num_minibatches=3"], "num_minibatches=3"),
    "unknown_correction": (["--config.algorithm.correction=retrace"], "valid: decoupled_ppo, vtrace"),
    "mt10_too_few_envs": (["--config.env.name=MetaWorld/MT10", "--config.num_envs=8"], "at least 10"),
    "policy_cannot_read_obs": (["--config.env.from_pixels=True"], "policy 'mlp' needs observation key(s) ['state']"),
    "pipelined_on_device_env": (["--config.env.name=mjx:CartpoleBalance", "--config.scheduler=pipelined"],
                                "scheduler 'pipelined' cannot drive device env 'mjx:CartpoleBalance'; "
                                "valid: sync, ebrl, random"),
    "device_groups_split_an_update": (["--config.env.name=mjx:CartpoleBalance", "--config.scheduler=ebrl",
                                       "--config.ebrl.segments_per_update=24"], "multiple of the 16 envs per group"),
    "discrete_action_env": (["--config.env.name=Pong-v5"], "continuous"),
    "unwritable_workdir": (["--workdir=/proc/ebrl-run"], "/proc/ebrl-run"),
    "missing_config_file": (["--config=launch/configs/nope.py"], "nope.py"),
    "positional_argument": (["train-now"], "unexpected arguments"),
    "unknown_resources": (["--config.scheduler=ebrl", "--config.resources=greedy"], "valid: off, auto, naive, manual"),
    "resources_for_sync": (["--config.resources=naive"], "scheduler=sync"),
    "manual_without_cores": (["--config.scheduler=ebrl", "--config.resources=manual"], "quotas.sim_cores"),
    "manual_cores_not_usable": (["--config.scheduler=ebrl", "--config.resources=manual", "--config.quotas.sim_cores=0-999",
                                 "--config.quotas.gen_cores=0", "--config.quotas.train_cores=0"],
                                "quotas.sim_cores='0-999' names cores"),
    "render_cores_without_render_stage": (["--config.scheduler=ebrl", "--config.resources=manual",
                                           "--config.quotas.sim_cores=0", "--config.quotas.gen_cores=0",
                                           "--config.quotas.train_cores=0", "--config.quotas.render_cores=0"],
                                          "quotas.render_cores='0' places a render stage; this run has none"),
    "render_cores_not_usable": (["--config.scheduler=ebrl", "--config.resources=manual",
                                 "--config.env.from_pixels=True", "--config.env.render_stage=True",
                                 "--config.policy.name=cnn",
                                 "--config.quotas.sim_cores=0", "--config.quotas.gen_cores=0",
                                 "--config.quotas.train_cores=0", "--config.quotas.render_cores=0-999"],
                                "quotas.render_cores='0-999' names cores"),
    "bad_chunk_size": (["--config.policy.chunk_size=0"], "policy.chunk_size=0 must be an integer >= 1"),
    "unknown_reward_type": (["--config.env.reward_type=step"], "valid: chunk, action"),
    "chunks_on_device_env": (["--config.env.name=mjx:CartpoleBalance", "--config.policy.chunk_size=4"],
                             "runs chunks in host simulators"),
    "unknown_vla_decode": (["--config.policy.name=vla", "--config.policy.decode=beam"],
                           "valid: parallel, autoregressive"),
    "vla_width_not_heads_multiple": (["--config.policy.name=vla", "--config.policy.width=30"],
                                     "policy.width=30 must be a multiple of policy.heads=4"),
    "flow_noise_out_of_range": (["--config.policy.name=flow", "--config.policy.flow_init_log_std=1.0"],
                                "flow_init_log_std=1.0 must be in (-4, 0)"),
    "cnn_without_pixels": (["--config.policy.name=cnn"], "policy 'cnn' needs observation key(s) ['pixels']"),
    "grpo_on_async_scheduler": (["--config.algorithm.name=grpo", "--config.scheduler=ebrl"], "scheduler=sync"),
    "grpo_group_not_dividing": (["--config.algorithm.name=grpo", "--config.algorithm.group_size=5"],
                                "group_size=5 must divide num_envs=32"),
    "missing_warm_start": (["--config.warm_start=nope"], "warm_start='nope'"),
    "render_stage_without_pixels": (["--config.env.render_stage=True"], "needs env.from_pixels=True"),
    "missing_profile": (["--config.scheduler=ebrl", "--config.quotas.profile=nope.json"], "quotas.profile='nope.json'"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_exit_2(case, tmp_path):
  args, expected = CASES[case]
  if not any(a.startswith("--workdir") for a in args):
    args = args + [f"--workdir={tmp_path / 'run'}"]
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", "launch.train", "--progress=false", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, proc.stderr
  assert lines[0].startswith("error: ")
  assert expected in lines[0]
  assert "Traceback" not in proc.stderr + proc.stdout
  # Nothing was trained: no checkpoint was written.
  assert not (tmp_path / "run" / "checkpoints").exists()
