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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = {"num_envs": 8, "rollout_length": 16, "algorithm.num_minibatches": 2, "algorithm.epochs": 1,
        "total_env_steps": 256, "policy.hidden": (16, 16)}


def _cli(args: list[str], cwd: str, module: str = "launch.train") -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": ROOT}
  extra = ["--progress=false"] if module == "launch.train" else []
  return subprocess.run([sys.executable, "-m", module, *extra, *args], cwd=cwd, env=env,
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

  # The API's evaluation is launch.eval's, value for value (same checkpoint, seed and episodes).
  proc = _cli([f"--checkpoint={summary.workdir}", "--episodes=3", "--seed=7"], str(tmp_path), "launch.eval")
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = ebrl.evaluate(summary.workdir, episodes=3, seed=7)
  assert result == json.loads(proc.stdout.strip().splitlines()[-1])
  assert result["checkpoint_env_steps"] == 256 and result["episodes"] == 3


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


UNWRITABLE = "/proc/ebrl-nope"

# (launch module, its flags, the API call with the same values): each must fail with the same line.
SAME_ERRORS = {
    "bench_nan_seconds": ("launch.bench", ["--seconds=nan"], lambda: ebrl.bench(seconds=float("nan"))),
    "bench_no_warmup": ("launch.bench", ["--warmup_updates=0"], lambda: ebrl.bench(warmup_updates=0)),
    "bench_unknown_scheduler": ("launch.bench", ["--schedulers=sync,fastest"],
                                lambda: ebrl.bench(schedulers=["sync", "fastest"])),
    "bench_bad_config_value": ("launch.bench", ["--schedulers=sync", "--config.algorithm.clip_eps=-1"],
                               lambda: ebrl.bench(schedulers=["sync"], overrides={"algorithm.clip_eps": -1.0})),
    "bench_unwritable_out": ("launch.bench", [f"--out={UNWRITABLE}/b.json"],
                             lambda: ebrl.bench(out=f"{UNWRITABLE}/b.json")),
    "profile_zero_envs": ("launch.profile", ["--num_envs=0"], lambda: ebrl.profile(num_envs=0)),
    "profile_device_env": ("launch.profile", ["--env=mjx:CartpoleBalance"], lambda: ebrl.profile(env="mjx:CartpoleBalance")),
    "eval_zero_episodes": ("launch.eval", ["--checkpoint=runs/x", "--episodes=0"],
                           lambda: ebrl.evaluate("runs/x", episodes=0)),
    "eval_not_a_workdir": ("launch.eval", ["--checkpoint=launch"], lambda: ebrl.evaluate("launch")),
}


@pytest.mark.parametrize("case", sorted(SAME_ERRORS))
def test_bench_profile_and_evaluate_raise_the_cli_message(case):
  module, args, call = SAME_ERRORS[case]
  proc = _cli(args, ROOT, module)
  assert proc.returncode == 2, proc.stderr[-2000:]
  cli_line = proc.stderr.strip().splitlines()[-1]
  cwd = os.getcwd()
  os.chdir(ROOT)  # Relative paths ("launch") mean the same to both.
  try:
    with pytest.raises(ebrl.UserError) as e:
      call()
  finally:
    os.chdir(cwd)
  assert cli_line == f"error: {e.value}"


def test_api_bench_reports_every_scheduler_and_the_ratio(tmp_path):
  lines = []
  out = ebrl.bench(schedulers=("sync", "ebrl"), seconds=1.0, warmup_updates=2, num_envs=8,
                   overrides={"rollout_length": 16, "algorithm.num_minibatches": 2, "algorithm.epochs": 1,
                              "policy.hidden": (16, 16), "ebrl.num_groups": 2},
                   timeline=str(tmp_path / "t.png"), log=lines.append)
  assert list(out["results"]) == ["sync", "ebrl"]
  for r in out["results"].values():
    assert r["env_steps"] > 0 and r["e2e_env_steps_per_s"] > 0
  ratio = out["results"]["ebrl"]["e2e_env_steps_per_s"] / out["results"]["sync"]["e2e_env_steps_per_s"]
  assert out["ratios"]["ebrl_over_sync"] == pytest.approx(ratio)
  assert (tmp_path / "t.png").stat().st_size > 0
  assert any(l.startswith("ebrl_over_sync = ") for l in lines)
  assert not list(tmp_path.glob("*.json"))  # Without out, no bench.json.


_STOP_SCRIPT = """
import json, os, signal, sys, threading, time
import ebrl

presses, workdir = int(sys.argv[1]), sys.argv[2]

def trained() -> bool:
  try:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      return any(json.loads(l)["env_steps"] > 0 for l in f if l.strip())
  except OSError:
    return False

def press():
  while not trained():  # An update has been logged.
    time.sleep(0.05)
  for _ in range(presses):
    os.kill(os.getpid(), signal.SIGINT)  # What a notebook's stop button sends the kernel.
    time.sleep(0.05)  # Far less than the final checkpoint and plots take.

threading.Thread(target=press, daemon=True).start()
try:
  summary = ebrl.train(overrides=json.loads(sys.argv[3]), workdir=workdir, progress=False)
  print("RETURNED", json.dumps({"env_steps": summary["env_steps"]}))
except KeyboardInterrupt:
  print("KEYBOARDINTERRUPT")
print("HANDLER_RESTORED", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""


@pytest.mark.parametrize("presses", [1, 2])
def test_stop_button_stops_the_run_and_a_second_press_interrupts_without_killing(presses, tmp_path):
  """One press: the run stops at its next update and returns its summary. Two: KeyboardInterrupt
  reaches the caller (as a kernel raises it); the process, a notebook's kernel, lives on."""
  overrides = {**TINY, "total_env_steps": 10**9, "log_every_s": 0.0}
  proc = subprocess.run([sys.executable, "-c", _STOP_SCRIPT, str(presses), str(tmp_path / "run"),
                         json.dumps(overrides)], cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": ROOT},
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]  # No writer thread cut off at exit.
  assert "HANDLER_RESTORED True" in proc.stdout
  if presses == 1:
    steps = json.loads(proc.stdout.split("RETURNED ", 1)[1].splitlines()[0])["env_steps"]
    assert 0 < steps < 10**9
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["env_steps"] == steps
    assert any(d.isdigit() for d in os.listdir(tmp_path / "run" / "checkpoints"))
  else:
    assert "KEYBOARDINTERRUPT" in proc.stdout, proc.stdout[-2000:]
