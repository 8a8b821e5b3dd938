#!/usr/bin/env bash
# GPU benchmark in one call: env steps/s of MJX PandaPickCube (8192 envs on the GPU,
# fused on-device rollout, with the update after it or overlapped with it) beside
# EnvPool's CPU port of the same task (host sims, policy and learner on the GPU),
# each with the simulator alone (random) and with PPO (sync, ebrl).
#
#   bash launch/gpu_bench.sh [OUT_DIR] [SECONDS]
#
# Needs a CUDA jax (jax[cuda12]==0.10.2) in the active environment. Writes
# OUT_DIR/bench_mjx_panda.json, OUT_DIR/bench_envpool_panda.json (and their
# timeline PNGs) and prints both tables; six scheduler runs of SECONDS each plus compiles.
set -euo pipefail
OUT="${1:-${OUT:-bench_gpu}}"
SECONDS_PER="${2:-20}"
mkdir -p "$OUT"
export EBRL_JAX_CACHE="${EBRL_JAX_CACHE:-$OUT/jax_cache}"
python -c 'import jax; d = jax.devices()[0]; assert d.platform == "gpu", d; print("[gpu_bench]", d.device_kind)'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

# MJX on the GPU: the device schedulers (random = the simulator alone, sync = fused PPO,
# ebrl = env groups collecting on the device while the learner trains).
python -m launch.bench --env=mjx:PandaPickCube --num_envs=8192 --schedulers=random,sync,ebrl \
    --seconds="$SECONDS_PER" --warmup_updates=2 --config.rollout_length=16 \
    --out="$OUT/bench_mjx_panda.json"

# EnvPool's CPU port on all host cores, policy and learner on the GPU: sync vs ebrl.
python -m launch.bench --env=PandaPickCube-v1 --num_envs=256 --schedulers=random,sync,ebrl \
    --seconds="$SECONDS_PER" --warmup_updates=2 --config.rollout_length=16 \
    --out="$OUT/bench_envpool_panda.json"

python - "$OUT" <<'PY'
import json, sys
rows = []
for tag in ("mjx", "envpool"):
  d = json.load(open(f"{sys.argv[1]}/bench_{tag}_panda.json"))
  for name, r in d["results"].items():
    rows.append((d["env"], d["num_envs"], name, r["e2e_env_steps_per_s"]))
print("| env | envs | scheduler | env steps/s |\n| --- | --- | --- | --- |")
for env, n, name, rate in rows:
  print(f"| {env} | {n} | {name} | {rate:,.0f} |")
PY
