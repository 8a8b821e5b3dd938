"""Overlap or a barrier: the probe's A/B windows, the queue's admission, and a run that probes."""

from __future__ import annotations

import json

import pytest

from ebrl.resources.overlap import OverlapProbe
from ebrl.trajectories.queue import TrajectoryQueue
from launch.configs import default
from test_planner import _with_overlap, synthetic


def _feed(probe: OverlapProbe, rate_at, seconds: float, dt: float = 0.05):
  """Updates every dt seconds; env steps accrue at rate_at(admission). Returns (admissions, results)."""
  t, steps, admissions, results = 0.0, 0.0, [], []
  while t < seconds:
    t += dt
    steps += rate_at(probe.admission) * dt
    admissions.append(probe.admission)
    r = probe.observe(t, int(steps))
    if r is not None:
      results.append(r)
  return admissions, results


def test_a_faster_barrier_is_kept_and_a_faster_overlap_too():
  probe = OverlapProbe(1, window_s=1.0, settle_s=0.25, reprobe_s=100.0)
  admissions, results = _feed(probe, lambda a: 9_000.0 if a else 10_000.0, 6.0)
  assert len(results) == 1 and results[0].admission == 0 and probe.admission == 0
  assert results[0].overlapped_env_steps_per_s == pytest.approx(9_000.0, rel=0.02)
  assert results[0].barrier_env_steps_per_s == pytest.approx(10_000.0, rel=0.02)
  # The windows alternate overlap, barrier, overlap, barrier after the first updates.
  changes = [a for i, a in enumerate(admissions) if i == 0 or a != admissions[i - 1]]
  assert changes[:5] == [1, 0, 1, 0, 0][:len(changes[:5])] and 0 in changes
  probe = OverlapProbe(2, window_s=1.0, reprobe_s=100.0)
  _, results = _feed(probe, lambda a: 11_000.0 if a else 10_000.0, 6.0)
  assert results[0].admission == 2 and probe.admission == 2


def test_a_barrier_within_the_margin_keeps_overlap():
  probe = OverlapProbe(1, window_s=1.0, margin=0.02, reprobe_s=100.0)
  _, results = _feed(probe, lambda a: 10_000.0 if a else 10_150.0, 6.0)  # 1.5% faster: noise.
  assert results[0].admission == 1


def test_settling_steps_after_a_switch_are_not_counted():
  # Right after each switch the run pays for the change (a burst here): only settled steps count.
  probe = OverlapProbe(1, window_s=1.0, settle_s=0.25, reprobe_s=100.0)
  state = {"last": None, "since": 0.0}

  def rate(a):
    if a != state["last"]:
      state["last"], state["since"] = a, 0.0
    state["since"] += 0.05
    return 1e6 if state["since"] <= 0.2 else (9_000.0 if a else 10_000.0)

  _, results = _feed(probe, rate, 6.0)
  assert results[0].barrier_env_steps_per_s == pytest.approx(10_000.0, rel=0.05)
  assert results[0].overlapped_env_steps_per_s == pytest.approx(9_000.0, rel=0.05)


def test_a_window_counts_only_after_the_old_settings_segments_drain():
  """Slow updates (0.4 s) and eta = 2: right after a switch the next eta + 1 updates train on
  segments the old setting admitted and no env step is taken under the new one. A window that
  counted from settle_s alone would measure the drain (0 env steps/s for the barrier here)."""
  probe = OverlapProbe(2, window_s=1.0, settle_s=0.25, reprobe_s=100.0)
  state = {"last": None, "updates": 0}

  def rate(a):
    if a != state["last"]:
      state["last"], state["updates"] = a, 0
    state["updates"] += 1
    return 0.0 if state["updates"] <= 3 else (9_000.0 if a else 10_000.0)

  _, results = _feed(probe, rate, 30.0, dt=0.4)
  assert results[0].barrier_env_steps_per_s == pytest.approx(10_000.0, rel=0.02)
  assert results[0].overlapped_env_steps_per_s == pytest.approx(9_000.0, rel=0.02)
  assert results[0].admission == 0


def test_the_probe_repeats_and_follows_a_shift():
  probe = OverlapProbe(1, window_s=0.5, reprobe_s=5.0)
  shifted = {"on": False}
  rate = lambda a: (12_000.0 if a else 10_000.0) if shifted["on"] else (9_000.0 if a else 10_000.0)
  _, first = _feed(probe, rate, 4.0)
  assert [r.admission for r in first] == [0]
  shifted["on"] = True
  _, later = _feed(probe, rate, 20.0)
  assert later and later[-1].admission == 1


def test_a_long_probe_rests_four_times_its_length():
  """Slow updates make a long probe; the next starts no sooner than 4 probe lengths after it
  ends (reprobe_s is the floor), so probing stays within a fifth of the run."""
  probe = OverlapProbe(2, window_s=1.0, reprobe_s=5.0)
  starts, t, steps = [], 0.0, 0
  while t < 400.0:
    t, steps = t + 1.0, steps + 10_000
    was = probe.probing
    probe.observe(t, steps)
    if probe.probing and not was:
      starts.append(t)
  length = probe.results[0].t - starts[0]
  assert length >= 4 * 3.0  # Four windows of at least eta + 1 = 3 one-second updates.
  assert len(starts) >= 2 and starts[1] - probe.results[0].t >= 4 * length - 1.0


