"""The parts of the GPU benchmark (launch/gpu_bench.py is its command line; no flags here, so
tests import this without a launcher's global flags)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ebrl.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parts(small: bool, seconds: float, gpus: int) -> list[dict]:
  """Every part after the smoke test: name, command arguments, time limit."""
  def bench(env, envs, schedulers, extra=(), limit=150):
    return ["launch.bench", f"--env={env}", f"--num_envs={envs}", f"--schedulers={schedulers}",
            f"--seconds={seconds}", "--warmup_updates=1", *extra], limit
  panda_envs, mt10_envs = (4, 20) if small else (8192, 160)
  rollout = "--config.rollout_length=2" if small else "--config.rollout_length=16"
  out = [("mjx_panda", *bench("mjx:PandaPickCube", panda_envs, "random,sync,ebrl", (rollout,), 240)),
         # Host envs on the CPU cores, the policy on the GPU: the learner beside generation (threads)
         # and in a process of its own (under MPS where it can start: its SM share).
         ("mt10_mlp", *bench("MetaWorld/MT10", mt10_envs, "sync,ebrl",
                             ("--resources=auto", "--placements=threads,processes"), 200)),
         ("mt10_cnn", *bench("MetaWorld/MT10", mt10_envs, "sync,ebrl",
                             ("--policy=cnn", "--config.env.from_pixels=True", rollout,
                              "--placements=threads,processes"), 180))]
  if gpus >= 2:
    out.insert(1, ("mjx_panda_device_split", *bench("mjx:PandaPickCube", panda_envs, "ebrl",
                                                     (rollout, "--config.devices.train=auto",
                                                      "--config.devices.sim=auto"), 240)))
  out.append(("sm_share", ["launch.mps_bench", f"--seconds={seconds}"], 150))
  return [{"name": n, "args": a, "limit_s": l} for n, a, l in out]


def run_part(args: list[str], out_json: str | None, limit_s: float) -> dict:
  """One part as `python -m <args> [--out=out_json]`: its JSON, or its status and last line."""
  cmd = [sys.executable, "-m", *args] + ([f"--out={out_json}"] if out_json else [])
  start = time.perf_counter()
  try:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit_s)
  except subprocess.TimeoutExpired:
    return {"status": "timeout", "limit_s": limit_s, "wall_s": time.perf_counter() - start}
  result = {"status": "ok" if proc.returncode == 0 else f"exit {proc.returncode}",
            "wall_s": round(time.perf_counter() - start, 1)}
  if proc.returncode != 0:
    lines = [l for l in (proc.stderr or proc.stdout).splitlines() if l.strip()]
    result["error"] = lines[-1] if lines else "no output"
  elif out_json and os.path.isfile(out_json):
    with open(out_json) as f:
      result["result"] = json.load(f)
  return result


def smoke(small: bool, tmp: str) -> dict:
  """The fast, fatal first check: platform, simulators, one short ebrl run."""
  import jax  # pylint: disable=g-import-not-at-top

  devices = jax.devices()
  platform = devices[0].platform
  if not small and platform != "gpu":
    raise UserError(f"gpu_bench needs a GPU; JAX sees {platform} ({len(devices)} device(s)); "
                    "use --small to run the small sizes on the CPU")
  from sim_adapters import make_adapter  # pylint: disable=g-import-not-at-top
  from sim_adapters.mjx import make_device_sim

  for name, n in (("MetaWorld/MT10", 10), ("PandaPickCube-v1", 2)):
    adapter = make_adapter(name, n)
    adapter.reset()
    adapter.close()
  make_device_sim("mjx:PandaPickCube", 4)
  train = run_part(["launch.train", f"--workdir={os.path.join(tmp, 'smoke')}", "--config.env.name=MetaWorld/Reach-v3",
                "--config.num_envs=8", "--config.scheduler=ebrl", "--config.rollout_length=8",
                "--config.total_env_steps=2048", "--config.policy.hidden=(32,32)"], None, 120)
  if train["status"] != "ok":
    raise UserError(f"gpu_bench smoke run failed ({train['status']}): {train.get('error', '')}")
  return {"platform": platform, "device_kind": devices[0].device_kind, "devices": len(devices),
          "jax": jax.__version__, "train_wall_s": train["wall_s"]}
