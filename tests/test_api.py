"""The Python API (ebrl.train and friends): what the CLI does, without absl flags.

A notebook user must get the same run, the same summary fields and the same
one-line errors as `python -m launch.train`; those are compared against the
CLI itself here, not against a copy of its messages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import ebrl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = {"num_envs": 8, "rollout_length": 16, "algorithm.num_minibatches": 2, "algorithm.epochs": 1,
        "total_env_steps": 256, "policy.hidden": (16, 16)}


def _cli(args: list[str], cwd: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": ROOT}
  return subprocess.run([sys.executable, "-m", "launch.train", "--progress=false", *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=600)


def _flags(overrides: dict) -> list[str]:
  fmt = lambda v: ",".join(map(str, v)) if isinstance(v, tuple) else str(v)
  return [f"--config.{k}={fmt(v)}" if not isinstance(v, tuple) else f"--config.{k}=({fmt(v)},)"
          for k, v in overrides.items()]


def test_api_run_has_the_cli_summary_fields_and_its_outputs(tmp_path):
  proc = _cli([*_flags(TINY), f"--workdir={tmp_path / 'cli'}"], str(tmp_path))
  assert proc.returncode == 0, proc.stderr[-2000:]
  cli = json.loads((tmp_path / "cli" / "summary.json").read_text())
  summary = ebrl.train(overrides=TINY, workdir=str(tmp_path / "api"), progress=False, log=lambda m: None)
  assert set(summary) == set(cli)
  assert summary["env_steps"] == cli["env_steps"] == 256 and summary["policy_version"] == cli["policy_version"]
  assert dict(summary) == json.loads((tmp_path / "api" / "summary.json").read_text())
  for name in ("config", "summary", "metrics", "checkpoints", "trace", "learning_curve", "timeline"):
    assert os.path.exists(summary.paths[name]), name
  assert summary.workdir == str(tmp_path / "api")


@pytest.mark.parametrize("overrides", [{"env.nmae": "x"}, {"num_envs": -3}, {"scheduler": "fastest"}])
def test_bad_input_raises_the_cli_message(overrides, tmp_path):
  proc = _cli(_flags(overrides) + [f"--workdir={tmp_path / 'cli'}"], str(tmp_path))
  assert proc.returncode == 2
  cli_line = proc.stderr.strip().splitlines()[-1]
  with pytest.raises(ebrl.UserError) as e:
    ebrl.train(overrides=overrides, workdir=str(tmp_path / "api"), progress=False, log=lambda m: None)
  assert cli_line == f"error: {e.value}"
  assert not (tmp_path / "api").exists()  # Nothing built before the error.


def test_configs_merge_onto_the_default_and_unknown_keys_are_refused():
  cfg = ebrl.make_config({"env": {"name": "CartpoleBalance-v1"}}, overrides={"num_envs": 16})
  assert cfg.env.name == "CartpoleBalance-v1" and cfg.num_envs == 16
  assert cfg.algorithm.learning_rate == ebrl.default_config().algorithm.learning_rate
  typo = ebrl.default_config()
  typo.algorithm.learnig_rate = 1e-3  # A ConfigDict takes a new key silently; the API does not.
  with pytest.raises(ebrl.UserError, match="unknown config key: 'learnig_rate' Did you mean \"learning_rate\""):
    ebrl.make_config(typo)
  with pytest.raises(ebrl.UserError, match="resume=True continues the run in its workdir"):
    ebrl.train(overrides={"resume": True})
