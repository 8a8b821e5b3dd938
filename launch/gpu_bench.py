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
              sync, ebrl+auto with the learner in threads and in a process of
              its own (under MPS where it can start: its SM share);
  mt10_cnn    the same from pixels with the CNN: sync, ebrl threads, processes;
  sm_share    generation and update rates against SM share under MPS
              (launch/mps_bench.py), where MPS can run; otherwise why not.
A learner process serves host envs only (a device simulator's policy acts inside
its scan), so mjx_panda has no processes row; the JSON says so under
"not_measured".
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from absl import flags

from ebrl.errors import UserError
from launch import common
from launch.gpu_suite import parts, run_part, smoke

_OUT = flags.DEFINE_string("out", "gpu_bench.json", "Where to write the one JSON of every part.")
_SMALL = flags.DEFINE_bool("small", False, "Small sizes and short windows (CPU, a few minutes): the code paths only.")
_SECONDS = flags.DEFINE_float("seconds", 0.0, "Timed seconds per bench entry (0: 20, or 2 with --small).")


BUDGET_S = 570.0  # Smoke test and parts; the rest of 10 minutes is the wheel install and start-up.


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; gpu_bench takes flags only")
  if _SECONDS.value < 0:
    raise UserError(f"--seconds={_SECONDS.value} must be >= 0 (0: the default for the size)")
  common.check_output_file("out", _OUT.value)
  small = _SMALL.value
  seconds = _SECONDS.value or (2.0 if small else 15.0)
  report = {"small": small, "seconds": seconds, "machine": None, "smoke": None, "parts": {},
            "not_measured": ["mjx:PandaPickCube with a learner process (placement=processes serves host envs)"]}
  from ebrl import runtime  # pylint: disable=g-import-not-at-top

  report["machine"] = runtime.machine_info()
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    report["smoke"] = smoke(small, tmp)
    print(f"[gpu_bench] smoke ok: {report['smoke']}", flush=True)
    for part in parts(small, seconds, report["smoke"]["devices"] if report["smoke"]["platform"] == "gpu" else 1):
      out_json = os.path.join(tmp, f"{part['name']}.json")
      left = BUDGET_S - (time.perf_counter() - start)  # The whole script ends within 10 minutes.
      if left < 30:
        result = {"status": f"skipped: {BUDGET_S:.0f} s budget spent", "wall_s": 0.0}
      else:
        result = run_part(part["args"], out_json, min(part["limit_s"], left))
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
