"""launch.eval rebuilds the run's own adapter: pixels, the render stage and action chunks.

A plain adapter gives a pixel policy no pixels and a chunk policy one action
per decision; the checkpoint then cannot act or even restore. Each run here is
tiny (4 envs, 10-step episodes, two updates): what is checked is that eval
acts in the env the run trained in, not how well.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from ebrl import evaluation
from ebrl.errors import UserError
from launch.configs.default import get_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
EPISODE_STEPS = 10
TINY = ["--progress=false", "--config.num_envs=4", "--config.rollout_length=8", "--config.total_env_steps=64",
        "--config.policy.hidden=(16,16)", "--config.algorithm.epochs=1", "--config.algorithm.num_minibatches=1",
        f"--config.env.max_episode_steps={EPISODE_STEPS}"]


def _train(workdir, *args) -> None:
  proc = subprocess.run([sys.executable, "-m", "launch.train", *TINY, *args, f"--workdir={workdir}"], cwd=ROOT,
                        env=ENV, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]


def _eval(workdir, *args) -> dict:
  out = workdir / "eval.json"
  proc = subprocess.run([sys.executable, "-m", "launch.eval", f"--checkpoint={workdir}", "--episodes=3",
                         f"--out={out}", *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  printed = json.loads(proc.stdout.strip().splitlines()[-1])
  assert printed == json.loads(out.read_text())
  return printed


def test_eval_of_a_chunked_flow_run_on_a_task_list(tmp_path):
  """Also a user's task list: the flow policy reads its instructions, eval reports each task."""
  env = "MetaWorld/MT:Reach-v3,Push-v3"
  _train(tmp_path, f"--config.env.name={env}", "--config.policy.name=flow", "--config.policy.chunk_size=2",
         "--config.env.reward_type=action")
  result = _eval(tmp_path)
  assert result["env"] == result["trained_on"] == env
  assert result["episodes"] == 3 and result["checkpoint_env_steps"] == 64
  # A step is a chunk of two actions: a 10-action episode is 5 decisions.
  assert result["episode_length"] == EPISODE_STEPS / 2
  by_task = result["success_rate_by_task"]
  assert list(by_task) == ["Reach-v3", "Push-v3"]
  assert result["success_rate"] == pytest.approx((2 * by_task["Reach-v3"] + by_task["Push-v3"]) / 3)  # 2 + 1 envs.


def test_eval_success_per_task_is_each_tasks_share_of_its_envs():
  first = evaluation.FirstEpisodes(5)
  done = np.ones(5, bool)
  first.record(done, np.zeros(5), np.full(5, 7), np.array([1.0, 0.0, 0.0, 1.0, 1.0]))
  result = first.summary(True, ("Reach-v3", "Push-v3", "DialTurn-v3"), np.array([0, 0, 1, 1, 2]))
  assert result["success_rate"] == 0.6
  assert result["success_rate_by_task"] == {"Reach-v3": 0.5, "Push-v3": 0.5, "DialTurn-v3": 1.0}
  assert "success_rate_by_task" not in first.summary(True)


def test_eval_needs_an_episode_per_task():
  with pytest.raises(UserError, match="needs at least 10 envs"):
    evaluation.make_runner("MetaWorld/MT10", 4, 0)


@pytest.mark.egl
@pytest.mark.slow  # Trains a pixel run first; the render stage and eval on pixels run by default elsewhere.
def test_eval_of_a_render_stage_cnn_run(tmp_path):
  _train(tmp_path, "--config.policy.name=cnn", "--config.env.from_pixels=True", "--config.env.render_stage=True",
         "--config.env.render_size=32")
  result = _eval(tmp_path)
  assert result["episodes"] == 3 and result["episode_length"] == EPISODE_STEPS
  assert result["checkpoint_env_steps"] == 64


def test_run_env_reads_the_run_config():
  cfg = get_config()
  cfg.env.from_pixels, cfg.env.render_stage, cfg.env.render_size = True, True, 48
  cfg.policy.chunk_size, cfg.env.reward_type, cfg.algorithm.gamma = 4, "action", 0.9
  cfg.env.max_episode_steps = 77
  saved = ml_collections.ConfigDict(json.loads(cfg.to_json()))  # As launch.eval reads config.json.
  assert evaluation.RunEnv.of_spec(evaluation.saved_run(saved)).adapter_kwargs() == dict(
      max_episode_steps=77, from_pixels=True, render_size=48, render_stage=True, chunk_size=4,
      reward_type="action", gamma=0.9)


def test_run_env_of_an_older_config_is_a_plain_state_run():
  old = ml_collections.ConfigDict({"env": {"name": "MetaWorld/Reach-v3"}, "policy": {"name": "mlp"}})
  assert evaluation.RunEnv.of_spec(evaluation.saved_run(old)) == evaluation.RunEnv()


@pytest.mark.parametrize("run_env, named", [
    (evaluation.RunEnv(chunk_size=2), "policy.chunk_size=2"),
    (evaluation.RunEnv(from_pixels=True), "env.from_pixels=True"),
])
def test_device_envs_refuse_host_only_runs(run_env, named):
  with pytest.raises(UserError, match=named):
    evaluation.make_runner("mjx:CartpoleBalance", 2, 0, run_env)


def test_eval_rounds_split_into_whole_tasks():
  assert evaluation.eval_rounds(500, 10, max_envs=500) == [500]
  assert evaluation.eval_rounds(2500, 50) == [250] * 10
  assert evaluation.eval_rounds(2500, 50, max_envs=480) == [450] * 5 + [250]
  assert evaluation.eval_rounds(7, 3, max_envs=2) == [3, 4]  # A round holds at least one env per task.
  assert evaluation.eval_rounds(8, 3, max_envs=6) == [8] and evaluation.eval_rounds(2, 3) == [2]


def test_a_large_evaluation_runs_in_rounds_each_on_its_own_seeds():
  """An MT50-sized evaluation cannot hold all its envs at once (2,500 x ~19 MB): rounds of at most
  max_envs envs give the episodes, in order, that separate evaluations on the rounds' seeds give."""
  import jax
  from policies import make_policy

  env, seed, run_env = "MetaWorld/MT:Reach-v3,Push-v3", 11, evaluation.RunEnv(max_episode_steps=EPISODE_STEPS)
  cfg = get_config().policy
  cfg.hidden = (8,)
  runner = evaluation.HostRunner(env, 6, seed, run_env, max_envs=4)
  policy = make_policy("mlp", runner.spec, cfg)
  params = policy.init(jax.random.PRNGKey(0))
  assert runner.rounds == [4, 2]
  whole = runner.run(policy, params)
  parts = [evaluation.HostRunner(env, n, seed + r * evaluation.ROUND_SEED_STRIDE, run_env).run(policy, params)
           for r, n in enumerate((4, 2))]
  assert whole["episodes"] == 6
  assert whole["episode_return"] == pytest.approx((4 * parts[0]["episode_return"] + 2 * parts[1]["episode_return"]) / 6)
  assert parts[0]["episode_return"] != parts[1]["episode_return"]  # The second round's initial states are its own.
  by_task = whole["success_rate_by_task"]
  assert by_task["Reach-v3"] == pytest.approx(
      (2 * parts[0]["success_rate_by_task"]["Reach-v3"] + parts[1]["success_rate_by_task"]["Reach-v3"]) / 3)
