"""Evaluation that tells the truth: mean and sampled actions, success with a 95% interval, from a
launch.train workdir or a launch.sft directory, and a fine-tuning run's success before and after.

Runs are tiny (4 envs, 10-step episodes): what is checked is what is reported and that the same
policy on the same seed reports the same, not how well it does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from ebrl import evaluation, warm_start
from ebrl.errors import UserError
from ebrl.validation import resolve
from launch.configs.default import get_config
from tiny_configs import run_to_end, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
EPISODE_STEPS = 10
TASKS = "MetaWorld/MT:Reach-v3,Push-v3"


def _launch_eval(*args) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "launch.eval", *args], cwd=ROOT, env=ENV, capture_output=True,
                        text=True, timeout=600)


# ----------------------------------------------------------------------------- the interval


def test_wilson_interval_contains_the_rate_and_shrinks_with_n(monkeypatch):
  widths = []
  for n in (10, 100, 1000):
    low, high = evaluation.success_ci95(3 * n // 10, n)
    assert 0.0 <= low < 0.3 < high <= 1.0
    widths.append(high - low)
  assert widths[0] > widths[1] > widths[2]
  assert evaluation.success_ci95(0, 10)[0] == 0.0 < evaluation.success_ci95(0, 10)[1]  # Not empty at 0 or n.
  assert evaluation.success_ci95(10, 10)[0] < 1.0 == pytest.approx(evaluation.success_ci95(10, 10)[1])
  np.testing.assert_allclose(evaluation.success_ci95(3, 10), [0.1077913, 0.6032219], atol=1e-6)
  with_scipy = [evaluation.success_ci95(k, 17) for k in range(18)]
  monkeypatch.setitem(sys.modules, "scipy.stats", None)  # The closed form, as without scipy.
  np.testing.assert_allclose([evaluation.success_ci95(k, 17) for k in range(18)], with_scipy, atol=1e-9)


def test_summary_gives_each_task_its_interval():
  first = evaluation.FirstEpisodes(5)
  first.record(np.ones(5, bool), np.zeros(5), np.full(5, 7), np.array([1.0, 0.0, 0.0, 1.0, 1.0]))
  result = first.summary(True, ("Reach-v3", "Push-v3", "DialTurn-v3"), np.array([0, 0, 1, 1, 2]))
  assert result["success_ci95"] == evaluation.success_ci95(3, 5)
  assert result["success_ci95_by_task"] == {"Reach-v3": evaluation.success_ci95(1, 2),
                                            "Push-v3": evaluation.success_ci95(1, 2),
                                            "DialTurn-v3": evaluation.success_ci95(1, 1)}
  plain = first.summary(False)
  assert plain["success_rate"] is None and plain["success_ci95"] is None


# ----------------------------------------------------------------------------- config keys and flags


@pytest.mark.parametrize("overrides, expected", [
    ({"min_std": -0.1}, "policy.min_std=-0.1 must be a finite number >= 0"),
    ({"max_std": float("inf")}, "policy.max_std=inf must be a finite number >= 0"),
    ({"min_std": 0.5, "max_std": 0.2}, "policy.min_std=0.5 must be below policy.max_std=0.2"),
    ({"min_std": 0.3, "max_std": 0.3}, "policy.min_std=0.3 must be below policy.max_std=0.3"),
    ({"detach_critic": 1}, "policy.detach_critic=1 must be True or False"),
    ({"name": "vla", "vla_critic_hidden": (256, 0)},
     "policy.vla_critic_hidden=(256, 0) must be positive integer layer sizes, e.g. (256, 256), or () for a linear "
     "value head on the trunk"),
    ({"name": "vla", "vla_critic_hidden": "256"}, "policy.vla_critic_hidden='256' must be positive integer"),
])
def test_bad_std_bounds_and_detach_critic_are_one_line(overrides, expected):
  cfg = get_config()
  cfg.policy = ml_collections.ConfigDict({**cfg.policy.to_dict(), **overrides})  # No type check of the values.
  with pytest.raises(UserError, match=re.escape(expected)) as e:
    resolve(cfg)
  assert "\n" not in str(e.value)


def test_the_new_policy_keys_reach_the_policy():
  from policies import make_policy  # pylint: disable=g-import-not-at-top
  cfg = get_config()
  cfg.policy.min_std, cfg.policy.max_std, cfg.policy.detach_critic = 0.05, 2.0, True
  spec = resolve(cfg)
  assert (spec.policy.min_std, spec.policy.max_std, spec.policy.detach_critic) == (0.05, 2.0, True)
  runner = evaluation.HostRunner("MetaWorld/Reach-v3", 1, 0)
  policy = make_policy("mlp", runner.spec, spec.policy)
  assert (policy.min_std, policy.max_std) == (0.05, 2.0)


def test_launch_eval_bad_actions_is_one_line_before_jax(tmp_path):
  proc = _launch_eval(f"--checkpoint={tmp_path}", "--actions=greedy")
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert lines == ["error: actions='greedy' must be one of: sample, mean (sample: as in training; mean: the "
                   "policy's deterministic action)"], proc.stderr
  with pytest.raises(UserError, match="actions='greedy' must be one of"):
    evaluation.check_args(3, 0, "greedy")


def test_the_default_eval_seed_is_the_held_out_one():
  """launch.eval, ebrl.evaluate and evaluate_run start from the initial states a fine-tuning run's
  and launch.sft's evaluations use, unless told otherwise."""
  import inspect  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top

  import ebrl  # pylint: disable=g-import-not-at-top
  for fn in (ebrl.evaluate, evaluation.evaluate_run):
    assert inspect.signature(fn).parameters["seed"].default == evaluation.HELD_OUT_SEED, fn
  source = open(os.path.join(ROOT, "launch", "eval.py")).read()
  default = re.search(r'DEFINE_integer\("seed", ([0-9_]+),', source).group(1)
  assert int(default) == evaluation.HELD_OUT_SEED


