"""Every user mistake gets one line on stderr and exit code 2, before any compile.

Each case runs `python -m launch.train` in a fork of one process that has
imported the training stack (tests/cli_forkserver.py: the seconds a fresh
interpreter spends importing JAX are spent once, not per case); a few run in a
fresh interpreter too, as a user starts it.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
    "mt50_too_few_envs": (["--config.env.name=MetaWorld/MT50", "--config.num_envs=32"],
                          "num_envs=32 is too few for MetaWorld/MT50: it needs at least one env per task, so at least 50"),
    "task_list_too_few_envs": (["--config.env.name=MetaWorld/MT:Reach-v3,Push-v3,DialTurn-v3", "--config.num_envs=2"],
                               "so at least 3"),
    "unknown_task_in_list": (["--config.env.name=MetaWorld/MT:Reach-v3,Bogus-v3"],
                             ("unknown MetaWorld task 'Bogus-v3'", "valid tasks: Assembly-v3, ", "WindowClose-v3")),
    "empty_task_list": (["--config.env.name=MetaWorld/MT:"], ("names no task", "valid tasks: Assembly-v3, ")),
    "duplicated_task_in_list": (["--config.env.name=MetaWorld/MT:Reach-v3,Push-v3,Reach-v3"],
                                "lists task 'Reach-v3' 2 times"),
    "policy_cannot_read_obs": (["--config.env.from_pixels=True"],
                               ("policy 'mlp' needs observation key(s) ['state']", "--config.env.render_stage=True")),
    "pipelined_on_device_env": (["--config.env.name=mjx:CartpoleBalance", "--config.scheduler=pipelined"],
                                "scheduler 'pipelined' cannot drive device env 'mjx:CartpoleBalance'; "
                                "valid: sync, ebrl, random"),
    "device_groups_split_an_update": (["--config.env.name=mjx:CartpoleBalance", "--config.scheduler=ebrl",
                                       "--config.num_envs=32", "--config.ebrl.segments_per_update=24"],
                                      "multiple of the 16 envs per group"),
    "discrete_action_env": (["--config.env.name=Pong-v5"], "continuous"),
    "unwritable_workdir": (["--workdir=/proc/ebrl-run"], "/proc/ebrl-run"),
    "missing_config_file": (["--config=launch/configs/nope.py"], "nope.py"),
    # config_flags loads the file while it applies overrides: the file is checked before that.
    "missing_config_file_with_override": (["--config=missing.py", "--config.num_envs=8"],
                                          "cannot load --config=missing.py: no such file"),
    "config_file_not_python": (["--config=README.md"],
                               "--config=README.md is not a Python config file (SyntaxError at line "),
    "config_file_is_a_directory": (["--config=launch/configs", "--config.num_envs=8"], "it is a directory"),
    "config_file_without_get_config": (["--config=launch/__init__.py"], "defines no get_config()"),
    "keep_no_checkpoints": (["--config.keep_checkpoints=0"], "keep_checkpoints=0 must be an integer >= 1"),
    "zero_reward_scale": (["--config.algorithm.reward_scale=0"], "algorithm.reward_scale=0.0 must be a positive"),
    "infinite_reward_scale": (["--config.algorithm.reward_scale=inf"], "algorithm.reward_scale=inf must be a positive"),
    "negative_clip_eps": (["--config.algorithm.clip_eps=-0.2"], "algorithm.clip_eps=-0.2 must be a positive"),
    "negative_value_clip_eps": (["--config.algorithm.value_clip_eps=-1"], "algorithm.value_clip_eps=-1.0 must be"),
    "negative_vf_coef": (["--config.algorithm.vf_coef=-0.5"], "algorithm.vf_coef=-0.5 must be a finite number >= 0"),
    "negative_ent_coef": (["--config.algorithm.ent_coef=-0.01"], "algorithm.ent_coef=-0.01 must be a finite"),
    "nan_ent_coef": (["--config.algorithm.ent_coef=nan"], "algorithm.ent_coef=nan must be a finite"),
    "nan_learning_rate": (["--config.algorithm.learning_rate=nan"], "algorithm.learning_rate=nan must be a positive"),
    "nan_max_wait": (["--config.scheduler=ebrl", "--config.ebrl.max_wait_ms=nan"], "ebrl.max_wait_ms=nan must be"),
    "recv_batch_beyond_group": (["--config.scheduler=ebrl", "--config.num_envs=8", "--config.ebrl.num_groups=2",
                                 "--config.ebrl.recv_batch=5"], "ebrl.recv_batch=5 must be in [0, 4] (envs per group"),
    "tiny_render_size": (["--config.env.render_size=4"], "env.render_size=4 must be an integer >= 8"),
    "negative_env_threads": (["--config.env.num_threads=-1"], "env.num_threads=-1 must be an integer >= 0"),
    "negative_seed": (["--config.seed=-1"], "seed=-1 must be an integer in [0, "),
    "seed_beyond_int32": ([f"--config.seed={2**31}"], f"seed={2**31} must be an integer in [0, "),
    "nan_straggler_slowdown": (["--config.env.straggler_slowdown=nan"], "env.straggler_slowdown=nan must be"),
    "negative_success_bonus": (["--config.env.success_bonus=-1"],
                               "env.success_bonus=-1.0 must be a finite number >= 0"),
    "success_bonus_on_summed_chunks": (["--config.env.name=MetaWorld/Reach-v3", "--config.env.success_bonus=1000",
                                        "--config.policy.chunk_size=4"],
                                       ("env.success_bonus=1000.0", "policy.chunk_size=4",
                                        "env.reward_type='chunk'", "set env.reward_type=action")),
    "nan_success_bonus": (["--config.env.success_bonus=nan"], "env.success_bonus=nan must be a finite number >= 0"),
    "end_on_success_on_device_env": (["--config.env.name=mjx:CartpoleBalance", "--config.env.end_on_success=True"],
                                     ("env.end_on_success=True applies to MetaWorld host envs",
                                      "not 'mjx:CartpoleBalance'")),
    "success_bonus_off_metaworld": (["--config.env.name=CartpoleBalance-v1", "--config.env.success_bonus=5"],
                                    "env.success_bonus=5.0 applies to MetaWorld host envs"),
    "negative_dense_reward_scale": (["--config.env.success_bonus=1000", "--config.env.dense_reward_scale=-1"],
                                    "env.dense_reward_scale=-1.0 must be a finite number >= 0"),
    "no_reward_left": (["--config.env.dense_reward_scale=0"],
                       ("env.dense_reward_scale=0", "env.success_bonus=0 leaves no reward")),
    "dense_reward_scale_off_metaworld": (["--config.env.name=CartpoleBalance-v1", "--config.env.dense_reward_scale=0.5"],
                                         "env.dense_reward_scale=0.5 applies to MetaWorld host envs"),
    "end_on_success_with_grpo": (["--config.algorithm.name=grpo", "--config.env.end_on_success=True"],
                                 ("env.end_on_success=True", "algorithm.name=grpo")),
    "positional_argument": (["train-now"], "unexpected arguments"),
    "unknown_placement": (["--config.scheduler=ebrl", "--config.placement=gpu"],
                          "unknown placement 'gpu'; valid: auto, threads, processes"),
    "processes_without_ebrl": (["--config.placement=processes"],
                               "placement=processes runs the learner of scheduler=ebrl on host envs"),
    "learner_sm_percent_beyond_100": (["--config.quotas.learner_sm_percent=120"],
                                      "quotas.learner_sm_percent=120 must be an integer in [0, 100]"),
    "unknown_learner_priority": (["--config.quotas.learner_priority=low"],
                                 "unknown quotas.learner_priority 'low'; valid: auto, normal, idle"),
    "unknown_resources": (["--config.scheduler=ebrl", "--config.resources=greedy"], "valid: off, auto, naive, manual"),
    "resources_for_sync": (["--config.resources=naive"], "scheduler=sync"),
    "naive_on_device_sim": (["--config.env.name=mjx:CartpoleBalance", "--config.scheduler=ebrl",
                             "--config.resources=naive"], "(use resources=auto or off)"),
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
    "unknown_obs_norm_update": (["--config.algorithm.obs_norm_update=during"], "valid: after, before, every_step"),
    "every_step_obs_norm_off_sync": (["--config.algorithm.obs_norm_update=every_step", "--config.scheduler=ebrl"],
                                     "needs scheduler=sync, a host env and policy=mlp"),
    "chunks_on_device_env": (["--config.env.name=mjx:CartpoleBalance", "--config.policy.chunk_size=4"],
                             "runs chunks in host simulators"),
    "unknown_vla_decode": (["--config.policy.name=vla", "--config.policy.decode=beam"],
                           "valid: parallel, autoregressive"),
    "vla_width_not_heads_multiple": (["--config.policy.name=vla", "--config.policy.width=30"],
                                     "policy.width=30 must be a multiple of policy.heads=4"),
    "flow_noise_out_of_range": (["--config.policy.name=flow", "--config.policy.flow_init_log_std=1.0"],
                                "flow_init_log_std=1.0 must be in (-4, 0)"),
    "cnn_without_pixels": (["--config.policy.name=cnn"],
                           ("policy 'cnn' needs observation key(s) ['pixels']", "--config.env.from_pixels=True",
                            "--config.env.render_stage=True")),
    "grpo_on_async_scheduler": (["--config.algorithm.name=grpo", "--config.scheduler=ebrl"], "scheduler=sync"),
    "grpo_group_not_dividing": (["--config.algorithm.name=grpo", "--config.num_envs=32", "--config.algorithm.group_size=5"],
                                "group_size=5 must divide num_envs=32"),
    "missing_warm_start": (["--config.warm_start=nope"], "warm_start='nope'"),
    "kl_penalty_without_warm_start": (["--config.algorithm.ref_kl_coef=0.1"],
                                      ("ref_kl_coef=0.1", "warm_start is empty", "--config.warm_start=")),
    "negative_critic_warmup": (["--config.algorithm.critic_warmup_updates=-1"],
                               "critic_warmup_updates=-1 must be an integer >= 0"),
    "critic_warmup_ev_beyond_1": (["--config.algorithm.critic_warmup_ev=1.5"],
                                  "algorithm.critic_warmup_ev=1.5 must be in [0, 1)"),
    "critic_warmup_ev_without_cap": (["--config.algorithm.critic_warmup_ev=0.5"],
                                     "critic_warmup_ev=0.5 needs algorithm.critic_warmup_updates >= 1"),
    "unknown_ref_kl_mode": (["--config.algorithm.ref_kl_mode=logits"],
                            "algorithm.ref_kl_mode='logits' is not one of sample, mean"),
    "mean_kl_on_flow": (["--config.policy.name=flow", "--config.algorithm.ref_kl_mode=mean",
                         "--config.algorithm.ref_kl_coef=0.1", "--config.warm_start=launch"],
                        ("ref_kl_mode=mean compares a Gaussian policy's means", "ref_kl_mode=sample")),
    "negative_actor_learning_rate": (["--config.algorithm.actor_learning_rate=-1e-4"],
                                     "algorithm.actor_learning_rate=-0.0001 must be a finite number >= 0"),
    "nan_critic_learning_rate": (["--config.algorithm.critic_learning_rate=nan"],
                                 "algorithm.critic_learning_rate=nan must be a finite number >= 0"),
    "negative_bc_coef": (["--config.algorithm.bc_coef=-1"], "algorithm.bc_coef=-1.0 must be a finite number >= 0"),
    "bc_decay_beyond_1": (["--config.algorithm.bc_decay=1.5"], "algorithm.bc_decay=1.5 must be in (0, 1]"),
    "zero_bc_batch": (["--config.algorithm.bc_batch_size=0"], "algorithm.bc_batch_size=0 must be an integer >= 1"),
    "bc_without_demos": (["--config.algorithm.bc_coef=0.1"],
                         ("algorithm.bc_coef=0.1 needs demonstrations", "--config.algorithm.bc_demos=")),
    "bc_demos_not_a_demo_dir": (["--config.algorithm.bc_coef=0.1", "--config.algorithm.bc_demos=launch"],
                                "algorithm.bc_demos: 'launch' is not a demo directory"),
    "bc_in_a_learner_process": (["--config.scheduler=ebrl", "--config.placement=processes",
                                 "--config.algorithm.bc_coef=0.1"],
                                "placement=processes with algorithm.bc_coef=0.1"),
    "token_ratios_without_tokens": (["--config.algorithm.ratio_level=token"],
                                    ("ratio_level=token", "policy.name='mlp'", "ratio_level=decision")),
    "unknown_ratio_level": (["--config.policy.name=vla", "--config.algorithm.ratio_level=chunk"],
                            "ratio_level='chunk' is not one of decision, token"),
    "render_stage_without_pixels": (["--config.env.render_stage=True"], "needs env.from_pixels=True"),
    "missing_profile": (["--config.scheduler=ebrl", "--config.quotas.profile=nope.json"], "quotas.profile='nope.json'"),
}


# One of each kind of mistake also in a fresh interpreter: a flag the parser rejects, a config value,
# an env the Trainer cannot build a policy for.
FRESH = ("unknown_config_key", "negative_steps", "discrete_action_env")


class ForkServer:
  """tests/cli_forkserver.py, started once for this file."""

  def __init__(self):
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    self.proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "cli_forkserver.py")], cwd=ROOT,
                                 env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert json.loads(self._line(120)) == {"ready": True}

  def _line(self, timeout: float) -> str:
    ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
    assert ready, "the CLI fork server did not answer in time"
    line = self.proc.stdout.readline()
    assert line, "the CLI fork server exited"
    return line

  def run(self, module: str, args: list[str], tmp_path) -> subprocess.CompletedProcess:
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    self.proc.stdin.write(json.dumps({"module": module, "args": args, "cwd": ROOT, "out": str(out),
                                      "err": str(err)}) + "\n")
    self.proc.stdin.flush()
    rc = json.loads(self._line(120))["rc"]
    return subprocess.CompletedProcess(args, rc, out.read_text(), err.read_text())

  def close(self):
    self.proc.stdin.close()
    try:
      self.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()


@pytest.fixture(scope="module")
def forks():
  server = ForkServer()
  yield server
  server.close()


def _fresh(args: list[str]) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "launch.train", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)


def _check(proc: subprocess.CompletedProcess, expected, tmp_path) -> None:
  expected = (expected,) if isinstance(expected, str) else expected
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, proc.stderr
  assert lines[0].startswith("error: ")
  for text in expected:
    assert text in lines[0], lines[0]
  assert "Traceback" not in proc.stderr + proc.stdout
  # Nothing was trained: no checkpoint was written.
  assert not (tmp_path / "run" / "checkpoints").exists()


def _args(case: str, tmp_path) -> list[str]:
  args = CASES[case][0]
  if not any(a.startswith("--workdir") for a in args):
    args = args + [f"--workdir={tmp_path / 'run'}"]
  return ["--progress=false", *args]


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_exit_2(case, tmp_path, forks):
  _check(forks.run("launch.train", _args(case, tmp_path), tmp_path), CASES[case][1], tmp_path)


@pytest.mark.parametrize("case", FRESH)
def test_bad_input_is_one_line_exit_2_from_a_fresh_interpreter(case, tmp_path):
  _check(_fresh(_args(case, tmp_path)), CASES[case][1], tmp_path)


def test_the_fork_server_reports_a_good_run_and_a_crash(tmp_path, forks):
  """The harness cannot pass a case by accident: exit 0 for --help, a traceback's exit 1 stays 1."""
  assert forks.run("launch.train", ["--help"], tmp_path).returncode == 0
  crash = forks.run("json.tool", ["/nonexistent/file.json"], tmp_path)
  assert crash.returncode != 0 and crash.stderr
