"""launch.bench, launch.profile and launch.eval: every bad flag is one line and exit 2, before any run.

The messages name a value as the Python API's parameter of the same name
(`seconds=nan ...`), so ebrl.bench / ebrl.profile / ebrl.evaluate raise the
very line the CLI prints (tests/cli_api/test_api.py compares the two).

A bad --seconds or --warmup_updates used to hang (the timed window never
opened or closed) and an unwritable --out failed only after every run; each
case here must fail at once, so a hang shows as a timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ebrl.errors import UserError
from launch import common

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNWRITABLE = "/proc/ebrl-nope"  # No directory can be made under /proc, not even by root.

BENCH = {
    "zero_rounds": (["--rounds=0"], "rounds=0 must be an integer >= 1"),
    "unknown_placement": (["--schedulers=sync,ebrl", "--placements=threads,gpu"],
                          "unknown placement 'gpu'; valid: auto, threads, processes"),
    "placements_without_ebrl": (["--placements=processes"], "placements runs the ebrl scheduler under each placement"),
    "no_warmup": (["--warmup_updates=0"], "warmup_updates=0 must be an integer >= 1"),
    "negative_warmup": (["--warmup_updates=-2"], "warmup_updates=-2 must be an integer >= 1"),
    "nan_seconds": (["--seconds=nan"], "seconds=nan must be a finite number > 0"),
    "inf_seconds": (["--seconds=inf"], "seconds=inf must be a finite number > 0"),
    "zero_seconds": (["--seconds=0"], "seconds=0.0 must be a finite number > 0"),
    "zero_envs": (["--num_envs=0"], "num_envs=0 must be a positive integer"),
    "no_schedulers": (["--schedulers="], "schedulers is empty"),
    "scheduler_twice": (["--schedulers=sync,random,sync"], "schedulers names sync more than once"),
    "unknown_scheduler": (["--schedulers=sync,fastest"], "unknown scheduler 'fastest'; valid: sync"),
    "straggler_fraction": (["--straggler_fraction=1.5"], "straggler_fraction=1.5 must be in [0, 1]"),
    "nan_straggler_slowdown": (["--straggler_slowdown=nan"], "straggler_slowdown=nan must be a finite number >= 1"),
    "unwritable_out": ([f"--out={UNWRITABLE}/bench.json"], f"out='{UNWRITABLE}/bench.json' is not writable"),
    "out_is_a_directory": (["--out=launch"], "out='launch' is not writable"),
    "unwritable_timeline": ([f"--timeline={UNWRITABLE}/t.png"], f"timeline='{UNWRITABLE}/t.png' is not writable"),
    "unwritable_workdir": ([f"--workdir={UNWRITABLE}"], f"workdir '{UNWRITABLE}' is not writable"),
    "bad_config_value": (["--config.algorithm.clip_eps=-1"], "algorithm.clip_eps=-1.0 must be a positive"),
    "unknown_env": (["--env=MetaWorld/Reach-v2"], "MetaWorld/Reach-v3"),
    "missing_config_file": (["--config=missing.py", "--config.num_envs=8"],
                            "cannot load --config=missing.py: no such file"),
    "config_not_python": (["--config=README.md"], "--config=README.md is not a Python config file (SyntaxError"),
    "processes_not_counts": (["--processes=1,two"], "--processes=1,two must be process counts, e.g. 1,2"),
    "processes_zero": (["--processes=0,2"], "--processes=0,2 must be process counts >= 1"),
    "processes_indivisible": (["--processes=1,3", "--num_envs=8"],
                              "--num_envs=8 must be divisible by every count in --processes (not 3)"),
    "processes_random": (["--processes=1,2", "--schedulers=random"],
                         "--schedulers=random: over several processes only sync and ebrl run"),
    "processes_nan_seconds": (["--processes=1,2", "--seconds=nan"], "--seconds=nan must be a finite number > 0"),
}

PROFILE = {
    "nan_seconds": (["--seconds=nan"], "seconds=nan must be a finite number > 0"),
    "inf_seconds": (["--seconds=inf"], "seconds=inf must be a finite number > 0"),
    "negative_seconds": (["--seconds=-1"], "seconds=-1.0 must be a finite number > 0"),
    "zero_envs": (["--num_envs=0"], "num_envs=0 must be a positive integer"),
    "unwritable_out": ([f"--out={UNWRITABLE}/profile.json"], f"out='{UNWRITABLE}/profile.json' is not writable"),
    "missing_config_file": (["--config=missing.py", "--config.num_envs=8"],
                            "cannot load --config=missing.py: no such file"),
    "config_not_python": (["--config=README.md"], "--config=README.md is not a Python config file (SyntaxError"),
}

EVAL = {
    "no_checkpoint": ([], "--checkpoint=<run workdir> is required"),
    "zero_episodes": (["--checkpoint=runs/x", "--episodes=0"], "episodes=0 must be a positive integer"),
    "negative_seed": (["--checkpoint=runs/x", "--seed=-1"], "seed=-1 must be an integer in [0, "),
    "not_a_workdir": (["--checkpoint=launch"], "is not a run workdir (no config.json)"),
}


def _one_line_exit_2(module: str, args: list[str], expected: str, cwd: str) -> str:
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, proc.stderr
  assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
  assert "Traceback" not in proc.stderr + proc.stdout
  return proc.stdout


@pytest.mark.parametrize("case", sorted(BENCH))
def test_bench_flag_errors(case, tmp_path):
  args, expected = BENCH[case]
  if not any(a.startswith("--out=") for a in args):
    args = args + [f"--out={tmp_path / 'bench.json'}"]
  stdout = _one_line_exit_2("launch.bench", ["--schedulers=sync", *args], expected, ROOT)
  assert "[bench]" not in stdout  # No scheduler started.
  assert not (tmp_path / "bench.json").exists()


@pytest.mark.parametrize("case", sorted(PROFILE))
def test_profile_flag_errors(case, tmp_path):
  args, expected = PROFILE[case]
  if not any(a.startswith("--out=") for a in args):
    args = args + [f"--out={tmp_path / 'profile.json'}"]
  _one_line_exit_2("launch.profile", args, expected, ROOT)
  assert not (tmp_path / "profile.json").exists()


@pytest.mark.parametrize("case", sorted(EVAL))
def test_eval_flag_errors(case):
  args, expected = EVAL[case]
  _one_line_exit_2("launch.eval", args, expected, ROOT)


def test_eval_checks_out_before_any_episode(tmp_path):
  from launch.configs.default import get_config  # pylint: disable=g-import-not-at-top

  (tmp_path / "config.json").write_text(get_config().to_json())
  _one_line_exit_2("launch.eval", [f"--checkpoint={tmp_path}", f"--out={UNWRITABLE}/eval.json"],
                   f"out='{UNWRITABLE}/eval.json' is not writable", ROOT)


def test_bench_makes_the_out_directory_and_leaves_no_probe(tmp_path):
  """A valid --out in a new directory is made; a later bad flag still stops before any run."""
  out = tmp_path / "new" / "deeper" / "bench.json"
  _one_line_exit_2("launch.bench", ["--schedulers=sync", f"--out={out}", f"--timeline={UNWRITABLE}/t.png"],
                   "timeline=", ROOT)
  assert out.parent.is_dir() and not os.listdir(out.parent)


def test_bench_will_not_run_into_an_earlier_benchs_runs(tmp_path):
  (tmp_path / "runs" / "sync").mkdir(parents=True)
  _one_line_exit_2("launch.bench", ["--schedulers=random,sync", f"--workdir={tmp_path / 'runs'}",
                                    f"--out={tmp_path / 'bench.json'}"], "already holds runs of sync", ROOT)


def test_check_output_file_probes_without_leaving_or_changing_files(tmp_path):
  new = tmp_path / "a" / "b" / "out.json"
  common.check_output_file("out", str(new))
  assert new.parent.is_dir() and not new.exists()
  kept = tmp_path / "kept.json"
  kept.write_text("earlier results")
  common.check_output_file("out", str(kept))
  assert kept.read_text() == "earlier results"
  for bad in (f"{UNWRITABLE}/x.json", str(tmp_path)):
    with pytest.raises(UserError, match="is not writable"):
      common.check_output_file("out", bad)


def test_flag_values_reads_both_spellings():
  argv = ["prog", "--config=a.py", "--config.num_envs=8", "-config", "b.py", "--", "--config=c.py"]
  assert common.flag_values(argv, "config") == ["a.py", "b.py"]


@pytest.mark.parametrize("source, problem", [
    ("def get_config(:\n", "SyntaxError at line 1"),
    ("x = 1\n", "defines no get_config()"),
    ("\0binary", "is not a Python config file"),  # Python 3.11 and 3.12 name null bytes differently.
])
def test_check_config_file_reads_without_running(tmp_path, source, problem):
  path = tmp_path / "cfg.py"
  path.write_text(source + "\nraise SystemExit('ran')\n" if "\0" not in source else source)
  with pytest.raises(UserError, match=problem.replace("(", r"\(").replace(")", r"\)")):
    common.check_config_file("config", str(path))


def test_check_config_file_accepts_the_config_files():
  for name in sorted(os.listdir(os.path.join(ROOT, "launch", "configs"))):
    if name.endswith(".py") and name != "__init__.py":
      common.check_config_file("config", os.path.join(ROOT, "launch", "configs", name))
