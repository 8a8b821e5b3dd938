"""Builds the wheel set a lent GPU machine needs, within the 64 MiB that may travel with the tree.

  python -m launch.gpu_wheels --out=.whl          # download (PyPI), slim, write, report sizes
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site   # there

The GPU machine has no network and its own Python 3.12 with a CUDA JAX and most
of the numeric stack (flax, optax, orbax, chex, absl, tqdm, matplotlib,
tensorboard, scipy, tensorstore, ...): only what it lacks travels (WHEELS,
versions from requirements.txt so both machines run the same code). As
published those wheels are about 110 MB and the MJX stack's assets packages
hundreds more, so each is repacked without what no EBRL run on that machine
touches: EnvPool's env families other than the MuJoCo ports it benches, MuJoCo's
viewer and studio, MJX's test data, Playground's terrain textures, and of the
asset packages only the model files the runs open (ASSET_KEEP: found by
tracing the runs' `openat` calls). A repacked wheel keeps its name and its
RECORD lists exactly the files it holds.
"""

from __future__ import annotations

import os
import re

from absl import flags

from ebrl.errors import UserError
from launch import common
from launch.wheelset import build

_OUT = flags.DEFINE_string("out", ".whl", "Directory for the wheel set (created; must be empty or absent).")
_PYTHON = flags.DEFINE_string("python_version", "3.12", "The GPU machine's Python (major.minor).")
_LIMIT_MIB = flags.DEFINE_float("limit_mib", 56.0, "Most the set may weigh (the tree travels beside it).")


def main(argv):
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; gpu_wheels takes flags only")
  out = os.path.abspath(_OUT.value)
  if os.path.isdir(out) and os.listdir(out):
    raise UserError(f"--out={_OUT.value} is not empty; pass a new directory (the set is built whole)")
  if not re.fullmatch(r"3\.\d+", _PYTHON.value):
    raise UserError(f"--python_version={_PYTHON.value!r} must look like 3.12")
  sizes = build(out, _PYTHON.value)
  total = sum(sizes.values()) / 2**20
  print(f"[gpu_wheels] {len(sizes)} wheels, {total:.1f} MiB in {out}")
  if total > _LIMIT_MIB.value:
    raise UserError(f"the set weighs {total:.1f} MiB, over --limit_mib={_LIMIT_MIB.value}")


if __name__ == "__main__":
  common.run(main)
