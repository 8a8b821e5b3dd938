"""The runtime controller on synthetic telemetry: hysteresis, one re-plan per step change."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from typing import Callable

import pytest

from ebrl.resources.controller import CPU, Controller, Decision, Telemetry
from ebrl.resources.inventory import take_inventory
from ebrl.resources.manager import ResourceManager, attribute_cpu_change
from ebrl.resources.planner import stage_costs
from ebrl.spec import translate
from launch.configs import default
from test_planner import synthetic
from ebrl.resources.plan import Plan
from ebrl.telemetry.shift_plot import demand_shift

BASE = {"sim": 100.0, "gen": 20.0, "train": 20.0, "assemble": 10.0}
STEPS_PER_S = 10_000


def make_plan(costs: dict[str, float] = BASE) -> Plan:
  return Plan(
      mode="auto",
      cpu_sets={s: (0, 1) for s in ("sim", "gen", "train", "assemble")},
      sim_threads=2, thread_affinity_offset=0, num_groups=2, recv_batch=64,
      max_gen_batch=128, max_wait_ms=1.0, num_minibatches=4,
      stage_cost_us=dict(costs),
      predicted_rates={s: 2e6 / c for s, c in costs.items()},
      predicted_env_steps_per_s=2e6 / sum(costs.values()),
      bottleneck="cpu")


def replan(costs: dict[str, float]) -> Plan:
  """A plan from the measured stage costs ("cpu" is the process total, not a stage)."""
  stages = {s: c for s, c in costs.items() if s != CPU}
  return make_plan().replace(stage_cost_us=stages, predicted_env_steps_per_s=2e6 / sum(stages.values()))


def run(ctl: Controller, cost_at: Callable[[float], dict[str, float]], seconds: int,
        noise: float = 0.0, steps_per_s: int = STEPS_PER_S, seed: int = 0) -> list[Decision]:
  """Observe once per fake second; `cost_at(t)` is the true µs/step over (t, t + 1]."""
  rng = random.Random(seed)
  steps, busy, out = 0, {s: 0.0 for s in BASE}, []
  for t in range(seconds + 1):
    d = ctl.observe(Telemetry(t=float(t), env_steps=steps, cpu_s=sum(busy.values()),
                              busy_s=dict(busy)))
    if d is not None:
      out.append(d)
    n = int(steps_per_s * rng.uniform(0.95, 1.05))
    for s, c in cost_at(float(t)).items():
      busy[s] += c * n * 1e-6 * rng.uniform(1.0 - noise, 1.0 + noise)
    steps += n
  return out


def test_noise_below_drift_never_replans():
  ctl = Controller(make_plan(), replan)
  assert run(ctl, lambda t: BASE, 300, noise=0.2) == []
  assert ctl.replans == 0 and ctl.plan.stage_cost_us == BASE
  assert abs(ctl.reference["sim"] - 100.0) < 20.0  # Set by the first windows, noise and all.
  m = ctl.metrics()
  assert m["controller_replans"] == 0.0
  assert abs(m["controller_measured_sim_us"] - 100.0) < 20.0


def test_step_change_replans_once():
  ctl = Controller(make_plan(), replan)
  step_t = 60.0
  cost_at = lambda t: {**BASE, "sim": 200.0} if t >= step_t else BASE
  decisions = run(ctl, cost_at, 60 + 15 + 200, noise=0.2, seed=1)
  assert len(decisions) == 1 and ctl.replans == 1 and ctl.decisions == decisions
  d = decisions[0]
  assert step_t < d.t <= step_t + ctl.dwell * ctl.interval_s + ctl.interval_s
  assert d.t >= ctl.cooldown_s
  assert abs(d.new_plan.stage_cost_us["sim"] / 200.0 - 1.0) < 0.1
  assert ctl.plan is d.new_plan and d.old_plan.stage_cost_us == BASE
  for s in ("gen", "train", "assemble"):  # Unchanged stages stay near their cost.
    assert abs(d.new_plan.stage_cost_us[s] / BASE[s] - 1.0) < 0.1


def test_oscillation_is_bounded_by_cooldown():
  """0.7x / 1.3x alternating every window: straddles the threshold in every window."""
  osc = lambda t: {**BASE, "sim": 100.0 * (0.7 if int(t // 5) % 2 == 0 else 1.3)}
  for kwargs in ({}, {"smoothing": 1.0, "dwell": 1}):  # Defaults, and a hair-trigger.
    ctl = Controller(make_plan(), replan, **kwargs)
    decisions = run(ctl, osc, 300, noise=0.05, seed=2)
    assert len(decisions) <= 300 / ctl.cooldown_s
    ts = [d.t for d in decisions]
    assert all(b - a >= ctl.cooldown_s for a, b in zip(ts, ts[1:]))
    assert not ts or ts[0] >= ctl.cooldown_s
    assert ts or not kwargs  # The hair-trigger does re-plan: only the cooldown holds it back.


def test_too_few_steps_are_skipped():
  ctl = Controller(make_plan(), replan, min_steps=1000)
  slow = lambda t: {**BASE, "sim": 10_000.0}  # Huge cost, but never enough steps to measure.
  assert run(ctl, slow, 100, steps_per_s=100) == []
  assert run(Controller(make_plan(), replan), slow, 100, steps_per_s=0) == []
  assert ctl.last_measured_cost_us == {} and ctl.replans == 0
  assert ctl.reference is None  # A stalled window does not count towards the reference either.
  assert "controller_measured_sim_us" not in ctl.metrics()


def test_stage_missing_from_telemetry_keeps_its_last_cost():
  """assemble is timed in the reference windows, then no longer reported: the re-plan gets its
  last smoothed cost, not a gap; a stage never timed is not in the reference at all."""
  ctl = Controller(make_plan(), lambda c: (seen.append(c), replan(c))[1])
  seen: list[dict[str, float]] = []
  cost_at = lambda t: {**BASE, "sim": 300.0 if t >= 30 else 100.0}
  rng = random.Random(3)
  steps, busy = 0, {s: 0.0 for s in BASE}
  for t in range(60):
    shown = busy if t < 20 else {s: v for s, v in busy.items() if s != "assemble"}
    ctl.observe(Telemetry(t=float(t), env_steps=steps, cpu_s=0.0, busy_s=dict(shown)))
    n = int(STEPS_PER_S * rng.uniform(0.95, 1.05))
    for s, c in cost_at(t).items():
      busy[s] += c * n * 1e-6
    steps += n
  assert ctl.replans == 1 and set(seen[0]) == set(BASE) | {CPU}
  assert seen[0]["assemble"] == pytest.approx(BASE["assemble"]) and abs(seen[0]["sim"] - 300.0) < 1.0
  never = Controller(make_plan(), replan)
  for t in range(20):
    never.observe(Telemetry(t=float(t), env_steps=t * STEPS_PER_S, cpu_s=0.0, busy_s={"sim": t * 1.0}))
  assert never.reference == {"sim": pytest.approx(100.0), CPU: 0.0}


def test_reason_and_metrics():
  ctl = Controller(make_plan(), replan)
  (d,) = run(ctl, lambda t: {**BASE, "sim": 200.0} if t >= 60 else BASE, 100)
  assert d.kind == "replan"
  assert d.reason.startswith("sim cost 200 us/step vs 100 planned (+100%)"), d.reason
  # The process CPU (here the stages' sum) drifted too, and less: named after sim.
  assert d.reason.endswith("; also process CPU 250 us/step vs 150 planned (+67%)"), d.reason
  assert d.reference_cost_us["sim"] == pytest.approx(100.0) and d.measured_cost_us["sim"] == pytest.approx(200.0)
  m = ctl.metrics()
  assert all(k.startswith("controller_") for k in m)
  assert m["controller_replans"] == 1.0 and m["controller_bottleneck"] == "cpu"
  assert abs(m["controller_predicted_env_steps_per_s"] - 2e6 / 250) < 1.0  # The new plan's.
  assert all(isinstance(v, (float, str)) for v in m.values())
  assert {f"controller_measured_{s}_us" for s in BASE} <= set(m)
  assert m["controller_cpu_us_per_step"] == pytest.approx(250.0)


def test_demand_shift_plot(tmp_path):
  rows = [{"wall_s": float(t), "env_steps_per_s": 13_000.0 if t < 30 else 7_500.0,
           "controller_predicted_env_steps_per_s": 13_333.0 if t < 41 else 8_000.0}
          for t in range(0, 80, 2)]
  rows.insert(0, {"wall_s": 0.0, "env_steps_per_s": 0.0})  # No prediction yet.
  events = [{"t": 30.0, "label": "sim slowed 2x"}, {"t": 41.2, "label": "re-plan"}]
  path = str(tmp_path / "plots" / "shift.png")
  demand_shift(rows, events, path, "demand shift")
  assert os.path.getsize(path) > 1000
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_measured_reference_watches_drift_from_the_first_windows():
  """Stage clocks measure wall µs, not the profile's CPU µs: the reference is what the first
  windows measured, and only a change from it re-plans (once), with the ratio as the reason."""
  plan = make_plan()
  seen = []

  def replan(costs):
    seen.append(dict(costs))
    return plan.replace(predicted_env_steps_per_s=plan.predicted_env_steps_per_s / 2)

  c = Controller(plan, replan, interval_s=1.0, dwell=2, cooldown_s=5.0)
  steps, busy = 0, {"sim": 0.0, "gen": 0.0, "train": 0.0}
  decisions = []
  for t in range(60):
    # Wall costs 3x the planned CPU costs from the start (no re-plan for that), doubled sim at t=30.
    sim_us = 300.0 if t < 30 else 600.0
    steps += 10_000
    busy = {"sim": busy["sim"] + sim_us * 1e-2, "gen": busy["gen"] + 60e-2, "train": busy["train"] + 60e-2}
    d = c.observe(Telemetry(t=float(t), env_steps=steps, cpu_s=0.0, busy_s=dict(busy)))
    if d is not None:
      decisions.append(d)
  assert len(decisions) == 1 and 30 <= decisions[0].t <= 34
  assert decisions[0].reference_cost_us["sim"] == pytest.approx(300.0)
  assert seen[0]["sim"] == pytest.approx(600.0)
  assert "sim cost 600 us/step vs 300 planned (+100%)" in decisions[0].reason


def test_cpu_change_goes_to_the_stage_that_moved_not_by_its_wall_ratio():
  """A 110 µs/step burn in sim: wall sim cost grows several-fold (it also waits longer), process
  CPU by the burn; the planner is told the CPU change, attributed to sim."""
  plan = make_plan()
  seen = []

  def replan(costs):
    seen.append(dict(costs))
    return plan

  c = Controller(plan, replan, interval_s=1.0, dwell=2, cooldown_s=5.0, floor_share=1.0)
  steps, busy, cpu = 0, {"sim": 0.0, "gen": 0.0, "train": 0.0}, 0.0
  for t in range(40):
    sim_wall, gen_wall, cpu_us = (300.0, 2.0, 140.0) if t < 20 else (2000.0, 4.0, 250.0)  # gen: 1 µs noise x2.
    steps += 10_000
    busy = {"sim": busy["sim"] + sim_wall * 1e-2, "gen": busy["gen"] + gen_wall * 1e-2,
            "train": busy["train"] + 60e-2}
    cpu += cpu_us * 1e-2
    c.observe(Telemetry(t=float(t), env_steps=steps, cpu_s=cpu, busy_s=dict(busy)))
  assert len(seen) == 1
  extra = attribute_cpu_change(c.decisions[0].reference_cost_us, seen[0], c.drift * c.floor_share)
  assert extra == {"sim": pytest.approx(110.0)}  # gen doubled too, but by 2 µs of a 140 µs step: noise.
  assert c.metrics()["controller_cpu_us_per_step"] == pytest.approx(250.0)


def test_small_stage_doubling_is_not_drift_with_a_cpu_floor():
  c = Controller(make_plan(), replan, interval_s=1.0, dwell=1, cooldown_s=0.0,
                 floor_share=1.0)
  steps, busy, cpu = 0, {"sim": 0.0, "gen": 0.0}, 0.0
  for t in range(30):
    steps += 10_000
    busy = {"sim": busy["sim"] + 1.0, "gen": busy["gen"] + (0.01 if t % 2 else 0.03)}  # gen 1 <-> 3 µs/step
    cpu += 1.4
    assert c.observe(Telemetry(t=float(t), env_steps=steps, cpu_s=cpu, busy_s=dict(busy))) is None


def test_attribute_cpu_change_splits_by_how_far_each_stage_moved():
  ref = {"sim": 100.0, "gen": 50.0, "train": 20.0, "cpu": 200.0}
  now = {"sim": 400.0, "gen": 150.0, "train": 21.0, "cpu": 320.0}
  extra = attribute_cpu_change(ref, now, 0.25)
  assert extra == {"sim": pytest.approx(120.0 * 300 / 400), "gen": pytest.approx(120.0 * 100 / 400)}
  # Cheaper: the stage whose wall cost fell takes the (negative) change; nothing moved: no change.
  assert attribute_cpu_change(ref, {**ref, "sim": 20.0, "cpu": 150.0}, 0.25) == {"sim": pytest.approx(-50.0)}
  assert attribute_cpu_change(ref, {**ref, "cpu": 260.0}, 0.25) == {}
  assert attribute_cpu_change({"sim": 1.0}, {"sim": 2.0}, 0.25) == {}  # No CPU measured.


def test_manager_replan_adds_the_cpu_change_to_sim_and_plans_with_the_measured_total(tmp_path):
  """The re-plan's model pays what the run measured per step (stage costs + run overhead);
  the bound moves by the stage change only."""
  prof = synthetic(n=64, cores=2)
  path = tmp_path / "profile.json"
  path.write_text(json.dumps({"profile": prof.to_dict()}))
  cfg = default.get_config()
  cfg.env.name, cfg.num_envs, cfg.scheduler, cfg.resources = "MetaWorld/Reach-v3", 64, "ebrl", "auto"
  cfg.quotas.profile = str(path)
  inv = dataclasses.replace(take_inventory(), cpu_cores=(0, 1))
  mgr = ResourceManager(translate(cfg), log=lambda s: None, inventory=inv)
  modelled = sum(stage_costs(mgr.profile, mgr.plan.num_groups, mgr.plan.recv_batch).values())
  bound0 = mgr.bound["cpu_us_per_step"]
  mgr.controller.reference = {"sim": 20.0, "gen": 5.0, "train": 5.0, "cpu": modelled + 30.0}
  new = mgr._replan({"sim": 200.0, "gen": 5.0, "train": 5.0, "cpu": modelled + 30.0 + 100.0})
  assert mgr.bound["cpu_us_per_step"] == pytest.approx(bound0 + 100.0)  # The stage change, not the overhead.
  assert sum(new.stage_cost_us.values()) == pytest.approx(modelled + 130.0, rel=0.02)
  assert new.predicted_env_steps_per_s <= 2e6 / (modelled + 130.0) * 1.02
