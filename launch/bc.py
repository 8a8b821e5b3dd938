"""The old name of launch.sft: supervised pre-training on a demo directory, the same flags and outputs.

  python -m launch.bc --demos=demos/reach --out=runs/sft --config.env.name=MetaWorld/Reach-v3

launch/sft.py documents the flags; `ebrl-bc` is `ebrl-sft`.
"""

from __future__ import annotations

from launch.sft import cli, main  # pylint: disable=unused-import

if __name__ == "__main__":
  cli()
