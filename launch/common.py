"""Shared launcher plumbing: one-line errors with exit code 2, no tracebacks.

absl's own flag parser prints usage and exits 1 on a bad flag; users of these
launchers get a single line naming the bad value and exit code 2 instead, for
flag errors, config files that cannot be loaded, and every UserError raised
while the run is set up. A stage process that dies (StageProcessError) is
one line too, with exit code 1: it is no mistake of the user's. `check_output_file`
proves an output path writable before the work whose results it will hold.
"""

from __future__ import annotations

import ast
import os
import sys
from typing import Callable

from absl import app, flags, logging

from ebrl.errors import StageProcessError, UserError, one_line
from ebrl.runtime import enable_compilation_cache, limit_xla_threads, machine_info  # pylint: disable=unused-import

DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "configs", "default.py")
_CONFIG_FLAGS: list[str] = []  # Names of the config-file flags define_config made, checked before parsing.


def fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def define_config(name: str = "config", default: str | None = None, help_text: str = "Run config file."):
  """config_flags.DEFINE_config_file, with a mistyped override key as a one-line error.

  config_flags resolves --config.<key> overrides while the flag is defined (at
  import), so an unknown key raises there rather than in the flag parser.
  """
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  default = default or DEFAULT_CONFIG
  _CONFIG_FLAGS.append(name)
  try:
    return config_flags.DEFINE_config_file(name, default, help_text)
  except (KeyError, AttributeError) as e:
    fail(f"unknown config key: {one_line(e)}")


def config_value(holder):
  """The parsed config, or a one-line error when its file cannot be loaded."""
  cfg = holder.value
  try:
    cfg.keys()  # config_flags defers a load failure to the first attribute access.
  except OSError as e:
    first = str(e).splitlines()
    missing = next((l.strip() for l in first if "Errno" in l), first[0] if first else "")
    fail(f"cannot load --{holder.name}: {missing}")
  return cfg


def flag_values(argv: list[str], name: str) -> list[str]:
  """Every value argv gives --name, as `--name=v` or `--name v` (absl keeps the last)."""
  values = []
  for i, arg in enumerate(argv[1:], start=1):
    if arg == "--":
      break
    for dashes in ("--", "-"):
      if arg.startswith(f"{dashes}{name}="):
        values.append(arg[len(dashes) + len(name) + 1:])
      elif arg == f"{dashes}{name}" and i + 1 < len(argv):
        values.append(argv[i + 1])
  return values


def _binds(tree: ast.Module, name: str) -> bool:
  """Whether a module could define `name` (a def, an assignment, an import, or a star import)."""
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
      return True
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
      return True
    if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
        a.name == "*" or (a.asname or a.name.split(".")[-1]) == name for a in node.names):
      return True
  return False


def check_config_file(flag: str, value: str) -> None:
  """UserError unless `value` names a readable Python file that defines get_config().

  config_flags loads the file while it applies the --<flag>.<key> overrides and
  lets a missing file or a syntax error escape as a traceback; reading and
  parsing it first (without running it) turns each into one line.
  """
  path = value.split(":", 1)[0]  # config_flags passes what follows a colon to get_config.
  shown = f"--{flag}={value}"
  hint = "give a Python config file with a get_config(), such as launch/configs/default.py"
  if not path:
    raise UserError(f"{shown} names no file; {hint}")
  if not os.path.exists(path):
    raise UserError(f"cannot load {shown}: no such file; {hint}")
  if os.path.isdir(path):
    raise UserError(f"cannot load {shown}: it is a directory; {hint}")
  try:
    with open(path, "rb") as f:
      source = f.read()
  except OSError as e:
    raise UserError(f"cannot load {shown}: {(e.strerror or str(e)).lower()}") from None
  try:
    tree = ast.parse(source, path)
  except SyntaxError as e:
    raise UserError(f"{shown} is not a Python config file (SyntaxError at line {e.lineno}: {e.msg})") from None
  except ValueError:  # Null bytes: a binary file.
    raise UserError(f"{shown} is not a Python config file (binary content); {hint}") from None
  if not _binds(tree, "get_config"):
    raise UserError(f"{shown} defines no get_config(); a config file returns its ConfigDict from get_config()")


def _last_line(text: str) -> str:
  lines = [l.strip() for l in text.splitlines() if l.strip()]
  return lines[-1] if lines else ""


def _config_load_error(argv: list[str], e: Exception) -> str:
  """One line for an error raised while a config file ran (its imports, its get_config)."""
  given = [f"--{n}={v[-1]}" for n in _CONFIG_FLAGS if (v := flag_values(argv, n))]
  source = given[0] if given else "the config file"
  text = str(e)
  if isinstance(e, OSError):
    text = next((l.strip() for l in text.splitlines() if "Errno" in l), _last_line(text))
  elif "Error whilst parsing config file" in text:  # config_flags wraps the trace into the message.
    text = _last_line(text)
  else:
    text = f"{type(e).__name__}: {one_line(e)}"
  return f"cannot load {source}: {text}"


