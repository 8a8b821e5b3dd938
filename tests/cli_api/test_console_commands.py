"""The console commands pyproject.toml installs: each runs, shows its own flags, exits 0 on --help.

They are the `python -m launch.*` launchers under other names, so a command
whose help lists none of its launcher's flags (absl keys help to the main
module, which for a console command is the installed wrapper) would leave a
user with no way to find them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Command -> a flag its launcher defines, which its --help must show.
COMMANDS = {"ebrl-train": "--workdir", "ebrl-bench": "--schedulers", "ebrl-profile": "--out",
            "ebrl-eval": "--checkpoint", "ebrl-bc": "--eval_episodes", "ebrl-demos": "--episodes_per_task",
            "ebrl-sft": "--eval_episodes", "ebrl-multiprocess": "--num_processes"}


@pytest.mark.parametrize("command,flag", sorted(COMMANDS.items()))
def test_console_command_help(command, flag):
  path = os.path.join(os.path.dirname(sys.executable), command)
  assert os.path.isfile(path), f"{command} is not installed beside {sys.executable} (pip install -e .)"
  proc = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert flag in proc.stdout + proc.stderr


def test_console_command_reports_a_bad_flag_in_one_line():
  proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ebrl-train"), "--nope=1"],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert "nope" in proc.stderr.strip().splitlines()[-1]