def test_nothing_to_probe_without_staleness():
  with pytest.raises(ValueError, match="max_staleness=0"):
    OverlapProbe(0)


def test_queue_admission_zero_is_a_barrier_and_the_bound_stays():
  q = TrajectoryQueue(segments_per_update=2, max_staleness=1)
  q.set_admission(0)
  assert q.try_start(4) == (2, 0)  # One update's worth, as on-policy PPO.
  for _ in range(2):
    q.put(object(), 0)
  assert len(q.get_batch(timeout=0.1)) == 2
  assert q.try_start(2) == (0, 0)  # While the update runs nothing starts: the barrier.
  q.set_version(1)
  assert q.try_start(2) == (2, 1)
  q.set_admission(1)
  assert q.max_staleness == 1 and q.try_start(4) == (2, 1)  # Overlap again: one more update's worth.
  with pytest.raises(ValueError, match="must be in \\[0, max_staleness=1\\]"):
    q.set_admission(2)


def test_a_probe_from_a_barrier_plan_starts_in_the_barrier_and_probes_alike():
  probe = OverlapProbe(2, window_s=1.0, settle_s=0.2, start_after=2, barrier=True)
  assert probe.admission == 0
  admissions, results = _feed(probe, lambda a: 10_000.0 if a else 12_000.0, 12.0)
  assert admissions[0] == 0 and 2 in admissions and results[0].admission == 0


@pytest.mark.parametrize("contended", [False, True])
def test_an_ebrl_run_probes_overlap_and_keeps_the_staleness_bound(tmp_path, contended):
  """resources=auto (from a given profile) on a real run: the queue's admission goes 0, 1, 0 in
  the probe's windows (1, 0, 1 where the profile's generation and updates slow each other so much
  that the plan is a barrier, and the queue starts in it), the probe reports both rates (and marks
  the trace), and every update stays within the bound."""
  from ebrl.scheduler import make_scheduler  # pylint: disable=g-import-not-at-top
  from ebrl.trainer import Trainer

  path = tmp_path / "profile.json"
  # Costly async recvs: the planner picks the fully batched layout, the one that is probed (updates
  # as long as their CPU on 2 cores: overlapping and taking turns predict the same, so it overlaps).
  profile = synthetic(n=8, cores=2, sim_call=4000.0, gen_call=50.0, train_rate=1e5)
  if contended:
    _with_overlap(profile, 0.3, 0.3)
  path.write_text(json.dumps({"profile": profile.to_dict()}))
  cfg = default.get_config()
  cfg.env.name, cfg.num_envs, cfg.rollout_length, cfg.scheduler = "CartpoleBalance-v1", 8, 8, "ebrl"
  cfg.resources, cfg.quotas.profile, cfg.quotas.overlap_probe_s = "auto", str(path), 0.3
  cfg.quotas.control_interval_s = 0.0
  cfg.policy.hidden, cfg.algorithm.epochs, cfg.algorithm.num_minibatches = (16, 16), 1, 2
  cfg.ebrl.max_staleness, cfg.checkpoint_every_s = 1, 1e9
  cfg.total_env_steps = 10**9
  trainer = Trainer(cfg, str(tmp_path / "run"), progress=False)
  mgr = trainer.resources
  assert (mgr.plan.num_groups, mgr.plan.recv_batch) == (1, 8) and mgr.overlap is not None
  assert mgr.plan.barrier == contended
  scheduler = make_scheduler("ebrl", trainer.run_context())
  assert mgr.overlap.initial().admission == (0 if contended else 1)
  admissions, staleness = [], []
  assert trainer.overlap is mgr.overlap and mgr.overlap in trainer.tuners  # The driver asks it each update.
  apply = scheduler.apply
  scheduler.apply = lambda knobs: (admissions.append(knobs.admission) if knobs.admission is not None else None,
                                   apply(knobs))
  for report in trainer.run(scheduler=scheduler):
    staleness.append(int(report.metrics["staleness_max"]))
    if mgr.overlap.results:
      break
  trainer.finish()
  result = mgr.overlap.results[0]
  assert admissions[:4] == ([0, 1, 0, 1] if contended else [1, 0, 1, 0])  # The first: the initial knob.
  assert result.overlapped_env_steps_per_s > 0 and result.barrier_env_steps_per_s > 0
  assert scheduler.queue.admission == result.admission
  assert max(staleness) <= 1
  trace = json.loads((tmp_path / "run" / "trace.json").read_text())
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  probes = [e for e in events if e.get("name") == "overlap_probe"]
  assert len(probes) == len(mgr.overlap.results) and probes[0]["args"]["admission"] == result.admission
