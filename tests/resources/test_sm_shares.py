"""The learner process's SM share under MPS: measured at a few shares, chosen by the plan's model,
chosen again when a demand shift re-plans, never over the user's own share."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from ebrl.resources import planner, profiler
from ebrl.resources.inventory import take_inventory
from ebrl.resources.manager import ResourceManager
from ebrl.spec import translate
from launch.configs import default
from test_planner import synthetic


class _ShareLearner:
  """Stands in for a RemoteLearner started at one SM share: updates take 2 ms x 100 / share."""

  def __init__(self, percent: int, log: list):
    self.percent, self.log, self.closed = percent, log, False

  def init(self, key):
    return 0

  def update_segments(self, state, batch):
    time.sleep(0.002 * 100 / self.percent)
    return state + 1, {}

  def close(self):
    self.closed = True
    self.log.append(("closed", self.percent))


class _Sampler:
  def act(self, obs, pad=True):
    time.sleep(0.0005)


def test_measure_sm_shares_times_updates_and_generation_at_every_share():
  log, made = [], []

  def remote_at(percent):
    made.append(_ShareLearner(percent, log))
    log.append(("started", percent))
    return made[-1]

  spec = type("Spec", (), {"obs": {}, "action_dim": 2})()
  points = profiler.measure_sm_shares(_Sampler(), spec, 4, horizon=2, segments=2, seconds=0.1,
                                      remote_at=remote_at, action_width=2, shares=(25, 50, 100))
  assert [p["sm_percent"] for p in points] == [25, 50, 100]
  for p in points:
    assert p["update_s"] == pytest.approx(0.002 * 100 / p["sm_percent"], rel=0.5)
    assert 400 <= p["gen_us"] < 5000  # One 0.5 ms call, timed beside the updates.
  assert points[0]["update_s"] > points[1]["update_s"] > points[2]["update_s"]
  # One learner process at a time, each closed before the next share starts.
  assert log == [("started", 25), ("closed", 25), ("started", 50), ("closed", 50), ("started", 100), ("closed", 100)]


def _profile_with_shares(n: int = 64) -> profiler.Profile:
  """Learner-bound at small shares: its updates scale with the share, generation slows beside it."""
  p = synthetic(n=n, cores=2, train_rate=8e4, gen_call=200.0)
  p.placement = {"batch": n, "alone_us": p.gen_wall_us(n), "threads_us": p.gen_wall_us(n),
                 "processes_us": p.gen_wall_us(n)}
  full = 1000 / 8e4
  p.sm_shares = [{"sm_percent": s, "update_s": full * 100 / s, "gen_us": p.gen_wall_us(n) * (1 + s / 400)}
                 for s in (25, 50, 75, 100)]
  return p


def _manager(tmp_path, prof: profiler.Profile, **quotas) -> ResourceManager:
  path = tmp_path / "profile.json"
  path.write_text(json.dumps({"profile": prof.to_dict()}))
  cfg = default.get_config()
  cfg.env.name, cfg.num_envs, cfg.scheduler, cfg.resources = "MetaWorld/Reach-v3", 64, "ebrl", "auto"
  cfg.placement = "processes"
  cfg.quotas.profile = str(path)
  cfg.quotas.update(quotas)
  inv = dataclasses.replace(take_inventory(), cpu_cores=(0, 1))
  return ResourceManager(translate(cfg), log=lambda s: None, inventory=inv)


def test_the_plan_carries_the_share_its_model_predicts_fastest_and_a_demand_shift_moves_it(tmp_path):
  mgr = _manager(tmp_path, _profile_with_shares())
  chosen = planner.learner_share(mgr.profile, mgr.shape, mgr.plan)
  assert chosen is not None and mgr.plan.learner_sm_percent == chosen[0]
  assert mgr.plan.learner_sm_percent == 25  # The smallest share keeps the learner ahead of the rollout.
  assert "% of the SMs" in mgr.describe()[0]
  # The learner's cost per step doubles (the run measured it): the re-plan gives it more SMs.
  before = mgr.plan.learner_sm_percent
  train = planner.stage_costs(mgr.profile, mgr.plan.num_groups, mgr.plan.recv_batch, "processes")["train"]
  modelled = sum(planner.stage_costs(mgr.profile, mgr.plan.num_groups, mgr.plan.recv_batch, "processes").values())
  mgr.controller.reference = {"train": 10.0, "cpu": modelled}
  new = mgr._replan({"train": 30.0, "cpu": modelled + train})
  assert new.learner_sm_percent > before


def test_the_users_share_is_never_replaced_and_no_shares_measured_means_none(tmp_path):
  assert _manager(tmp_path, _profile_with_shares(), learner_sm_percent=30).plan.learner_sm_percent == 0
  plain = _profile_with_shares()
  plain.sm_shares = None
  assert _manager(tmp_path, plain).plan.learner_sm_percent == 0


def test_a_cached_profile_without_shares_is_measured_again_once_mps_runs(tmp_path, monkeypatch):
  cfg = default.get_config()
  cfg.env.name, cfg.num_envs, cfg.scheduler = "MetaWorld/Reach-v3", 64, "ebrl"
  inv = take_inventory()
  monkeypatch.setenv("EBRL_PROFILE_CACHE", str(tmp_path))
  cached = synthetic(n=64)
  cached.fingerprint, cached.shape = inv.fingerprint(), profiler.run_shape(translate(cfg))
  profiler.save(cached, profiler.cache_path(translate(cfg), inv))
  measured = []
  monkeypatch.setattr(profiler, "measure_in_subprocess", lambda cfg, log=print, **kw: measured.append(kw) or cached)
  profiler.load_or_measure(translate(cfg), inv, log=lambda s: None)
  assert measured == []  # No MPS: the cached profile serves.
  profiler.load_or_measure(translate(cfg), inv, log=lambda s: None, mps_pipe_dir="/tmp/mps-pipe")
  assert measured == [{"mps_pipe_dir": "/tmp/mps-pipe"}]