def _check_config_files(argv: list[str]) -> None:
  """The file each config flag names (its last value, as absl takes), before absl loads it."""
  for name in _CONFIG_FLAGS:
    given = flag_values(argv, name)
    if given:
      check_config_file(name, given[-1])


_HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpfull", "--helpshort", "--helpxml")


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    _check_config_files(argv)
  except UserError as e:
    fail(str(e))
  try:
    return flags.FLAGS(argv)
  except SystemExit as e:  # absl ends --help with status 1; asking for help is not a failure.
    if e.code == 1 and any(a.split("=")[0] in _HELP_FLAGS for a in argv[1:]):
      raise SystemExit(0) from None
    raise
  except flags.Error as e:
    fail(str(e).splitlines()[0])
  except (KeyError, AttributeError, ValueError, TypeError) as e:  # Raised by config overrides.
    text = str(e)
    fail(_config_load_error(argv, e) if "Error whilst parsing config file" in text else one_line(e))
  except Exception as e:  # pylint: disable=broad-except  # Raised by the config file's own code.
    fail(_config_load_error(argv, e))
  return []


def check_output_file(flag: str, path: str) -> None:
  """UserError unless `path` can be written (ebrl.workdir.check_output_file), named as --<flag>."""
  from ebrl.workdir import check_output_file as check  # pylint: disable=g-import-not-at-top

  check(f"--{flag}", path)


def run(main: Callable[[list[str]], None]) -> None:
  """app.run with our flag parser and UserError -> one line, exit 2."""
  if os.environ.get("BUILD_WORKING_DIRECTORY"):  # `bazel run` starts us in the runfiles tree;
    os.chdir(os.environ["BUILD_WORKING_DIRECTORY"])  # relative paths mean the user's directory.
  limit_xla_threads()
  if main.__module__ != "__main__":  # A console command (pyproject.toml): its help is the launcher's.
    launcher = sys.modules[main.__module__]
    sys.modules["__main__"].__doc__ = launcher.__doc__
    for flag in flags.FLAGS.flags_by_module_dict().get(main.__module__, []):
      flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)

  def guarded(argv):
    logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO.
    try:
      main(argv)
    except UserError as e:
      fail(str(e))
    except StageProcessError as e:  # A stage process died: not the user's mistake, and no traceback helps.
      print(f"error: {e}", file=sys.stderr)
      sys.exit(1)

  app.run(guarded, flags_parser=_parse_flags)


def define_process_flags() -> None:
  """--coordinator_address, --num_processes, --process_id, --local_device_ids, --connect_timeout_s, --coordinator_bind:
  this process's place in a run over several processes (ebrl/distributed.py)."""
  flags.DEFINE_string("coordinator_address", None, "host:port of process 0's coordination service, the same for "
                      "every process of a run over several processes (launch/multiprocess.py picks one on "
                      "localhost).")
  flags.DEFINE_integer("num_processes", None, "Processes in the run (unset: one, or as a detected cluster says).")
  flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes).")
  flags.DEFINE_list("local_device_ids", None, "This process's devices (indices of the host's), where several "
                    "processes share one host's accelerators.")
  flags.DEFINE_integer("connect_timeout_s", 300, "Seconds to wait for every process to join before giving up.")
  flags.DEFINE_string("coordinator_bind", None, "host:port process 0's coordination service listens on (unset: "
                      "--coordinator_address itself, one interface). '[::]:port' listens on every interface: the "
                      "service is unauthenticated, so anyone who can reach the machine could join the run.")


def check_process_share(cfg) -> None:
  """With --num_processes: a UserError when the run cannot be split over that many processes
  (validation.check_processes), before any process is contacted."""
  f = flags.FLAGS
  if f.num_processes and f.num_processes > 1 and f.process_id is not None and 0 <= f.process_id < f.num_processes:
    from ebrl.validation import check_processes, resolve  # pylint: disable=g-import-not-at-top

    check_processes(resolve(cfg), f.num_processes, f.process_id)


def join_run(max_processes: int | None = None) -> int:
  """Joins the run's other processes as the process flags (or a detected cluster) say, before any
  JAX backend starts; returns the run's process count (1: nothing was joined). A launcher whose
  runs cannot yet span `max_processes` refuses more in one line, before contacting anyone."""
  from ebrl import distributed  # pylint: disable=g-import-not-at-top

  f = flags.FLAGS
  ids = f.local_device_ids
  if ids is not None:
    try:
      ids = tuple(int(i) for i in ids)
    except ValueError:
      raise UserError(f"--local_device_ids={','.join(f.local_device_ids)} must be device indices, "
                      "e.g. --local_device_ids=0,1") from None
  return distributed.initialize(distributed.ProcessIdentity(
      f.coordinator_address, f.num_processes, f.process_id, ids, f.connect_timeout_s, f.coordinator_bind),
      max_processes)
