"""The planner against known optima on synthetic profiles, and the bound it reports."""

import itertools
import math

import pytest

from ebrl.resources import planner
from ebrl.resources.plan import STAGES
from ebrl.resources.profiler import Profile


def synthetic(sim_step=100.0, sim_call=800.0, gen_call=200.0, gen_row=0.5, train_us=20.0,
              train_rate=1e6, n=64, cores=4) -> Profile:
  """A profile whose stage costs follow exact formulas (CPU µs; sim scales linearly with cores)."""
  sim = [{"cores": c, "threads": c, "batch": n, "async": False, "env_steps_per_s": c * 1e6 / sim_step,
          "cpu_us_per_step": sim_step} for c in (1, cores)]
  sim += [{"cores": cores, "threads": cores, "batch": b, "async": True,
           "env_steps_per_s": cores * 1e6 / (sim_step + sim_call / b), "cpu_us_per_step": sim_step + sim_call / b}
          for b in (n // 4, n // 2, n - n // 8)]
  gen = [{"batch": 1 << k, "wall_us": gen_call + gen_row * (1 << k), "cpu_us": gen_call + gen_row * (1 << k)}
         for k in range(0, (n - 1).bit_length() + 1)]
  train = [{"samples": 1000, "wall_s": 1000 / train_rate, "cpu_s": 1000 * train_us * 1e-6}]
  assemble = [{"batch": b, "cpu_us": 10.0 + 0.1 * b} for b in (8, n)]
  return Profile(fingerprint={}, shape={"num_envs": n}, sim=sim, gen=gen, train=train, assemble=assemble)


SHAPE = planner.RunShape(num_envs=64, multitask=False, rollout_length=16, segments_per_update=64, num_minibatches=4)


def test_sim_cost_fit_recovers_the_formula():
  p = synthetic()
  for b in (8, 16, 40, 63):
    assert p.sim_cpu_us(b) == pytest.approx(100.0 + 800.0 / b, rel=1e-6)
  assert p.sim_sync_cpu_us() == 100.0
  assert p.sim_rate(2) == pytest.approx(2e6 / 100.0 * 1.0, rel=0.34)  # Interpolated between 1 and 4 cores.


def test_predict_matches_a_hand_computed_core_load():
  costs = {"sim": 90.0, "gen": 6.0, "train": 26.0, "assemble": 4.0}
  caps = {s: math.inf for s in STAGES}
  # sim alone on cores 0-2; gen+assemble on 3; train on 3 too.
  layout = {"sim": (0, 1, 2), "gen": (3,), "assemble": (3,), "train": (3,)}
  rates, e2e, bottleneck = planner.predict(costs, layout, caps)
  assert rates["sim"] == pytest.approx(3e6 / 90.0)
  assert rates["gen"] == pytest.approx(1e6 / 36.0)
  assert e2e == pytest.approx(1e6 / 36.0) and bottleneck == "train"  # Core 3 carries 6 + 4 + 26.
  shared = {s: (0, 1, 2, 3) for s in STAGES}
  _, e2e, bottleneck = planner.predict(costs, shared, caps)
  assert e2e == pytest.approx(4e6 / 126.0) and bottleneck == "sim"


def _brute_force(profile, cores, shape, render=False):
  """Every group count, recv batch and layout the planner may choose, scored by the same model."""
  best = 0.0
  for groups in (1, 2, 4):
    per = shape.num_envs // groups
    for recv in range(1, per):
      if groups * (per - recv) < planner._in_flight_need(shape, cores):
        continue
      for _, layout in planner._layouts(cores, render=render):
        best = max(best, planner._make("auto", profile, shape, layout, groups, recv).predicted_env_steps_per_s)
  return best


@pytest.mark.parametrize("kwargs", [
    dict(),  # Sim-bound: a shared pool and the biggest batch that keeps envs in flight.
    dict(sim_call=4000.0),  # Heavy per-call sim overhead: bigger recv batches pay.
    dict(train_rate=3000.0),  # The learner caps everything.
    dict(gen_call=5000.0, sim_step=20.0),  # Generation latency dominates: few, big calls.
])
def test_auto_plan_is_the_best_the_model_allows(kwargs):
  p = synthetic(**kwargs)
  cores = (0, 1, 2, 3)
  plan = planner.plan_auto(p, cores, SHAPE)
  # The planner searches a grid of recv batches; the brute force every size: within 5% of it.
  assert plan.predicted_env_steps_per_s >= 0.95 * _brute_force(p, cores, SHAPE)
  assert plan.predicted_env_steps_per_s == pytest.approx(min(plan.predicted_rates.values()))
  assert plan.bottleneck in STAGES


def test_known_optimum_shared_pool_and_batch():
  # Everything CPU-bound and perfectly parallel, generation free: the optimum is the fully batched
  # layout on a shared pool (the sync step's cost, nothing lost to the chain), at cores / total cost.
  p = synthetic(gen_call=0.0, gen_row=0.0, train_us=0.0)
  plan = planner.plan_auto(p, (0, 1, 2, 3), SHAPE)
  assert set(plan.cpu_sets["sim"]) == {0, 1, 2, 3} == set(plan.cpu_sets["train"])
  assert plan.num_groups == 1 and plan.recv_batch == 64
  expected = 4e6 / (100.0 + (10.0 + 0.1 * 64) / 64)
  assert plan.predicted_env_steps_per_s == pytest.approx(expected, rel=1e-6)
  assert plan.predicted_env_steps_per_s == pytest.approx(planner.work_conserving_bound(p, (0, 1, 2, 3), SHAPE)
                                                         ["env_steps_per_s"], rel=1e-6)


def test_generation_latency_makes_async_groups_beat_the_fully_batched_chain():
  # A generation call of 3 ms: the fully batched chain waits for it every step, while async recvs
  # keep envs stepping meanwhile. The best async plan: one env per core in flight.
  p = synthetic(gen_call=3000.0, gen_row=0.0, train_us=0.0)
  plan = planner.plan_auto(p, (0, 1, 2, 3), SHAPE)
  full = planner._make("auto", p, SHAPE, {s: (0, 1, 2, 3) for s in ("sim", "gen", "train", "assemble")}, 1, 64)
  chain = 1e6 / (100.0 / 4 + 3000.0 / 64)  # Sim on 4 cores, then one generation call per step of every env.
  assert full.predicted_env_steps_per_s == pytest.approx(chain, rel=1e-6)
  assert plan.recv_batch < 64 and plan.predicted_env_steps_per_s > 1.2 * chain


def test_costly_async_recvs_choose_the_fully_batched_layout():
  # Each recv costs 4 ms of CPU (MetaWorld/MT10's ten small pools look like this): stepping every
  # env at once is cheaper than any recv batch that keeps envs in flight.
  p = synthetic(sim_call=4000.0, gen_call=50.0)
  plan = planner.plan_auto(p, (0, 1, 2, 3), SHAPE)
  assert (plan.num_groups, plan.recv_batch, plan.max_gen_batch) == (1, 64, 64)
  assert plan.stage_cost_us["sim"] == p.sim_sync_cpu_us()
  assert plan.predicted_env_steps_per_s > 1.2 * _brute_force(p, (0, 1, 2, 3), SHAPE)


def test_dedicated_learner_block_when_it_is_the_only_way_to_parallelise():
  # A learner capped at one call at a time but costing a lot: the model gives the same rate to a
  # shared pool and a split only if caps allow; a cap below the pool rate names train.
  p = synthetic(train_rate=5000.0)
  plan = planner.plan_auto(p, (0, 1, 2, 3), SHAPE)
  assert plan.bottleneck == "train" and plan.predicted_env_steps_per_s == pytest.approx(5000.0)


def test_naive_layout_is_an_equal_split():
  assert planner.naive_layout((0, 1)) == {"sim": (0,), "gen": (1,), "assemble": (1,), "train": (1,)}
  lay = planner.naive_layout(tuple(range(16)))
  assert lay["sim"] == tuple(range(0, 5)) and lay["gen"] == tuple(range(5, 10)) and lay["train"] == tuple(range(10, 16))
  p = synthetic()
  naive = planner.plan_naive(SHAPE, (0, 1), 1, 32, p)
  auto = planner.plan_auto(p, (0, 1), SHAPE)
  assert auto.predicted_env_steps_per_s > naive.predicted_env_steps_per_s
  assert naive.bottleneck == "sim"  # Half the cores for the stage that costs most.


def test_bound_is_cores_over_cheapest_total_and_never_below_a_plan():
  p = synthetic()
  cores = (0, 1, 2, 3)
  bound = planner.work_conserving_bound(p, cores, SHAPE)
  total = 100.0 + (200.0 + 0.5 * 64) / 64 + 20.0 + (10.0 + 0.1 * 64) / 64
  assert bound["cpu_us_per_step"] == pytest.approx(total)
  assert bound["env_steps_per_s"] == pytest.approx(4e6 / total)
  for groups, recv in [*itertools.product((1, 2), (8, 16, 24)), (1, 64)]:
    for _, layout in planner._layouts(cores):
      plan = planner._make("auto", p, SHAPE, layout, groups, recv)
      assert plan.predicted_env_steps_per_s <= bound["env_steps_per_s"] + 1e-6


def test_replanning_keeps_what_a_running_run_cannot_change():
  p = synthetic()
  heavier = synthetic(sim_step=200.0, sim_call=1600.0)  # Every sim cost of `p` doubled.
  plan = planner.plan_auto(heavier, (0, 1, 2, 3), SHAPE, fixed=(2, 8))
  assert (plan.num_groups, plan.recv_batch) == (2, 8)
  assert plan.stage_cost_us["sim"] == pytest.approx(2 * p.sim_cpu_us(8))


def _chain_cap(p: Profile, groups: int, placement: str = "threads", shape=SHAPE, cores=(0, 1, 2, 3)) -> float:
  per = shape.num_envs // groups
  layout = {s: cores for s in ("sim", "gen", "train", "assemble")}
  costs = planner.stage_costs(p, groups, per, placement)
  take = 0.0 if placement == "processes" else costs["train"] / sum(costs.values())  # An idle learner process.
  return planner.stage_caps(p, layout, len(cores) // groups, groups, per * groups, per, placement,
                            learner_take=take)["sim"]


def test_two_batched_groups_fill_one_groups_generation_with_the_others_simulation_in_the_model():
  # Sync-mode sim at 100 µs per step on 4 cores (S = n / 40,000 s a group's step); 0.5 ms of
  # generation per call whatever the batch: one group is the chain S + g, two groups take turns
  # (max(2 S, S + g, 2 g)), each group receiving all of its envs at the simulator's sync cost
  # plus the per-call cost the async fit measured, over half the envs.
  p = synthetic(gen_call=500.0, gen_row=0.0, train_us=0.0)
  assert planner.groups_batched(64, 2, 32) and planner.groups_batched(64, 1, 64)
  assert not planner.groups_batched(64, 2, 31)
  one = _chain_cap(p, 1)
  two = _chain_cap(p, 2)
  assert one == pytest.approx(64 / (64 / 40000 + 0.5e-3), rel=1e-6)
  assert two == pytest.approx(64 / max(2 * 32 / 40000, 32 / 40000 + 0.5e-3, 2 * 0.5e-3), rel=1e-6)
  assert two > one
  slow_gen = synthetic(gen_call=3000.0, gen_row=0.0, train_us=0.0)  # 2 g > S + g: generation-bound.
  assert _chain_cap(slow_gen, 2) == pytest.approx(64 / (2 * 3e-3), rel=1e-6)
  assert _chain_cap(slow_gen, 2) < _chain_cap(slow_gen, 1)
  plan = planner._make("auto", p, SHAPE, {s: (0, 1, 2, 3) for s in ("sim", "gen", "train", "assemble")}, 2, 32)
  assert plan.stage_cost_us["sim"] == pytest.approx(100.0 + 800.0 / 32 - 800.0 / 64)  # Two calls per step.
  assert p.sim_sync_cpu_us(32) == pytest.approx(plan.stage_cost_us["sim"]) and p.sim_sync_cpu_us() == 100.0
  assert plan.stage_cost_us["gen"] == pytest.approx(p.gen_cpu_us(32) / 32)  # One call per group.
  # Scored for a user's manual layout, but no candidate of the auto plan (see _batch_choices).
  assert all(not (g > 1 and planner.groups_batched(64, g, r)) for g, r in planner._batch_choices(SHAPE, (0, 1, 2, 3)))


def test_a_learner_at_the_rollouts_priority_stretches_the_chain_an_idle_one_does_not():
  # A batched chain with a learner costing 20 of the stages' CPU µs per step: at the rollout's
  # priority (a thread, or a process at normal priority) it takes that share of the cores from the
  # chain while it updates; a learner process at idle priority only fills the chain's gaps.
  p = _with_placement(synthetic(gen_call=3000.0, gen_row=0.0, train_us=20.0), 100.0, 100.0)
  costs = planner.stage_costs(p, 1, 64, "threads")
  share = costs["train"] / sum(costs.values())
  assert _chain_cap(p, 1, "threads") == pytest.approx((1 - share) * _chain_cap(p, 1, "processes"), rel=1e-6)
  idle = planner.RunShape(**{**SHAPE.__dict__, "learner_priority": "idle"})
  normal = planner.RunShape(**{**SHAPE.__dict__, "learner_priority": "normal"})
  layout = {s: (0, 1, 2, 3) for s in ("sim", "gen", "train", "assemble")}
  at = lambda shape, where: planner._make("auto", p, shape, layout, 1, 64, placement=where).predicted_rates["sim"]
  assert at(idle, "processes") == pytest.approx(_chain_cap(p, 1, "processes"), rel=1e-6)
  assert at(normal, "processes") == pytest.approx(at(idle, "threads"), rel=1e-6)
  assert at(normal, "processes") < at(idle, "processes")


def _with_shares(p: Profile, points: list[tuple[int, float, float]]) -> Profile:
  p.sm_shares = [{"sm_percent": pct, "update_s": u, "gen_us": g} for pct, u, g in points]
  return p


def test_at_learner_share_scales_updates_and_generation_to_the_measured_point():
  p = _with_shares(synthetic(train_rate=1e5), [(25, 0.04, 300.0), (100, 0.01, 400.0)])
  at = p.at_learner_share(p.sm_shares[0])
  assert at.train_rate() == pytest.approx(p.train_rate() / 4)  # 4x the update time of the full share.
  assert at.gen_wall_us(64) == pytest.approx(300.0) and at.gen_wall_us(8) == pytest.approx(p.gen_wall_us(8) * 300 / p.gen_wall_us(64))
  # A drift of the learner's cost carries over: the same share on a profile whose updates doubled.
  slower = p.with_extra("train", 1000 / 1e5 / 1000 * 1e6)  # +10 µs per sample: wall 10 ms -> 20 ms.
  assert slower.at_learner_share(p.sm_shares[0]).train_rate() == pytest.approx(p.train_rate() / 8)


def test_learner_share_is_the_measured_point_the_model_predicts_fastest():
  shape = planner.RunShape(**{**SHAPE.__dict__, "learner_priority": "idle"})
  # Updates scale with the share; generation slows as the learner takes more SMs.
  points = [(25, 0.08, 250.0), (50, 0.04, 260.0), (75, 0.027, 300.0), (100, 0.02, 400.0)]
  p = _with_placement(_with_shares(synthetic(train_rate=1e5, gen_call=200.0), points), 100.0, 100.0)
  plan = planner.plan_auto(p, (0, 1, 2, 3), shape, placement="processes")
  assert planner.learner_share(synthetic(), shape, plan) is None  # No shares measured: none chosen.
  rates = {pct: planner._make("auto", p.at_learner_share(pt), shape, plan.cpu_sets, plan.num_groups,
                              plan.recv_batch, threads=plan.sim_threads, placement="processes").predicted_env_steps_per_s
           for pct, pt in zip((25, 50, 75, 100), p.sm_shares)}
  percent, rate = planner.learner_share(p, shape, plan)
  assert rate == pytest.approx(rates[percent]) and rate >= 0.99 * max(rates.values())
  assert all(rates[q] < 0.99 * max(rates.values()) for q in rates if q < percent)  # Ties: the smaller share.
  # The learner's cost doubles (a demand shift): it needs a larger share to keep up.
  heavier = p.with_extra("train", 10.0)
  bigger, _ = planner.learner_share(heavier, shape, plan)
  assert bigger > percent


def test_with_extra_adds_cpu_per_step_to_one_stage():
  p = synthetic()
  q = p.with_extra("sim", 50.0)
  for b in (8, 32, 56):
    assert q.sim_cpu_us(b) == pytest.approx(p.sim_cpu_us(b) + 50.0)
  # Spread over the point's cores: 4 cores at 100 µs/step -> 40,000/s; +50 µs -> 4e6 / 150.
  assert q.sim_rate(4) == pytest.approx(4e6 / 150.0)
  assert p.with_extra("gen", 2.0).gen_cpu_us(16) == pytest.approx(p.gen_cpu_us(16) + 32.0)
  assert p.with_extra("train", 5.0).train_cpu_us_per_step() == pytest.approx(25.0)
  assert p.with_extra("train", -100.0).train_cpu_us_per_step() == pytest.approx(2.0)  # Floor: a tenth.
  with pytest.raises(ValueError, match="unknown stage 'render'"):
    p.with_extra("render", 1.0)


def with_render(p: Profile, cpu_per_frame: float, wall_per_frame: float, call_us: float = 0.0) -> Profile:
  """`p` with a render stage whose draws cost call_us + per-frame µs (Mesa may spread a draw's CPU)."""
  n = p.shape["num_envs"]
  p.render = [{"batch": b, "wall_us": call_us + wall_per_frame * b, "cpu_us": call_us + cpu_per_frame * b}
              for b in (n // 4, n // 2, n)]
  return p


RENDER_SHAPE = planner.RunShape(num_envs=64, multitask=False, rollout_length=16, segments_per_update=64,
                                num_minibatches=4, render_stage=True)


def test_render_stage_costs_and_caps_enter_the_model():
  p = with_render(synthetic(), cpu_per_frame=300.0, wall_per_frame=150.0, call_us=64.0)
  assert p.render_cpu_us(32) == pytest.approx(64.0 + 300.0 * 32)
  assert p.render_wall_us(128) == pytest.approx((64.0 + 150.0 * 64) * 2)  # Per frame beyond the points.
  costs = planner.stage_costs(p, groups=2, recv_batch=16)
  assert costs["render"] == pytest.approx((64.0 + 300.0 * 16) / 16)
  caps = planner.stage_caps(p, {"sim": (0, 1)}, 2, 2, 32, 16)
  assert caps["render"] == pytest.approx(16 * 1e6 / (64.0 + 150.0 * 16))  # One draw at a time.
  # Render on core 0 alone, the rest on 1-3: core 0 carries render, cores 1-3 the others.
  layout = {"render": (0,), "sim": (1, 2, 3), "gen": (1, 2, 3), "train": (1, 2, 3), "assemble": (1, 2, 3)}
  costs = {"sim": 90.0, "render": 250.0, "gen": 6.0, "train": 24.0, "assemble": 0.0}
  rates, e2e, bottleneck = planner.predict(costs, layout, {s: math.inf for s in STAGES})
  assert rates["render"] == pytest.approx(1e6 / 250.0) and rates["sim"] == pytest.approx(3e6 / 120.0)
  assert e2e == pytest.approx(4000.0) and bottleneck == "render"


@pytest.mark.parametrize("cpu, wall", [(300.0, 300.0), (300.0, 100.0), (40.0, 40.0)])
def test_auto_plan_with_a_render_stage_is_the_best_the_model_allows(cpu, wall):
  p = with_render(synthetic(), cpu, wall, call_us=200.0)
  cores = (0, 1, 2, 3)
  plan = planner.plan_auto(p, cores, RENDER_SHAPE)
  assert "render" in plan.cpu_sets and "render" in plan.stage_cost_us
  assert plan.predicted_env_steps_per_s >= 0.95 * _brute_force(p, cores, RENDER_SHAPE, render=True)
  assert plan.predicted_env_steps_per_s <= planner.work_conserving_bound(p, cores, RENDER_SHAPE)["env_steps_per_s"]


def test_render_quota_is_sized_with_the_other_stages_and_naive_starves_it():
  # Render: 300 µs CPU per frame spread over Mesa's threads (100 µs wall, cap 10,000 frames/s);
  # sim 100 µs. Every core then carries an even share of 400+ µs per step: 4e6 / 400 per second.
  # The equal split puts render beside sim on one core: that core carries both.
  p = with_render(synthetic(sim_call=0.0, gen_call=0.0, gen_row=0.0, train_us=0.0), 300.0, 100.0)
  plan = planner.plan_auto(p, (0, 1, 2, 3), RENDER_SHAPE)
  expected = 4e6 / (100.0 + 300.0 + plan.stage_cost_us["assemble"])
  assert plan.predicted_env_steps_per_s == pytest.approx(expected, rel=0.02)
  assert len(plan.cpu_sets["render"]) == 4 and plan.predicted_rates["render"] == pytest.approx(expected, rel=0.02)
  naive = planner.plan_naive(RENDER_SHAPE, (0, 1, 2, 3), 1, 32, p)
  assert naive.cpu_sets["render"] == naive.cpu_sets["sim"] == (0,)  # Render beside sim in the equal split.
  assert naive.predicted_env_steps_per_s == pytest.approx(1e6 / (100.0 + 300.0), rel=0.01)
  assert naive.bottleneck == "render"


def test_bound_counts_render_and_its_one_draw_at_a_time():
  p = with_render(synthetic(), 300.0, 300.0)
  cores = (0, 1, 2, 3)
  bound = planner.work_conserving_bound(p, cores, RENDER_SHAPE)
  assert bound["render_us"] == pytest.approx(300.0)
  assert bound["env_steps_per_s"] == pytest.approx(1e6 / 300.0)  # Serial draws cap every schedule.
  for groups, recv in itertools.product((1, 2), (8, 16, 24)):
    for _, layout in planner._layouts(cores, render=True):
      assert planner._make("auto", p, RENDER_SHAPE, layout, groups, recv).predicted_env_steps_per_s <= \
          bound["env_steps_per_s"] + 1e-6


def test_with_extra_moves_the_render_stage():
  p = with_render(synthetic(), 300.0, 100.0)
  q = p.with_extra("render", 50.0)
  assert q.render_cpu_us(16) == pytest.approx(p.render_cpu_us(16) + 50.0 * 16)
  assert q.render_wall_us(16) == pytest.approx(p.render_wall_us(16) + 50.0 * 16)


def test_version_1_profiles_lose_their_render_difference():
  d = synthetic().to_dict()
  d["render"] = {"cpu_us_per_step": 8000.0}
  assert Profile.from_dict(d).render is None


def _with_placement(p: Profile, threads_us: float, processes_us: float) -> Profile:
  p.placement = {"batch": 64, "alone_us": 100.0, "threads_us": threads_us, "processes_us": processes_us}
  return p


def test_placement_is_a_candidate_only_where_the_profile_measured_it():
  p = synthetic(gen_call=3000.0, gen_row=0.0)
  assert planner.placements(p) == ("threads",)
  assert planner.plan_auto(p, (0, 1, 2, 3), SHAPE).placement == "threads"
  assert planner.placements(_with_placement(p, 150.0, 100.0)) == ("threads", "processes")


def test_a_learner_process_wins_where_the_shared_interpreter_slows_generation():
  # Generation-bound (3 ms calls): a learner in this process makes them 1.5x slower (as measured
  # beside updates), a learner process does not, so the process is worth its copies.
  p = _with_placement(synthetic(gen_call=3000.0, gen_row=0.0, train_us=0.0), 150.0, 100.0)
  plan = planner.plan_auto(p, (0, 1, 2, 3), SHAPE)
  threads = planner.plan_auto(p, (0, 1, 2, 3), SHAPE, placement="threads")
  assert plan.placement == "processes"
  assert plan.stage_cost_us["gen"] == pytest.approx(threads.stage_cost_us["gen"] / 1.5, rel=1e-6)
  assert plan.predicted_env_steps_per_s > 1.2 * threads.predicted_env_steps_per_s
  # The same run measured without a difference, or with one below the margin: threads.
  for threads_us in (100.0, 102.0):
    same = _with_placement(synthetic(gen_call=3000.0, gen_row=0.0, train_us=0.0), threads_us, 100.0)
    rate = lambda where: planner.plan_auto(same, (0, 1, 2, 3), SHAPE, placement=where).predicted_env_steps_per_s
    assert rate("threads") <= rate("processes") < planner.PROCESS_GAIN * rate("threads")
    assert planner.plan_auto(same, (0, 1, 2, 3), SHAPE).placement == "threads"
  # A re-plan keeps the placement of the learner that exists.
  assert planner.plan_auto(p, (0, 1, 2, 3), SHAPE, fixed=(plan.num_groups, plan.recv_batch),
                           placement="threads").placement == "threads"


def test_host_slowdown_never_credits_threads_and_is_one_without_a_measurement():
  p = synthetic()
  assert p.host_slowdown("threads") == p.host_slowdown("processes") == 1.0
  _with_placement(p, 90.0, 100.0)  # Noise in the other direction: no speed-up from sharing.
  assert p.host_slowdown("threads") == 1.0
  _with_placement(p, 130.0, 100.0)
  assert p.host_slowdown("threads") == pytest.approx(1.3) and p.host_slowdown("processes") == 1.0


def _with_overlap(p: Profile, f_gen: float, f_train: float) -> Profile:
  """The placement probe's measurements for generation and updates each at a fraction of their
  own speed beside the other (in either placement)."""
  update_s = p.train[0]["wall_s"]
  p.placement = {"batch": p.shape["num_envs"], "alone_us": 100.0, "threads_us": 100.0 / f_gen,
                 "processes_us": 100.0 / f_gen, "threads_update_s": update_s / f_train,
                 "processes_update_s": update_s / f_train}
  return p


def test_side_by_side_beats_one_after_the_other_exactly_when_the_speeds_add_up_to_more_than_one():
  assert planner.side_by_side_us(30.0, 20.0, (1.0, 1.0)) == pytest.approx(30.0)  # No contention: the longer.
  assert planner.side_by_side_us(30.0, 20.0, (1.0, 0.0)) == pytest.approx(50.0)  # The learner only after.
  # Both at 0.6: 20 / 0.6 side by side finishes training with 30 - 20 of the rollout left, then alone.
  assert planner.side_by_side_us(30.0, 20.0, (0.6, 0.6)) == pytest.approx(20.0 / 0.6 + 10.0)
  for f in (0.3, 0.45, 0.55, 0.8):
    side = planner.side_by_side_us(30.0, 20.0, (f, f))
    assert (side < 50.0) == (2 * f > 1.0) and (side > 50.0) == (2 * f < 1.0)


def test_overlap_speeds_come_from_the_placement_probe_and_are_none_without_its_updates():
  p = synthetic(train_rate=2000.0)
  assert p.overlap_speeds("threads") is None
  _with_placement(p, 150.0, 100.0)  # A profile measured before updates beside were.
  assert p.overlap_speeds("processes") is None
  _with_overlap(p, 0.5, 0.25)
  assert p.overlap_speeds("threads") == pytest.approx((0.5, 0.25))
  p.placement["processes_us"] = 90.0  # Faster beside updates than alone: noise, never a gain.
  assert p.overlap_speeds("processes")[0] == 1.0


BARRIER_SHAPE = planner.RunShape(**{**SHAPE.__dict__, "barrier": True})


def test_contention_that_outweighs_overlap_plans_the_barrier():
  # Generation and updates each at 30% of their speed beside each other: overlapping loses to
  # taking turns, so the plan is the sync schedule, predicted at rollout alone + update per step.
  p = _with_overlap(synthetic(gen_call=3000.0, gen_row=0.0, train_us=20.0, train_rate=10000.0), 0.3, 0.3)
  plan = planner.plan_auto(p, (0, 1, 2, 3), BARRIER_SHAPE)
  assert plan.barrier and (plan.num_groups, plan.recv_batch) == (1, 64) and plan.placement == "threads"
  layout = plan.cpu_sets
  rollout = planner.rollout_rate(p, layout, 1, 64, 4, 1)
  assert rollout == pytest.approx(1e6 / (100.0 / 4 + 3000.0 / 64), rel=1e-6)  # The chain, nothing beside it.
  assert plan.predicted_env_steps_per_s == pytest.approx(1 / (1 / rollout + 1 / 10000.0), rel=1e-6)
  overlapped = planner.plan_auto(p, (0, 1, 2, 3), SHAPE)  # Not a candidate: the best overlapping plan.
  assert not overlapped.barrier and overlapped.predicted_env_steps_per_s < plan.predicted_env_steps_per_s
  assert overlapped.bottleneck == "rollout and updates slowing each other"
  # A running run's re-plan keeps its groups and recv batch and never plans a barrier itself.
  assert not planner.plan_auto(p, (0, 1, 2, 3), BARRIER_SHAPE, fixed=(1, 64)).barrier


def test_overlap_that_pays_keeps_an_overlapping_plan_capped_by_what_side_by_side_allows():
  p = _with_overlap(synthetic(gen_call=3000.0, gen_row=0.0, train_us=20.0, train_rate=2000.0), 0.9, 0.8)
  plan = planner.plan_auto(p, (0, 1, 2, 3), BARRIER_SHAPE)
  assert not plan.barrier
  barrier = planner.plan_barrier(p, (0, 1, 2, 3), BARRIER_SHAPE)
  assert plan.predicted_env_steps_per_s > barrier.predicted_env_steps_per_s
  threads, pools = planner._sim_threads(plan.cpu_sets, plan.num_groups, SHAPE)
  rollout = planner.rollout_rate(p, plan.cpu_sets, plan.num_groups, plan.recv_batch, threads, pools)
  cap = 1e6 / planner.side_by_side_us(1e6 / rollout, 1e6 / 2000.0, (0.9, 0.8))
  assert plan.predicted_env_steps_per_s <= cap * (1 + 1e-9)


def test_bound_takes_each_stages_cheapest_measured_batching():
  # 40 envs: a call for all of them pads to 64 rows, a call of 32 is cheaper per env served; the
  # simulator's async recvs here cost less per step than stepping every env at once.
  n = 40
  p = synthetic(n=n, gen_call=0.0, gen_row=10.0)
  for point in p.sim:
    if point["async"]:
      point["cpu_us_per_step"] = 80.0
  shape = planner.RunShape(**{**SHAPE.__dict__, "num_envs": n})
  bound = planner.work_conserving_bound(p, (0, 1, 2, 3), shape)
  assert bound["gen_us"] == pytest.approx(10.0 * 32 / 32) and p.gen_cpu_us(n) / n == pytest.approx(10.0 * 64 / 40)
  assert bound["sim_us"] == 80.0