# ----------------------------------------------------------------------------- a launch.sft directory


def test_launch_eval_of_an_sft_directory_is_the_held_out_evaluation(tmp_path):
  """A launch.sft --out directory (params/ and sft.json with the run config) evaluates as its own
  policy: the same figures an in-process runner on the held-out seed gives, per task too."""
  from policies import make_policy  # pylint: disable=g-import-not-at-top
  cfg = tiny_config(env__name=TASKS, env__max_episode_steps=EPISODE_STEPS)
  spec = resolve(cfg)
  run_env = evaluation.RunEnv.of_spec(spec)
  runner = evaluation.HostRunner(TASKS, 4, evaluation.HELD_OUT_SEED, run_env)
  policy = make_policy("mlp", runner.spec, spec.policy)
  params = policy.init(jax.random.PRNGKey(3))
  out = tmp_path / "sft"
  warm_start.save_params(str(out), params)
  (out / "sft.json").write_text(json.dumps({"policy": "mlp", "steps": 1, "config": spec.config}))
  proc = _launch_eval(f"--checkpoint={out}", "--episodes=4", "--actions=mean", f"--out={tmp_path / 'eval.json'}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result == json.loads((tmp_path / "eval.json").read_text())
  assert result["source"] == "sft" and result["actions"] == "mean" and result["checkpoint_env_steps"] is None
  assert result["env"] == result["trained_on"] == TASKS and result["episodes"] == 4
  expected = runner.run(policy, params, "mean")
  for key in ("success_rate", "success_ci95", "success_rate_by_task", "success_ci95_by_task"):
    assert result[key] == expected[key], key
  assert result["episode_return"] == pytest.approx(expected["episode_return"])
  assert set(result["success_ci95_by_task"]) == {"Reach-v3", "Push-v3"}

  # An sft.json without the run config, and a directory that is neither kind: one line each.
  (out / "sft.json").write_text(json.dumps({"policy": "mlp"}))
  with pytest.raises(UserError, match="sft.json holds no run config"):
    evaluation.evaluate_run(str(out), episodes=2)
  with pytest.raises(UserError, match=r"is not a run workdir \(no config.json\) nor a launch.sft --out directory"):
    evaluation.evaluate_run(str(tmp_path), episodes=2)


# ----------------------------------------------------------------------------- a fine-tuning run


def test_a_runs_evaluation_reports_both_modes_and_launch_eval_repeats_it(tmp_path):
  """eval_episodes > 0: summary.json's success_before / success_after hold both modes with their
  intervals (start_eval / final_eval stay the sampled ones). launch.eval's default seed is the
  run's held-out one, so evaluating the final checkpoint with mean actions gives the run's own
  final mean evaluation, twice alike."""
  cfg = tiny_config(64, eval_episodes=2, env__max_episode_steps=EPISODE_STEPS)
  _, summary = run_to_end(cfg, tmp_path / "run")
  for when in ("success_before", "success_after"):
    assert set(summary[when]) == {"mean", "sample"}, summary[when]
    for figures in summary[when].values():
      assert set(figures) == {"success_rate", "success_ci95"}, figures
      low, high = figures["success_ci95"]
      assert low <= figures["success_rate"] <= high
  assert summary["success_before"]["sample"]["success_rate"] == summary["start_eval"]["success_rate"]
  assert summary["final_eval"]["actions"] == "sample" and summary["final_eval"]["episodes"] == 2
  assert json.loads((tmp_path / "run" / "summary.json").read_text())["success_after"] == summary["success_after"]

  first = evaluation.evaluate_run(str(tmp_path / "run"), episodes=2, actions="mean")
  again = evaluation.evaluate_run(str(tmp_path / "run"), episodes=2, actions="mean")
  assert first == again
  assert first["source"] == "train" and first["actions"] == "mean" and first["checkpoint_env_steps"] == 64
  assert first["success_rate"] == summary["success_after"]["mean"]["success_rate"]
  sampled = evaluation.evaluate_run(str(tmp_path / "run"), episodes=2)
  assert sampled["episode_return"] == pytest.approx(summary["final_eval"]["episode_return"])
  assert sampled["episode_return"] != first["episode_return"]


@pytest.mark.slow  # An MJX compile (about a minute on 2 cores); the host runner's modes run by default above.
def test_device_runner_acts_with_mean_actions():
  from policies import make_policy  # pylint: disable=g-import-not-at-top
  runner = evaluation.make_runner("mjx:CartpoleBalance", 2, 0, evaluation.RunEnv(max_episode_steps=EPISODE_STEPS))
  cfg = get_config().policy
  cfg.hidden = (8,)
  policy = make_policy("mlp", runner.spec, cfg)
  params = policy.init(jax.random.PRNGKey(0))
  mean, again, sampled = (runner.run(policy, params, mode) for mode in ("mean", "mean", "sample"))
  assert mean == again and mean["actions"] == "mean" and sampled["actions"] == "sample"
  assert mean["episode_return"] != sampled["episode_return"]
