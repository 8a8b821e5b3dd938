"""The Bazel build agrees with the code: BUILD files, the lock file and the WORKSPACE.

`bazel test //tests:fast` (CI) is the real check of the build; these run in
the default suite so a new import, pin or entry point that the BUILD files do
not follow fails in seconds, with the command that fixes it.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "third_party"))
import bazel_targets  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
  """What the generator writes now (it parses every module once), once for this file."""
  return bazel_targets.build_files()


def _pins(path: str) -> dict[str, str]:
  out = {}
  for line in open(path):
    line = line.split("#", 1)[0].strip()
    if line and not line.startswith("-"):
      name, _, version = line.partition("==")
      out[re.sub(r"[-_.]+", "-", name).lower()] = version
  return out


def test_build_files_are_the_generated_ones(generated):
  stale = [rel for rel, text in generated.items()
           if not os.path.exists(os.path.join(ROOT, rel)) or open(os.path.join(ROOT, rel)).read() != text]
  assert not stale, f"stale BUILD files {stale}: run python third_party/bazel_targets.py"


def test_every_module_and_entry_point_has_a_target(generated):
  files = generated
  for package in bazel_targets.PACKAGES:
    for dirpath, _, names in os.walk(os.path.join(ROOT, package)):
      if "__pycache__" in dirpath:
        continue
      build = files[os.path.join(os.path.relpath(dirpath, ROOT), "BUILD")]
      for name in names:
        if name == "__init__.py":  # The package's `init` target: it and the modules it imports.
          assert 'name = "init",\n    srcs = ["__init__.py"' in build, f"{dirpath}/{name} has no target"
        elif name.endswith(".py"):
          assert f'srcs = ["{name}"]' in build, f"{dirpath}/{name} has no target"
  launch = files[os.path.join("launch", "BUILD")]
  for entry in ("train", "eval", "bench", "profile", "bc", "demos", "sft", "learning_bench", "soak", "mps_bench"):
    assert f'py_binary(\n    name = "{entry}",' in launch, entry
  assert 'name = "fast"' in files[os.path.join("tests", "BUILD")]


def test_init_targets_need_no_cycle(generated):
  """A package whose init imports two of its modules that do not import each other (sim_adapters:
  base and tasks) built a cycle init -> base -> init before: those modules are now the init's own
  sources, and no module target of a package names another of its init's sources."""
  files = generated
  build = files[os.path.join("sim_adapters", "BUILD")]
  assert 'name = "init",\n    srcs = ["__init__.py", "base.py", "tasks.py"]' in build
  for target in ("base", "tasks"):
    rule = build.split(f'name = "{target}",')[1].split(")")[0]
    assert '":base"' not in rule and '":tasks"' not in rule, rule


def test_lock_pins_what_requirements_pin():
  lock = _pins(os.path.join(ROOT, "third_party", "requirements_lock.txt"))
  for req in ("requirements.txt", "requirements-test.txt"):
    for name, version in _pins(os.path.join(ROOT, req)).items():
      assert lock.get(name) == version, (f"{req} pins {name}=={version}, the lock has {lock.get(name)}: "
                                         "run third_party/generate_lock.sh")
  for name in {p for deps in bazel_targets.PIP.values() for p in deps}:
    assert re.sub(r"[-_.]+", "-", name).lower() in lock, f"BUILD files need {name}, which the lock lacks"


def test_workspace_fetches_the_pinned_rules_python_and_overrides_nothing():
  text = open(os.path.join(ROOT, "WORKSPACE")).read()
  assert "https://github.com/bazelbuild/rules_python/releases/download/0.9.0/rules_python-0.9.0.tar.gz" in text
  assert "9acc0944c94f4f48997858bf324551b629dc6bb150f30382ee29f66f7f28e02c" in text
  assert 'workspace(name = "ebrl")' in text
  assert "local_repository" not in text and "/shared/" not in text  # Offline copies only by CI's flags.


@pytest.mark.parametrize("module,expected,expected_pip", [
    ("ebrl.learner", {"//ebrl:types"}, {"jax", "jaxlib", "optax"}),
    ("sim_adapters.envpool_adapter", {"//sim_adapters:base"}, {"envpool", "envpool-assets", "numpy"}),
    ("launch.train", {"//ebrl:api", "//launch:common"}, {"absl-py"}),
    ("ebrl.trainer", {"//ebrl/scheduler", "//ebrl:stages"}, {"tqdm"}),
    ("ebrl.stages", {"//sim_adapters", "//policies"}, {"tqdm"}),  # Factories: APIs.
])
def test_deps_follow_imports(module, expected, expected_pip):
  labels, pip = bazel_targets.Graph().deps(module)
  assert expected <= labels and expected_pip <= pip, (labels, pip)


def test_the_sources_filegroup_names_every_package(generated):
  """//:sources is what test_docs and test_import_graph read under Bazel: a package missing from it
  is invisible there (its modules look unmapped, its paths absent)."""
  text = open(os.path.join(ROOT, "BUILD")).read()
  listed = set(re.findall(r'"//([a-z_/]+):srcs"', text))
  packages = {os.path.dirname(p) for p in generated} - set(bazel_targets.SCRIPT_DIRS)
  assert packages - listed == set(), "add them to //:sources in BUILD"
