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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def _imported(module: str, path: str, known: set[str]) -> set[str]:
  """Project modules `module` imports anywhere in its file. Importing a.b.c also runs the package
  a.b's __init__ (and a's), so those count too."""
  is_package = path.endswith("__init__.py")
  tree = ast.parse(open(path).read(), path)
  targets = set()
  for node in ast.walk(tree):
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
  out = set()
  for target in targets:
    parts = target.split(".")
    for i in range(1, len(parts) + 1):
      name = ".".join(parts[:i])
      if name in known and name != module and not module.startswith(name + "."):
        out.add(name)
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
  return {m: _imported(m, path, known) for m, path in modules.items()}


def test_no_import_cycle():
  cycles = _cycles(_graph())
  assert not cycles, "import cycles (imports inside functions included): " + "; ".join(
      " <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("low,high", [
    ("ebrl.layout", "ebrl.validation"),
    ("ebrl.layout", "ebrl.resources.manager"),
    ("ebrl.resources.profiler", "ebrl.trainer"),
    ("ebrl.scheduler.sync", "ebrl.trainer"),
    ("ebrl.scheduler.ebrl", "ebrl.trainer"),
    ("ebrl.scheduler.device_sync", "ebrl.trainer"),
    ("ebrl.scheduler.device_ebrl", "ebrl.trainer"),
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
  assert _cycles(graph) == [["pkg.a", "pkg.b"]]
