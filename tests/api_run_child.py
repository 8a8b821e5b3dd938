"""A program launch/multiprocess.py starts in the multi-process run tests: one process of a run over
several, trained through the Python API (`ebrl.train` with the process arguments, as a notebook or a
script of its own would), at the tiny shapes of tests/tiny_configs.py.

  python -m launch.multiprocess --module=api_run_child --num_processes=2 -- <workdir> <scheduler> <env steps>
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
  parser = argparse.ArgumentParser()
  for name in ("--coordinator_address", "--num_processes", "--process_id"):
    parser.add_argument(name)
  parser.add_argument("workdir")
  parser.add_argument("scheduler")
  parser.add_argument("total_env_steps", type=int)
  args = parser.parse_args()
  import ebrl  # pylint: disable=g-import-not-at-top
  from tiny_configs import tiny_config  # pylint: disable=g-import-not-at-top

  cfg = tiny_config(args.total_env_steps, scheduler=args.scheduler)
  summary = ebrl.train(cfg, args.workdir, progress=False, log=lambda m: None,
                       coordinator_address=args.coordinator_address, num_processes=int(args.num_processes),
                       process_id=int(args.process_id))
  print(f"process {args.process_id}: {summary['env_steps']} env steps", flush=True)


if __name__ == "__main__":
  main()
