"""MPS SM split against time-sharing on one GPU: gen and train stage processes side by side.

  python -m launch.mps_bench --seconds=10 --splits=25,50,75 --out=mps_bench.json

Two stage processes share GPU 0: `gen` (a jitted MLP forward on observations
copied from the host, actions copied back, as the sampler does) and `train` (a
jitted adam step on the same MLP with its batch on the device, as the learner
does). Modes, in turn:

  alone      each worker by itself: the rates the other modes are normalized to
  timeshare  both at once without MPS: the GPU time-slices between two contexts
  mps:G      both at once as clients of one private MPS daemon, gen capped at G% of
             the SMs and train at 100-G%

Every worker preallocates --mem_fraction of the GPU's memory (a hard cap), compiles
and warms up, reports ready, and opens its timed window when the parent says go,
so concurrent workers are timed over the same seconds. A mode whose normalized
rates sum above 1 got more work done than running the stages by turns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from absl import flags

from launch import common

_WORKER = flags.DEFINE_enum("worker", None, ["gen", "train"], "Run as this stage process (internal).")
_SECONDS = flags.DEFINE_float("seconds", 10.0, "Timed seconds per worker per mode.")
_GEN_BATCH = flags.DEFINE_integer("gen_batch", 4096, "Rows per generation call.")
_TRAIN_BATCH = flags.DEFINE_integer("train_batch", 65536, "Samples per train step.")
_SPLITS = flags.DEFINE_list("splits", ["25", "50", "75"], "Gen's SM percent per MPS mode; train gets the rest.")
_MEM_FRACTION = flags.DEFINE_float("mem_fraction", 0.4, "GPU memory fraction each worker preallocates.")
_OUT = flags.DEFINE_string("out", "mps_bench.json", "Where to write the JSON results.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OBS_DIM, HIDDEN, ACT_DIM = 39, 256, 4
_START_TIMEOUT_S = 300.0  # Import, CUDA context, compile: a worker not timed by then is hung.


def _emit(msg: dict) -> None:
  print(json.dumps(msg), flush=True)


def _worker(role: str) -> None:
  """One stage process: warm up, say ready, wait for go, run --seconds, print its rates."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp
  import numpy as np
  import optax

  if jax.default_backend() != "gpu":
    return _emit({"error": f"{role} worker's JAX backend is {jax.default_backend()}, not gpu"})
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  sizes = (OBS_DIM, HIDDEN, HIDDEN, ACT_DIM)
  params = [(jax.random.normal(k, (a, b)) / np.sqrt(a), jnp.zeros(b)) for k, a, b in zip(keys, sizes, sizes[1:])]

  def mlp(p, x):
    for w, b in p[:-1]:
      x = jnp.tanh(x @ w + b)
    return x @ p[-1][0] + p[-1][1]

  if role == "gen":
    obs = np.random.default_rng(0).standard_normal((_GEN_BATCH.value, OBS_DIM), dtype=np.float32)
    forward = jax.jit(mlp)
    step = lambda: np.asarray(forward(params, obs))  # Host obs in, host actions out.
    rows = _GEN_BATCH.value
  else:
    opt = optax.adam(3e-4)
    x = jax.random.normal(keys[0], (_TRAIN_BATCH.value, OBS_DIM))
    y = jax.random.normal(keys[1], (_TRAIN_BATCH.value, ACT_DIM))

    @jax.jit
    def update(p, s):
      loss, g = jax.value_and_grad(lambda q: jnp.mean((mlp(q, x) - y) ** 2))(p)
      u, s = opt.update(g, s, p)
      return optax.apply_updates(p, u), s, loss

    state = [params, opt.init(params)]

    def step():
      state[0], state[1], loss = update(*state)
      loss.block_until_ready()

    rows = _TRAIN_BATCH.value
  for _ in range(3):
    step()
  device = jax.devices()[0]
  _emit({"ready": True, "device": str(device), "sm_count": getattr(device, "core_count", None)})
  sys.stdin.readline()
  n, t0 = 0, time.perf_counter()
  while time.perf_counter() - t0 < _SECONDS.value:
    step()
    n += 1
  wall = time.perf_counter() - t0
  names = ("calls_per_s", "rows_per_s") if role == "gen" else ("steps_per_s", "samples_per_s")
  _emit({"role": role, "calls": n, "wall_s": wall, names[0]: n / wall, names[1]: n * rows / wall,
         "rows_per_s": n * rows / wall})


def _read(role: str, proc: subprocess.Popen, err_path: str, mode: str) -> dict:
  """The worker's next JSON line, or a one-line error naming why it stopped."""
  from ebrl.errors import UserError  # pylint: disable=g-import-not-at-top

  def last_stderr() -> str:
    with open(err_path) as f:
      return next((l.strip() for l in reversed(f.read().splitlines()) if l.strip()), "")

  for line in proc.stdout:
    if line.startswith("{"):
      msg = json.loads(line)
      if "error" in msg:  # JAX fell back to the CPU: no GPU, or no MPS server for this client.
        why = "; ".join(filter(None, (msg["error"], last_stderr())))
        raise UserError(f"mps_bench needs an NVIDIA GPU with MPS ({mode}: {why})")
      return msg
  raise UserError(f"{role} worker in mode {mode} exited {proc.wait()}: {last_stderr() or 'no message'}")


