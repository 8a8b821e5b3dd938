"""A program launch/multiprocess.py starts in its tests: it joins the run as every launcher does
(launch.common.join_run), gathers every process's index over the run's collectives, then holds or
fails as told.

  python -m launch.multiprocess --module=multiprocess_child --num_processes=2 -- --hold_s=0
"""

from __future__ import annotations

import os
import sys
import time

from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch import common  # pylint: disable=g-import-not-at-top

common.define_process_flags()
_HOLD_S = flags.DEFINE_float("hold_s", 0.0, "Seconds to wait after the gather.")
_FAIL_CODE = flags.DEFINE_integer("fail_code", 0, "Process 1 exits with this code right after the gather.")


def main(argv: list[str]) -> None:
  del argv
  count = common.join_run()
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  gathered = multihost_utils.process_allgather(jax.numpy.asarray(jax.process_index()))
  print(f"process {jax.process_index()} of {count} gathered {[int(i) for i in gathered]}", flush=True)
  if _FAIL_CODE.value and jax.process_index() == 1:
    os._exit(_FAIL_CODE.value)  # pylint: disable=protected-access  # A crash: no shutdown handshake.
  time.sleep(_HOLD_S.value)


if __name__ == "__main__":
  common.run(main)
