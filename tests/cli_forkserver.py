"""Runs `python -m <launcher> <args>` for many cases in forks of one warm process.

A launcher's bad-input errors come from the same code whatever the case, but a
fresh interpreter spends seconds importing JAX, MuJoCo and the training stack
before it reads its first flag. This process imports that stack once (starting
no JAX backend and no thread of its own) and, for each request on stdin
(`{"module", "args", "cwd", "out", "err"}`, one JSON line), forks a child that
runs the launcher as `python -m` would (a fresh `__main__` module, its flags
defined and parsed in the child, stdout and stderr written to the given files)
and answers with its exit code (`{"rc"}`, one JSON line).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback


def _warm() -> None:
  import jax  # pylint: disable=g-import-not-at-top,unused-import
  import ebrl.api  # pylint: disable=g-import-not-at-top,unused-import
  import ebrl.trainer  # pylint: disable=g-import-not-at-top,unused-import
  import ebrl.validation  # pylint: disable=g-import-not-at-top,unused-import
  import sim_adapters  # pylint: disable=g-import-not-at-top,unused-import


def _child(request: dict) -> None:
  """Becomes `python -m <module> <args>` in `cwd`; never returns."""
  code = 1
  try:
    os.chdir(request["cwd"])
    for fd, path in ((1, request["out"]), (2, request["err"])):
      target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
      os.dup2(target, fd)
      os.close(target)
    sys.argv = [request["module"], *request["args"]]
    try:
      runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
      code = 0
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
      if e.code is not None and not isinstance(e.code, int):
        print(e.code, file=sys.stderr)
    except BaseException:  # pylint: disable=broad-except  # As the interpreter would: a traceback, exit 1.
      traceback.print_exc()
      code = 1
  finally:
    try:
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code)  # pylint: disable=protected-access


def main() -> None:
  _warm()
  print(json.dumps({"ready": True}), flush=True)
  for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
      _child(request)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
  main()
