"""launch.demos: the experts of all 50 tasks, deterministic recordings that replay, one-line errors.

Recordings here are tiny (two tasks, two envs each, episodes cut to a few dozen steps): what they
check does not depend on the length of an episode.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from ebrl.demos import MANIFEST, open_demos
from ebrl.demos import format as fmt
from ebrl.demos.experts import ExpertActor, expert_classes, metaworld_name
from ebrl.demos.recorder import RecordRequest, check, record
from ebrl.errors import UserError
from sim_adapters import make_adapter
from sim_adapters.base import gather_all
from sim_adapters.tasks import MT50

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TWO = "MetaWorld/MT:Reach-v3,Push-v3"


def _files(directory: str) -> dict[str, bytes]:
  out = {}
  for dirpath, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(dirpath, name)
      out[os.path.relpath(path, directory)] = open(path, "rb").read()
  return out


def test_every_task_has_its_expert_named_after_its_file():
  classes = expert_classes(MT50)
  assert len(classes) == 50 and len(set(classes.values())) == 50
  assert classes["PegInsertSide-v3"].__name__ == "SawyerPegInsertionSideV3Policy"
  assert metaworld_name("ButtonPressTopdownWall-v3") == "button-press-topdown-wall-v3"
  for task, cls in classes.items():
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__[:-len("Policy")]).lower()
    assert cls.__module__ == f"metaworld.policies.{snake}_policy", (task, cls)
  with pytest.raises(UserError, match="no expert for task 'Bogus-v3'"):
    expert_classes(["Bogus-v3"])


def test_the_experts_act_per_row_on_the_adapters_goal_observable_state(make):
  env = make(TWO, 2, seed=0)
  env.reset()
  b = gather_all(env, 2)
  actor = ExpertActor(["Reach-v3", "Push-v3"])
  acts = actor.act(b.obs["state"], env.task_ids)
  assert acts.shape == (2, 4) and acts.dtype == np.float32
  np.testing.assert_array_equal(acts[1], actor.experts[1].get_action(b.obs["state"][1].astype(np.float64)))
  # Goal-observable: the last three state values are the goal the expert moves to.
  assert np.abs(b.obs["state"][:, -3:]).sum() > 0


def _request(out, **kw) -> RecordRequest:
  base = dict(env=TWO, episodes_per_task=4, out=str(out), envs_per_task=2, max_episode_steps=30,
              action_noise=0.2, keep_failed=True, episodes_per_shard=3)
  return RecordRequest(**{**base, **kw})


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
  """A recording that keeps every episode: two rounds of two envs per task, with action noise."""
  req = _request(tmp_path_factory.mktemp("demos") / "a")
  return req, record(req, progress=False)


def test_a_recording_is_the_same_bytes_for_a_seed(noisy, tmp_path):
  req, _ = noisy
  again = record(dataclasses.replace(req, out=str(tmp_path / "b")), progress=False)
  first, second = _files(req.out), _files(str(tmp_path / "b"))
  assert sorted(first) == [MANIFEST, fmt.shard_name(0), fmt.shard_name(1), fmt.shard_name(2)]
  assert first == second
  assert again.env_steps == 4 * (30 + 1 + 30)  # 4 envs: an episode, the reset row, an episode.
  other = record(dataclasses.replace(req, out=str(tmp_path / "c"), seed=1), progress=False)
  assert other.manifest["by_task"] and _files(str(tmp_path / "c"))[fmt.shard_name(0)] != first[fmt.shard_name(0)]


def test_the_manifest_describes_what_the_shards_hold(noisy):
  req, result = noisy
  m = json.load(open(os.path.join(req.out, MANIFEST)))
  assert m == result.manifest
  assert m["observation"] == {"state": {"shape": [39], "dtype": "float32"}, "task": {"shape": [2], "dtype": "float32"}}
  assert m["tasks"] == ["Reach-v3", "Push-v3"] and m["instructions"][1] == "push the puck to the goal"
  assert m["expert"]["policies"] == {"Reach-v3": "SawyerReachV3Policy", "Push-v3": "SawyerPushV3Policy"}
  assert m["expert"]["version"] == "3.0.0" and m["kept"] == "all" and m["max_episode_steps"] == 30
  assert (m["episodes"], m["steps"]) == (8, 240) and [s["episodes"] for s in m["shards"]] == [3, 3, 2]
  demos = open_demos(req.out)
  episodes = list(demos.episodes())
  assert sorted((e.task, e.index) for e in episodes) == [(k, i) for k in (0, 1) for i in range(4)]
  for e in episodes:
    assert e.length == 30 and e.obs["state"].shape == (30, 39) and e.obs["task"][0, e.task] == 1
    assert e.succeeded == bool(e.success.max() > 0)
    assert np.all(np.abs(e.actions) <= 1) and not np.array_equal(e.actions, e.expert_actions)  # Noise.
  for k, task in enumerate(m["tasks"]):
    row = m["by_task"][task]
    assert row["successes"] == sum(e.succeeded for e in episodes if e.task == k)
    assert row["expert_success"] == row["successes"] / 4


def test_a_recorded_episode_replays_to_the_same_observations(noisy):
  """The env rebuilt from the recording's seed, fed the recorded actions env by env, returns the
  recorded observations, rewards and success; the reset row between episodes is none of them."""
  req, _ = noisy
  demos = open_demos(req.out)
  n = 4
  by_env = {i: sorted((e for e in demos.episodes() if e.env == i), key=lambda e: e.index) for i in range(n)}
  env = make_adapter(req.env, n, seed=req.seed, max_episode_steps=req.max_episode_steps)
  try:
    env.reset()
    b = gather_all(env, n)
    for r in range(2):
      eps = [by_env[i][r] for i in range(n)]
      for i, e in enumerate(eps):
        for key in ("state", "task"):
          np.testing.assert_array_equal(b.obs[key][i], e.obs[key][0])
      for t in range(30):
        b = env.step(np.stack([e.actions[t] for e in eps]))
        assert not b.reset_step.any() and b.done.all() == (t == 29)
        for i, e in enumerate(eps):
          want = e.obs["state"][t + 1] if t < 29 else e.final_obs["state"]
          np.testing.assert_array_equal(b.obs["state"][i], want)
          assert b.reward[i] == e.rewards[t] and b.success[i] == e.success[t]
      b = env.step(np.zeros((n, 4), np.float32))  # The automatic reset: the next episode's first row.
      assert b.reset_step.all()
  finally:
    env.close()


def test_only_successful_episodes_are_kept_and_a_failing_task_is_listed(tmp_path):
  """In 50 steps the Reach expert succeeds and the Push expert cannot: Push stays in the manifest
  with its success (0.0) and no episode."""
  req = _request(tmp_path / "d", max_episode_steps=50, action_noise=0.0, keep_failed=False)
  m = record(req, progress=False).manifest
  assert m["by_task"]["Reach-v3"] == dict(episodes=4, successes=4, expert_success=1.0, kept=4, steps=200)
  assert m["by_task"]["Push-v3"] == dict(episodes=4, successes=0, expert_success=0.0, kept=0, steps=0)
  assert m["kept"] == "successful"
  demos = open_demos(req.out)
  assert demos.tasks == ["Reach-v3", "Push-v3"] and demos.expert_success()["Push-v3"] == 0.0
  assert {e.task for e in demos.episodes()} == {0} and all(e.succeeded for e in demos.episodes())
  # --overwrite replaces the demos (and only demos).
  m2 = record(dataclasses.replace(req, max_episode_steps=20, overwrite=True), progress=False).manifest
  assert m2["episodes"] == 0 and m2["shards"] == [] and sorted(os.listdir(req.out)) == [MANIFEST, fmt.SHARD_DIR]
  assert list(open_demos(req.out).episodes()) == []


@pytest.mark.egl
def test_pixels_come_from_the_render_stage_beside_the_state(tmp_path):
  req = RecordRequest(env="MetaWorld/Reach-v3", episodes_per_task=1, out=str(tmp_path / "px"), max_episode_steps=5,
                      from_pixels=True, render_size=16, keep_failed=True)
  m = record(req, progress=False).manifest
  assert m["observation"]["pixels"] == {"shape": [3, 16, 16], "dtype": "uint8"} and "task" not in m["observation"]
  (e,) = open_demos(req.out).episodes()
  assert e.obs["pixels"].shape == (5, 3, 16, 16) and e.obs["pixels"].dtype == np.uint8
  assert e.final_obs["pixels"].shape == (3, 16, 16) and len(np.unique(e.obs["pixels"])) > 10


@pytest.mark.parametrize("changes,expected", [
    (dict(env="MetaWorld/MT:Reach-v3,Bogus-v3"), "unknown MetaWorld task 'Bogus-v3'"),
    (dict(env="CartpoleBalance-v1"), "--env='CartpoleBalance-v1' is not a MetaWorld env the experts can record"),
    (dict(env="MetaWorld/Reach-v2"), "closest: MetaWorld/Reach-v3"),
    (dict(episodes_per_task=0), "--episodes_per_task=0 must be positive"),
    (dict(envs_per_task=-1), "--envs_per_task=-1 must be >= 0"),
    (dict(action_noise=float("nan")), "--action_noise=nan must be a finite std >= 0"),
    (dict(seed=-1), "--seed=-1 must be an integer in [0, "),
    (dict(from_pixels=True), "record pixels per task (--env=MetaWorld/<Task>-v3)"),
    (dict(out=""), "--out is required"),
    (dict(out="/proc/ebrl-demos"), "out '/proc/ebrl-demos' is not writable"),
])
def test_bad_requests_are_one_line_before_any_env(tmp_path, changes, expected):
  with pytest.raises(UserError) as e:
    check(_request(changes.pop("out", tmp_path / "out"), **changes))
  assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_used_out_directory_needs_overwrite_and_overwrite_never_deletes_other_files(tmp_path):
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / MANIFEST).write_text("{}")
  with pytest.raises(UserError, match="is not empty; choose a new directory, or pass --overwrite"):
    check(_request(tmp_path / "out"))
  check(_request(tmp_path / "out", overwrite=True))
  (tmp_path / "out" / "notes.txt").write_text("mine")
  with pytest.raises(UserError, match=r"holds files that are not demos \(notes.txt\)"):
    check(_request(tmp_path / "out", overwrite=True))


def _cli(args: list[str], cwd: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": ROOT}
  return subprocess.run([sys.executable, "-m", "launch.demos", *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=120)


@pytest.mark.parametrize("args,expected", [
    (["--env=MetaWorld/MT:Reach-v3,Bogus-v3"], "unknown MetaWorld task 'Bogus-v3'"),
    (["--episodes_per_task=0"], "--episodes_per_task=0 must be positive"),
    (["--out=launch"], "--out='launch' is not empty"),
])
def test_the_launcher_reports_bad_flags_in_one_line_with_exit_2(args, expected):
  proc = _cli(["--out=/tmp/never-written-demos", *args], ROOT)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
  assert expected in lines[0] and "Traceback" not in proc.stderr
  assert not os.path.exists("/tmp/never-written-demos")


def test_the_launcher_records_and_prints_the_expert_table(tmp_path):
  proc = _cli(["--env=MetaWorld/Reach-v3", "--episodes_per_task=2", "--max_episode_steps=50",
               f"--out={tmp_path / 'demos'}", "--quiet"], ROOT)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert re.search(r"Reach-v3\s+1\.00\s+2\s+2", proc.stdout), proc.stdout
  assert "2 kept (100 steps) in 1 shard(s)" in proc.stdout
  assert open_demos(str(tmp_path / "demos")).num_episodes == 2
