"""The demo format without a simulator: byte-stable shards, streaming reads, one-line errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ebrl.demos import FORMAT, FORMAT_VERSION, MANIFEST, DemoFormatError, open_demos
from ebrl.demos import format as fmt
from ebrl.errors import UserError


def _episode(rng, task: int, length: int, index: int) -> dict:
  obs = {"state": rng.normal(size=(length + 1, 5)).astype(np.float32),
         "task": np.tile(np.eye(2, dtype=np.float32)[task], (length + 1, 1))}
  return dict(obs={k: v[:-1] for k, v in obs.items()}, final_obs={k: v[-1] for k, v in obs.items()},
              actions=rng.uniform(-1, 1, (length, 3)).astype(np.float32),
              expert_actions=rng.uniform(-1, 1, (length, 3)).astype(np.float32),
              rewards=rng.normal(size=length).astype(np.float32), success=np.ones(length, np.float32),
              episode_task=task, episode_instruction=task, episode_success=True, episode_return=1.0,
              episode_env=task, episode_index=index)


def _write(directory, episodes_per_shard=(2, 1), seed=0) -> list[dict]:
  """A demo directory of hand-made episodes (lengths 4, 6, 5), as the recorder lays it out."""
  rng = np.random.default_rng(seed)
  episodes = [_episode(rng, 0, 4, 0), _episode(rng, 1, 6, 0), _episode(rng, 0, 5, 1)]
  os.makedirs(directory / fmt.SHARD_DIR, exist_ok=True)
  shards, start = [], 0
  for i, count in enumerate(episodes_per_shard):
    part = episodes[start:start + count]
    start += count
    fmt.write_npz(str(directory / fmt.shard_name(i)), fmt.pack_shard(part))
    shards.append(dict(file=fmt.shard_name(i), episodes=count, steps=sum(len(e["actions"]) for e in part)))
  fmt.write_manifest(str(directory), dict(
      format=FORMAT, version=FORMAT_VERSION, env="MetaWorld/MT:Reach-v3,Push-v3", tasks=["Reach-v3", "Push-v3"],
      instructions=["a", "b"], observation={"state": dict(shape=[5], dtype="float32"),
                                            "task": dict(shape=[2], dtype="float32")},
      action=dict(dim=3, dtype="float32", low=[-1] * 3, high=[1] * 3),
      by_task={"Reach-v3": dict(episodes=2, successes=2, expert_success=1.0, kept=2, steps=9),
               "Push-v3": dict(episodes=1, successes=1, expert_success=1.0, kept=1, steps=6)},
      episodes=3, steps=15, shards=shards))
  return episodes


def test_the_writer_writes_the_same_bytes_for_the_same_arrays(tmp_path):
  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  _write(tmp_path / "a")
  _write(tmp_path / "b")
  for name in (MANIFEST, fmt.shard_name(0), fmt.shard_name(1)):
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
  with np.load(tmp_path / "a" / fmt.shard_name(0)) as data:  # np.load reads it as any .npz.
    assert data["obs/state"].shape == (10, 5) and data["episode_length"].tolist() == [4, 6]


def test_episodes_come_back_whole_and_in_order(tmp_path):
  written = _write(tmp_path)
  demos = open_demos(str(tmp_path))
  assert (demos.num_episodes, demos.num_steps, demos.action_dim) == (3, 15, 3)
  assert demos.obs_spec == {"state": ((5,), np.float32), "task": ((2,), np.float32)}
  assert demos.expert_success() == {"Reach-v3": 1.0, "Push-v3": 1.0}
  read = list(demos.episodes())
  assert [e.length for e in read] == [4, 6, 5] and [e.task for e in read] == [0, 1, 0]
  for want, got in zip(written, read):
    for key in ("state", "task"):
      np.testing.assert_array_equal(got.obs[key], want["obs"][key])
      np.testing.assert_array_equal(got.final_obs[key], want["final_obs"][key])
    np.testing.assert_array_equal(got.actions, want["actions"])
  assert [e.index for e in demos.episodes(tasks=["Reach-v3"])] == [0, 1]
  assert [e.task for e in demos.episodes(tasks=[1])] == [1]
  with pytest.raises(DemoFormatError, match="task 'Bogus-v3' is not in demo directory"):
    list(demos.episodes(tasks=["Bogus-v3"]))


def test_minibatches_cover_every_step_once_per_epoch_with_fixed_sizes(tmp_path):
  written = _write(tmp_path)
  demos = open_demos(str(tmp_path))
  batches = list(demos.minibatches(4, seed=1, drop_last=False))
  assert [len(b["actions"]) for b in batches] == [4, 4, 4, 3]
  got = np.concatenate([b["actions"] for b in batches])
  want = np.concatenate([e["actions"] for e in written])
  assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, want.tolist()))
  # Each row's observation, task and step index stay with its action.
  for b in batches:
    for row in range(len(b["actions"])):
      e = written[[i for i, e in enumerate(written) if (e["actions"] == b["actions"][row]).all(1).any()][0]]
      step = int(b["step"][row])
      np.testing.assert_array_equal(b["obs"]["state"][row], e["obs"]["state"][step])
      assert b["task"][row] == e["episode_task"] == b["instruction"][row]
  assert [len(b["actions"]) for b in demos.minibatches(4, seed=1)] == [4, 4, 4]  # drop_last
  again = [b["actions"] for b in demos.minibatches(4, seed=1)]
  np.testing.assert_array_equal(np.concatenate(again), got[:12])  # The same seed, the same batches.
  assert sum(len(b["actions"]) for b in demos.minibatches(4, tasks=["Push-v3"], drop_last=False)) == 6
  assert len(list(demos.minibatches(5, epochs=2))) == 6


def test_check_spec_names_a_mismatch(tmp_path):
  from sim_adapters.base import EnvSpec, ObsSpec  # pylint: disable=g-import-not-at-top

  _write(tmp_path)
  demos = open_demos(str(tmp_path))
  spec = lambda obs, dim=3: EnvSpec("MetaWorld/MT:Reach-v3,Push-v3", obs, dim, -np.ones(dim), np.ones(dim), 500,
                                    True, 2)
  good = {"state": ObsSpec((5,), np.dtype(np.float32)), "task": ObsSpec((2,), np.dtype(np.float32))}
  demos.check_spec(spec(good))
  with pytest.raises(DemoFormatError, match=r"observe state \(5,\) float32, task \(2,\) float32; env"):
    demos.check_spec(spec({"state": ObsSpec((39,), np.dtype(np.float32))}))
  with pytest.raises(DemoFormatError, match="have 3-dim actions; env .* acts with 4"):
    demos.check_spec(spec(good, 4))


def _bad_manifest(directory, **changes):
  _write(directory)
  path = directory / MANIFEST
  manifest = json.loads(path.read_text())
  manifest.update(changes)
  path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("case,expected", [
    ("missing", "does not exist; record one with python -m launch.demos"),
    ("empty", "is empty; record one with python -m launch.demos"),
    ("no_manifest", "has no manifest.json (not a demo set, or an unfinished recording)"),
    ("other_version", f"is {FORMAT} version 2; this EBRL reads version {FORMAT_VERSION}"),
    ("other_format", "is not an ebrl-demos manifest (format 'something-else')"),
    ("not_json", "is not readable JSON"),
    ("missing_shard", "lacks 1 shard(s) its manifest lists, first shards/00001.npz"),
    ("incomplete", "is incomplete or malformed (KeyError: 'tasks')"),
])
def test_a_directory_that_is_not_a_demo_set_is_one_line(tmp_path, case, expected):
  d = tmp_path / "demos"
  if case != "missing":
    d.mkdir()
  if case == "no_manifest":
    (d / "notes.txt").write_text("x")
  elif case == "other_version":
    _bad_manifest(d, version=2)
  elif case == "other_format":
    _bad_manifest(d, format="something-else")
  elif case == "not_json":
    (d / MANIFEST).write_text("{")
  elif case == "incomplete":
    _write(d)
    manifest = json.loads((d / MANIFEST).read_text())
    del manifest["tasks"]
    (d / MANIFEST).write_text(json.dumps(manifest))
  elif case == "missing_shard":
    _write(d)
    os.remove(d / fmt.shard_name(1))
  with pytest.raises(DemoFormatError) as e:
    open_demos(str(d))
  assert isinstance(e.value, UserError) and "\n" not in str(e.value)
  assert expected in str(e.value), str(e.value)