def _run_mode(mode: str, envs: dict[str, dict], tmp: str) -> dict[str, dict]:
  """Starts one worker per env, times them together, returns their reports."""
  flags_ = [f"--seconds={_SECONDS.value}", f"--gen_batch={_GEN_BATCH.value}", f"--train_batch={_TRAIN_BATCH.value}"]
  procs, errs = {}, {}
  watchdog = threading.Timer(_START_TIMEOUT_S + 2 * _SECONDS.value, lambda: [p.kill() for p in procs.values()])
  watchdog.daemon = True
  try:
    for role, env in envs.items():
      errs[role] = os.path.join(tmp, f"{mode.replace(':', '_')}-{role}.stderr")
      with open(errs[role], "w") as err:
        procs[role] = subprocess.Popen([sys.executable, "-m", "launch.mps_bench", f"--worker={role}", *flags_],
                                       env=env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=err, text=True)
    watchdog.start()
    ready = {role: _read(role, p, errs[role], mode) for role, p in procs.items()}
    for p in procs.values():
      p.stdin.write("go\n")
      p.stdin.flush()
    results = {role: {**_read(role, p, errs[role], mode), "sm_count": ready[role]["sm_count"]}
               for role, p in procs.items()}
    return results
  finally:
    watchdog.cancel()
    for p in procs.values():
      if p.poll() is None:
        p.kill()
      p.wait()


def _parent() -> None:
  import jax  # pylint: disable=g-import-not-at-top

  from ebrl.errors import UserError
  from ebrl.resources import mps
  from ebrl.resources.inventory import take_inventory

  splits = []
  for s in _SPLITS.value:
    if not s.strip().isdigit() or not 1 <= int(s) <= 99:
      raise UserError(f"--splits value '{s}' must be an integer in [1, 99]")
    splits.append(int(s))
  if _SECONDS.value <= 0:
    raise UserError(f"--seconds={_SECONDS.value} must be positive")
  base = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # CUDA's GPU 0 is then NVML's GPU 0.
  # The parent never opens a GPU context: it would preallocate memory on the GPU under test.
  jax.config.update("jax_platforms", "cpu")
  inv = take_inventory()
  if not inv.gpus or not inv.mps.can_start:
    raise UserError(f"mps_bench needs an NVIDIA GPU with MPS ({inv.mps.reason})")
  try:
    mps.check_split({"gen": 50, "train": 50}, {"gen": _MEM_FRACTION.value, "train": _MEM_FRACTION.value})
  except ValueError as e:
    raise UserError(f"--mem_fraction: {e}") from None
  print("\n".join(inv.summary_lines()), flush=True)
  results = {}
  with tempfile.TemporaryDirectory(prefix="ebrl-mps-bench-") as tmp:
    no_daemon = os.path.join(tmp, "no-mps")  # An empty pipe dir: never joins a system-wide daemon.
    os.mkdir(no_daemon)

    def plain_env() -> dict:
      env = mps.stage_env(100, _MEM_FRACTION.value, no_daemon, base=base, visible_devices=(0,))
      env.pop("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
      return env

    for role in ("gen", "train"):
      print(f"[mps_bench] alone: {role}", flush=True)
      results.setdefault("alone", {}).update(_run_mode("alone", {role: plain_env()}, tmp))
    print("[mps_bench] timeshare", flush=True)
    results["timeshare"] = _run_mode("timeshare", {"gen": plain_env(), "train": plain_env()}, tmp)
    try:
      daemon = mps.MpsDaemon().start()
    except RuntimeError as e:
      raise UserError(f"mps_bench needs an NVIDIA GPU with MPS ({e})") from None
    with daemon:
      for g in splits:
        print(f"[mps_bench] mps: gen {g}% / train {100 - g}% of the SMs", flush=True)
        envs = {role: daemon.stage_env(pct, _MEM_FRACTION.value, base=base, visible_devices=(0,))
                for role, pct in (("gen", g), ("train", 100 - g))}
        results[f"mps:{g}"] = _run_mode(f"mps:{g}", envs, tmp)
  alone = {role: results["alone"][role]["rows_per_s"] for role in ("gen", "train")}
  norm = {mode: {role: r[role]["rows_per_s"] / alone[role] for role in ("gen", "train")} for mode, r in results.items()}
  print(f"\n{'mode':<12}{'gen rows/s':>16}{'train samples/s':>18}{'gen/alone':>11}{'train/alone':>13}{'sum':>7}")
  for mode, r in results.items():
    n = norm[mode]
    total = "-" if mode == "alone" else f"{n['gen'] + n['train']:.3f}"  # Alone runs were not concurrent.
    print(f"{mode:<12}{r['gen']['rows_per_s']:>16,.0f}{r['train']['rows_per_s']:>18,.0f}"
          f"{n['gen']:>11.3f}{n['train']:>13.3f}{total:>7}")
  out = {"machine": inv.to_dict(), "seconds": _SECONDS.value, "gen_batch": _GEN_BATCH.value,
         "train_batch": _TRAIN_BATCH.value, "mem_fraction": _MEM_FRACTION.value, "results": results,
         "normalized": norm}
  with open(_OUT.value, "w") as f:
    json.dump(out, f, indent=2)
  print(f"written {_OUT.value}")


def main(argv: list[str]) -> None:
  del argv
  common.enable_compilation_cache()
  if _WORKER.value:
    _worker(_WORKER.value)
  else:
    _parent()


if __name__ == "__main__":
  common.run(main)
