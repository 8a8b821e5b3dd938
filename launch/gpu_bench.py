"""The GPU benchmark in one call, one JSON: what a lent GPU is measured on, in about 8 minutes.

  bash launch/gpu_bench.sh --out=gpu_bench.json           # on the GPU machine
  JAX_PLATFORMS=cpu python -m launch.gpu_bench --small --out=small.json   # the same code paths here

Parts, in order (each a `launch.bench` / `launch.mps_bench` subprocess with its
own time limit, so one failing part is recorded and the rest still run):
  smoke       first, and fatal: the accelerator JAX sees (a GPU unless --small),
              the simulators build, one short ebrl run trains - a broken
              install fails here within a minute, not after eight;
  mjx_panda   mjx:PandaPickCube, 8192 envs: random, sync, ebrl (threads), and
              ebrl with devices.gen/train=auto where there are several GPUs;
  mt10_mlp    EnvPool MetaWorld/MT10 on the CPU cores, the MLP on the GPU:
              sync, ebrl+auto;
  mt10_cnn    the same from pixels with the CNN: sync, ebrl;
  sm_share    generation and update rates against SM share under MPS
              (launch/mps_bench.py), where MPS can run; otherwise why not.
Stage processes (placement=processes) are not implemented yet, so no part
measures them; the JSON says so under "not_measured".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import flags

from ebrl.errors import UserError
from launch import common

_OUT = flags.DEFINE_string("out", "gpu_bench.json", "Where to write the one JSON of every part.")
_SMALL = flags.DEFINE_bool("small", False, "Small sizes and short windows (CPU, a few minutes): the code paths only.")
_SECONDS = flags.DEFINE_float("seconds", 0.0, "Timed seconds per bench entry (0: 20, or 2 with --small).")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parts(small: bool, seconds: float, gpus: int) -> list[dict]:
  """Every part after the smoke test: name, command arguments, time limit."""
  def bench(env, envs, schedulers, extra=(), limit=150):
    return ["launch.bench", f"--env={env}", f"--num_envs={envs}", f"--schedulers={schedulers}",
            f"--seconds={seconds}", "--warmup_updates=1", *extra], limit
  panda_envs, mt10_envs = (4, 20) if small else (8192, 160)
  rollout = "--config.rollout_length=2" if small else "--config.rollout_length=16"
  out = [("mjx_panda", *bench("mjx:PandaPickCube", panda_envs, "random,sync,ebrl", (rollout,), 240)),
         ("mt10_mlp", *bench("MetaWorld/MT10", mt10_envs, "sync,ebrl", ("--resources=auto",))),
         ("mt10_cnn", *bench("MetaWorld/MT10", mt10_envs, "sync,ebrl",
                             ("--policy=cnn", "--config.env.from_pixels=True", rollout)))]
  if gpus >= 2:
    out.insert(1, ("mjx_panda_device_split", *bench("mjx:PandaPickCube", panda_envs, "ebrl",
                                                     (rollout, "--config.devices.train=auto",
                                                      "--config.devices.sim=auto"), 240)))
  out.append(("sm_share", ["launch.mps_bench", f"--seconds={seconds}"], 150))
  return [{"name": n, "args": a, "limit_s": l} for n, a, l in out]


def _run(args: list[str], out_json: str | None, limit_s: float) -> dict:
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
  train = _run(["launch.train", f"--workdir={os.path.join(tmp, 'smoke')}", "--config.env.name=MetaWorld/Reach-v3",
                "--config.num_envs=8", "--config.scheduler=ebrl", "--config.rollout_length=8",
                "--config.total_env_steps=2048", "--config.policy.hidden=(32,32)"], None, 120)
  if train["status"] != "ok":
    raise UserError(f"gpu_bench smoke run failed ({train['status']}): {train.get('error', '')}")
  return {"platform": platform, "device_kind": devices[0].device_kind, "devices": len(devices),
          "jax": jax.__version__, "train_wall_s": train["wall_s"]}


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; gpu_bench takes flags only")
  if _SECONDS.value < 0:
    raise UserError(f"--seconds={_SECONDS.value} must be >= 0 (0: the default for the size)")
  common.check_output_file("out", _OUT.value)
  small = _SMALL.value
  seconds = _SECONDS.value or (2.0 if small else 20.0)
  report = {"small": small, "seconds": seconds, "machine": None, "smoke": None, "parts": {},
            "not_measured": ["ebrl with stage processes (placement=processes: not implemented yet)"]}
  from ebrl import runtime  # pylint: disable=g-import-not-at-top

  report["machine"] = runtime.machine_info()
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    report["smoke"] = smoke(small, tmp)
    print(f"[gpu_bench] smoke ok: {report['smoke']}", flush=True)
    for part in parts(small, seconds, report["smoke"]["devices"] if report["smoke"]["platform"] == "gpu" else 1):
      out_json = os.path.join(tmp, f"{part['name']}.json")
      result = _run(part["args"], out_json, part["limit_s"])
      report["parts"][part["name"]] = {"command": "python -m " + " ".join(part["args"]), **result}
      ratios = result.get("result", {}).get("ratios", {})
      print(f"[gpu_bench] {part['name']}: {result['status']} in {result['wall_s']} s"
            + (f"; {', '.join(f'{k} {v:.3f}' for k, v in ratios.items())}" if ratios else "")
            + (f"; {result['error']}" if "error" in result else ""), flush=True)
  report["wall_s"] = round(time.perf_counter() - start, 1)
  with open(_OUT.value, "w") as f:
    json.dump(report, f, indent=1, default=str)
  print(f"[gpu_bench] written {_OUT.value} ({report['wall_s']} s)")


if __name__ == "__main__":
  common.run(main)
