"""The project's modules form no import cycle, counting imports inside functions.

An import placed inside a function hides a cycle from Python (the module is
already loaded by the time the function runs) but not from a reader, and it
stops a stage from being moved into a process that imports only what it needs.
The layering this keeps: types / layout -> simulators and policies ->
algorithms, learner, sampler, queues -> resources -> schedulers -> trainer ->
launch.
"""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("ebrl", "sim_adapters", "policies", "launch")


def _modules() -> dict[str, str]:
  """Dotted module name -> file, for every module of the project's packages."""
  out = {}
  for package in PACKAGES:
    for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
      for name in files:
        if name.endswith(".py"):
          rel = os.path.relpath(os.path.join(dirpath, name), ROOT)[:-3].replace(os.sep, ".")
          out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dirpath, name)
  return out


def _targets(module: str, path: str, known: set[str], top_level_only: bool = False) -> set[str]:
  """The project modules named by `module`'s import statements (all of them, or only those that
  run when it is imported: not inside a function)."""
  is_package = path.endswith("__init__.py")
  tree = ast.parse(open(path).read(), path)
  nodes = []
  todo = list(tree.body)
  while todo:
    node = todo.pop()
    if top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      continue
    nodes.append(node)
    todo.extend(ast.iter_child_nodes(node))
  targets = set()
  for node in nodes:
    if isinstance(node, ast.Import):
      targets.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # Relative: resolved against this module's package.
        parts = module.split(".")[:len(module.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join(parts + ([base] if base else []))
      for alias in node.names:
        full = f"{base}.{alias.name}"
        targets.add(full if full in known else base)
  return {t for t in targets if t in known or t.split(".")[0] in {k.split(".")[0] for k in known}}


def _imported(module: str, path: str, known: set[str], top_level_only: bool = False) -> set[str]:
  """What `module` depends on: every project module it imports anywhere in its file (functions
  included), and for each, the import-time part ("<pkg>@init") of every package above it, since
  importing a.b.c first runs a's and a.b's __init__ (their top-level code, not their functions)."""
  out = set()
  for target in _targets(module, path, known, top_level_only):
    parts = target.split(".")
    for i in range(1, len(parts) + 1):
      name = ".".join(parts[:i])
      if name not in known or name == module or module.startswith(name + "."):
        continue
      out.add(name if i == len(parts) else name + "@init")
  return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def _graph() -> dict[str, set[str]]:
  modules = _modules()
  known = set(modules)
  graph = {m: _imported(m, path, known) for m, path in modules.items()}
  for m, path in modules.items():  # A package's import-time part: its top-level imports only.
    if path.endswith("__init__.py"):
      graph[m + "@init"] = _imported(m, path, known, top_level_only=True)
  for deps in list(graph.values()):
    for d in deps:
      graph.setdefault(d, set())
  return graph


def test_no_import_cycle():
  cycles = _cycles(_graph())
  assert not cycles, "import cycles (imports inside functions included): " + "; ".join(
      " <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("low,high", [
    ("ebrl.layout", "ebrl.validation"),
    ("ebrl.spec", "ebrl.validation"),
    ("ebrl.spec", "ebrl.resources.manager"),
    ("ebrl.layout", "ebrl.resources.manager"),
    ("ebrl.resources.profiler", "ebrl.trainer"),
    ("ebrl.scheduler.sync", "ebrl.trainer"),
    ("ebrl.scheduler.host_async", "ebrl.trainer"),
    ("ebrl.scheduler.device_sync", "ebrl.trainer"),
    ("ebrl.scheduler.device_async", "ebrl.trainer"),
    ("ebrl.tuning", "ebrl.scheduler.context"),
    ("ebrl.resources.manager", "ebrl.scheduler.context"),
    ("ebrl.scheduler.host_async", "ebrl.driver"),
    ("ebrl.stages", "ebrl.trainer"),
    ("sim_adapters.base", "ebrl.learner"),
    ("policies.base", "ebrl.learner"),
])
def test_layering(low, high):
  """A lower layer never reaches a higher one, directly or through others."""
  graph = _graph()
  seen, todo = set(), [low]
  while todo:
    v = todo.pop()
    for w in graph[v]:
      if w not in seen:
        seen.add(w)
        todo.append(w)
  assert high not in seen, f"{low} reaches {high}"


def test_the_checker_finds_a_hidden_cycle(tmp_path):
  """The graph counts imports inside functions: a cycle made only by one is still found."""
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "__init__.py").write_text("")
  (tmp_path / "pkg" / "a.py").write_text("import pkg.b\n")
  (tmp_path / "pkg" / "b.py").write_text("def f():\n  from pkg import a\n")
  known = {"pkg", "pkg.a", "pkg.b"}
  graph = {m: _imported(m, str(tmp_path / (m.replace(".", "/") + ("/__init__.py" if m == "pkg" else ".py"))), known)
           for m in known}
  graph.setdefault("pkg@init", set())
  assert _cycles(graph) == [["pkg.a", "pkg.b"]]


def _package_graph(tmp_path, init: str) -> dict[str, set[str]]:
  """pkg/__init__ as given; pkg.api uses a module outside the package that uses pkg.core."""
  (tmp_path / "pkg").mkdir(parents=True)
  files = {"pkg": ("pkg/__init__.py", init), "pkg.api": ("pkg/api.py", "import other\n"),
           "pkg.core": ("pkg/core.py", "x = 1\n"), "other": ("other.py", "import pkg.core\n")}
  for rel, text in files.values():
    (tmp_path / rel).write_text(text)
  known = set(files)
  graph = {m: _imported(m, str(tmp_path / rel), known) for m, (rel, _) in files.items()}
  graph["pkg@init"] = _imported("pkg", str(tmp_path / "pkg/__init__.py"), known, top_level_only=True)
  return graph


def test_a_package_facade_that_imports_lazily_is_no_cycle(tmp_path):
  """Importing pkg.core runs pkg/__init__'s top level, not its functions: a facade that imports
  pkg.api on first attribute access (as ebrl/__init__ does) adds no cycle; the same import at
  the top of pkg/__init__ does (other -> pkg@init -> pkg.api -> other)."""
  lazy = _package_graph(tmp_path / "lazy", "def __getattr__(name):\n  from pkg import api\n  return api\n")
  assert "pkg.api" in lazy["pkg"] and "pkg@init" in lazy["other"] and not _cycles(lazy)
  eager = _package_graph(tmp_path / "eager", "from pkg import api\n")
  assert _cycles(eager) == [["other", "pkg.api", "pkg@init"]]
