"""launch/gpu_bench.py without a GPU: its parts name real flags, and bad input is one line.

The whole script runs on the CPU with --small (about 5 minutes here; BENCHMARKS.md has its
figures): `JAX_PLATFORMS=cpu python -m launch.gpu_bench --small --out=small.json`.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from launch import gpu_suite

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _flag_names(module: str) -> set[str]:
  """The flags a launcher defines, read from its source (two launchers cannot share one process:
  both define --seconds)."""
  tree = ast.parse(open(os.path.join(ROOT, *module.split(".")) + ".py").read())
  names = {"config"}  # common.define_config: --config and its --config.<key> overrides.
  for node in ast.walk(tree):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.startswith("DEFINE_")
        and node.args and isinstance(node.args[0], ast.Constant)):
      names.add(node.args[0].value)
  return names


@pytest.mark.parametrize("small,gpus", [(True, 1), (False, 1), (False, 2)])
def test_every_part_passes_only_flags_its_launcher_defines(small, gpus):
  parts = gpu_suite.parts(small, 2.0, gpus)
  names = [p["name"] for p in parts]
  assert names[0] == "mjx_panda" and names[-1] == "sm_share"
  assert ("mjx_panda_device_split" in names) == (gpus >= 2)
  for part in parts:
    module, *args = part["args"]
    known = _flag_names(module)
    for a in args:
      assert a.startswith("--") and a[2:].split("=")[0].split(".")[0] in known, (part["name"], a)
    assert part["limit_s"] > 0
  panda = next(p for p in parts if p["name"] == "mjx_panda")["args"]
  assert ("--num_envs=8192" in panda) == (not small)


@pytest.mark.parametrize("args,message", [
    (["--seconds=-1"], "--seconds=-1.0 must be >= 0"),
    (["now"], "unexpected arguments ['now']"),
    (["--out=/proc/nope/x.json"], "is not writable"),
])
def test_bad_input_is_one_line_before_anything_runs(args, message):
  proc = subprocess.run([sys.executable, "-m", "launch.gpu_bench", *args], capture_output=True, text=True,
                        timeout=120, cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_without_a_gpu_the_full_size_refuses_in_its_first_seconds(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "launch.gpu_bench", f"--out={tmp_path / 'g.json'}"],
                        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 2 and "gpu_bench needs a GPU; JAX sees cpu" in proc.stderr and "--small" in proc.stderr
  assert not (tmp_path / "g.json").exists()
