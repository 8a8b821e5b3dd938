"""From stage profiles to a plan: core sets, threads, batch sizes, and the rate they predict.

The model. Every stage costs CPU per env step (profiles say how much at a given
batch). A stage spreads its work evenly over the cores of its quota, so core j
carries `load_j = sum over stages s on j of cost_s / |cores_s|` µs per step, and
no schedule can go faster than its most loaded core: `1e6 / max_j load_j`.
Each stage is also capped by its own parallelism (the simulator by its worker
threads, the sampler and the learner by what one call reaches back to back).
The prediction is the smaller of the two; the stage that sets it is the
bottleneck.

The planner enumerates the choices that move those numbers - env groups, the
recv batch (bigger amortises per-call costs, smaller keeps more envs in
flight; all of them is the fully batched layout below), the generation batch,
and core layouts (one shared pool, or sim on a
dedicated block with generation and training beside it; a render stage with
the simulator, on every core, or on a block of its own) - and keeps the best
prediction. The render stage draws on one thread at a time, so its cap is one
draw after another; its cores serve Mesa's rasterizer threads.

The *fully batched layout* is one group whose recv returns every env (sync-mode
pools): it pays the simulator's cheapest per-step cost and one generation call
for all envs, as the sync scheduler does, but its simulation and generation
take turns (nothing else is in flight while actions are generated), so its
rollout is capped by the chain `1 / (sim time + gen time)` per step. The
learner still trains beside it. It wins where async recvs cost more per step
than generation latency costs the chain (a multi-task MetaWorld env's small task pools, e.g. MT10's ten).

The *work-conserving bound* is what any schedule could reach with these stage
costs on these cores: every core busy all the time with every stage at the
cheapest batching it was measured at, i.e. cores / total cost per step.

*Side by side.* The core-load model assumes stages sharing cores lose nothing
but the cores. Two XLA programs do lose more (their thread pools contend, their
caches thrash), and a learner process at idle priority gets only the rollout's
gaps. The placement probe measures both sides: generation's and the learner's
fraction of their own speed beside each other. Run side by side until one is
done, the other then alone, the rollout and the learner need
`side_by_side_us` per step, below their sum only where the fractions add up to
more than 1; a plan whose stages overlap is predicted at no more than that.

The *barrier plan* is the sync schedule under this scheduler: the fully
batched layout, and no segment starts while an update runs (the queue's
admission 0, see overlap.py), so rollout and updates take turns and each runs
alone: per env step, the rollout's time plus the update's. It is a candidate
wherever overlap may be probed on the run, and chosen where the best
overlapping plan predicts less; the run's overlap probe then checks the choice.

On a GPU shared by MPS, generation keeps every SM and the learner process gets
a share: the profile measures the learner's update and generation's call beside
it at a few shares, and `learner_share` scores each with this same model.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Iterable

from ebrl.layout import envs_per_group
from ebrl.resources.overlap import OverlapSwitch
from ebrl.resources.plan import STAGES, Plan
from ebrl.resources.profiler import Profile, learner_priority

if TYPE_CHECKING:
  from ebrl.spec import RunSpec


@dataclasses.dataclass(frozen=True)
class RunShape:
  """What the run fixes (the planner may not change it): envs and the learner's batch."""
  num_envs: int
  multitask: bool  # A multi-task MetaWorld env: one pool per task, each returning independently.
  rollout_length: int
  segments_per_update: int
  num_minibatches: int
  max_wait_ms: float = 1.0
  render_stage: bool = False  # env.render_stage: frames drawn by a stage of their own.
  learner_priority: str = "normal"  # A learner process's CPU priority ("idle": only the rollout's gaps).
  num_tasks: int = 1  # Task pools per env group (multitask).
  barrier: bool = False  # The barrier plan is a candidate (the run probes overlap against a barrier).

  @classmethod
  def of(cls, run: RunSpec) -> "RunShape":
    tasks = run.tasks
    return cls(num_envs=run.num_envs, multitask=tasks is not None, num_tasks=len(tasks) if tasks else 1,
               rollout_length=run.rollout_length, segments_per_update=run.layout.segments_per_update,
               num_minibatches=run.algorithm.num_minibatches, max_wait_ms=run.async_.max_wait_ms,
               render_stage=bool(run.env.render_stage), learner_priority=learner_priority(run),
               barrier=OverlapSwitch.allowed(run))


def fully_batched(profile: Profile, groups: int, recv_batch: int) -> bool:
  """Whether (groups, recv_batch) is the fully batched layout: one group receiving every env."""
  return groups == 1 and groups_batched(profile.shape["num_envs"], 1, recv_batch)


def groups_batched(num_envs: int, groups: int, recv_batch: int) -> bool:
  """Whether every group's recv returns all of its envs (sync-mode pools stepping together): the
  fully batched layout for one group; with several, each group's simulation and generation take
  turns while the other groups' fill the gap."""
  return recv_batch >= envs_per_group(num_envs, max(1, groups))


def stage_costs(profile: Profile, groups: int, recv_batch: int, placement: str = "threads") -> dict[str, float]:
  """CPU µs per env step of every stage when groups deliver recv_batch rows per recv and the
  sampler merges one recv of each group per generation call; with the learner in this process
  (threads) the rollout's host work pays what the profile measured of sharing the interpreter
  with it, in a learner process each update pays the copies of its batch and state instead."""
  gen_batch = recv_batch * groups
  batched = groups_batched(profile.shape["num_envs"], groups, recv_batch)
  sim = profile.sim_sync_cpu_us(recv_batch) if batched else profile.sim_cpu_us(recv_batch)
  host = profile.host_slowdown(placement)
  # Batched groups take turns, so their calls seldom meet in one generation batch.
  call = recv_batch if batched else gen_batch
  costs = {"sim": sim,
           "gen": host * profile.gen_cpu_us(call) / call,
           "train": profile.train_cpu_us_per_step(),
           "assemble": host * profile.assemble_cpu_us(gen_batch) / gen_batch}
  if profile.render:  # Every recv's envs are drawn in one call.
    costs["render"] = profile.render_cpu_us(recv_batch) / recv_batch
  return costs


def stage_caps(profile: Profile, cpu_sets: dict[str, tuple[int, ...]], sim_threads: int, pools: int,
               gen_batch: int, recv_batch: int, placement: str = "threads",
               learner_take: float = 0.0) -> dict[str, float]:
  """Each stage's rate limit from its own parallelism, whatever the other stages do (a generation
  call as long as the profile measured it beside the learner's updates with this placement).

  Batched groups are a chain (simulate, generate, simulate); a learner at the rollout's priority
  takes its share of the cores from that chain while it updates, `learner_take` (its part of the
  stages' CPU per step), so the chain runs that much slower; a learner process at idle priority
  only fills the chain's gaps (learner_take 0).
  """
  workers = min(sim_threads * pools, len(cpu_sets["sim"]))
  host = profile.host_slowdown(placement)
  gen_wall = host * profile.gen_wall_us(gen_batch)
  caps = {"sim": profile.sim_rate(workers),
          "gen": gen_batch * 1e6 / max(gen_wall, 1e-9),
          "train": profile.train_rate(),
          "assemble": math.inf}
  if profile.render:  # One draw at a time, whichever group it serves.
    caps["render"] = recv_batch * 1e6 / max(profile.render_wall_us(recv_batch), 1e-9)
  groups = gen_batch // max(recv_batch, 1)
  if groups_batched(profile.shape["num_envs"], groups, recv_batch):
    # Within a group simulation and generation take turns; the groups' turns interleave. With S a
    # group's step on the whole simulator and g one generation call for its envs, every group has
    # stepped once after max(groups x S, S + g, groups x g): one group alone is the chain S + g;
    # two fill one's generation with the other's simulation.
    step_s = recv_batch / max(caps["sim"], 1e-9)
    call_s = host * profile.gen_wall_us(recv_batch) * 1e-6
    caps["sim"] = (1.0 - learner_take) * gen_batch / max(groups * step_s, step_s + call_s, groups * call_s)
  return caps


def predict(costs: dict[str, float], cpu_sets: dict[str, tuple[int, ...]],
            caps: dict[str, float]) -> tuple[dict[str, float], float, str]:
  """(rate each stage sustains on its quota, e2e rate, bottleneck) under the core-load model,
  over the stages `costs` names (each needs a core set and a cap)."""
  stages = [s for s in STAGES if s in costs]
  load: dict[int, float] = {}
  for s in stages:
    for c in cpu_sets[s]:
      load[c] = load.get(c, 0.0) + costs[s] / len(cpu_sets[s])
  rates = {}
  for s in stages:
    worst = max(load[c] for c in cpu_sets[s])
    rates[s] = min(caps[s], 1e6 / worst if worst > 0 else math.inf)
  e2e = min(rates.values())
  # Ties (stages sharing the most loaded cores) name the one that costs the most there.
  bottleneck = min(stages, key=lambda s: (rates[s], -costs[s]))
  return rates, e2e, bottleneck


def side_by_side_us(rollout_us: float, train_us: float, speeds: tuple[float, float]) -> float:
  """Wall µs per env step of the rollout (`rollout_us` per step alone) and the learner
  (`train_us` alone) side by side, each at its measured fraction `speeds` of its own speed, until
  one is done; the other then finishes alone. One after the other they need the sum; this is
  below it exactly where the fractions add up to more than 1."""
  f_rollout, f_train = (max(f, 1e-9) for f in speeds)
  both = min(rollout_us / f_rollout, train_us / f_train)
  return both + (rollout_us - both * f_rollout) + (train_us - both * f_train)


def rollout_rate(profile: Profile, layout: dict[str, tuple[int, ...]], groups: int, recv: int, threads: int,
                 pools: int) -> float:
  """Env steps/s of the rollout alone (no learner beside it) with this layout and these sizes."""
  costs = {s: c for s, c in stage_costs(profile, groups, recv, "processes").items() if s != "train"}
  caps = stage_caps(profile, layout, threads, pools, recv * groups, recv, "processes")
  return predict(costs, layout, caps)[1]


def _base_layouts(cores: tuple[int, ...], splits: bool = True) -> Iterable[tuple[str, dict[str, tuple[int, ...]]]]:
  """Shared pool, then sim on a leading block with the rest shared or (splits) gen | train."""
  all_ = tuple(cores)
  yield "shared", {s: all_ for s in ("sim", "gen", "train", "assemble")}
  n = len(cores)
  for k in range(1, n):
    sim, rest = all_[:k], all_[k:]
    yield f"sim{k}", {"sim": sim, "gen": rest, "train": rest, "assemble": rest}
    for m in range(1, len(rest) if splits else 1):
      yield f"sim{k}-gen{m}", {"sim": sim, "gen": rest[:m], "assemble": rest[:m], "train": rest[m:]}


def _layouts(cores: tuple[int, ...], render: bool = False) -> Iterable[tuple[str, dict[str, tuple[int, ...]]]]:
  """The base layouts; with a render stage, each with render beside sim or on every core, then
  render on a leading block of its own with the base layouts (no gen | train split) after it."""
  if not render:
    yield from _base_layouts(cores)
    return
  all_ = tuple(cores)
  for name, layout in _base_layouts(cores):
    yield f"{name}-render_with_sim", {**layout, "render": layout["sim"]}
    if layout["sim"] != all_:
      yield f"{name}-render_shared", {**layout, "render": all_}
  for r in range(1, len(cores)):
    for name, layout in _base_layouts(all_[r:], splits=False):
      yield f"render{r}-{name}", {**layout, "render": all_[:r]}


def _group_choices(shape: RunShape) -> list[int]:
  if shape.multitask:
    # The task pools return independently already; a second group halves every pool's batch.
    return [g for g in (1, 2) if shape.num_envs >= shape.num_tasks * g and shape.num_envs % g == 0][:1]
  return [g for g in (1, 2, 4) if shape.num_envs % g == 0 and envs_per_group(shape.num_envs, g) >= 2]


def _batch_choices(shape: RunShape, cores: tuple[int, ...]) -> list[tuple[int, int]]:
  """Every (groups, recv batch) the planner scores: the async grid, then the fully batched layout.

  Not among them: several groups that each receive all their envs. The model scores them (a user
  may set them with resources=manual), but a run pays more than a profile of the simulator alone
  shows (BENCHMARKS.md: MetaWorld/MT10 with 160 envs in two such groups spent more CPU per env
  step than in one, well beyond the profile's sync-mode sim cost at 80 envs, and ran below sync).
  """
  choices = []
  for groups in _group_choices(shape):
    per_group = envs_per_group(shape.num_envs, groups)
    choices += [(groups, recv) for recv in _recv_choices(per_group, groups, _in_flight_need(shape, cores))]
  return choices + [(1, shape.num_envs)]


def _in_flight_need(shape: RunShape, cores: tuple[int, ...]) -> int:
  """Envs that must stay in flight while a batch waits for actions: one per core (at most half)."""
  return 0 if shape.multitask else min(len(cores), shape.num_envs // 2)


def _recv_choices(per_group: int, groups: int, need: int) -> list[int]:
  """A grid of recv batches plus the largest that keeps `need` envs in flight."""
  largest = per_group - max(1, -(-need // groups))
  grid = (per_group // 4, per_group // 2, (3 * per_group) // 4, largest)
  return sorted({b for b in grid if 1 <= b <= largest})


def _sim_threads(layout: dict[str, tuple[int, ...]], groups: int, shape: RunShape) -> tuple[int, int]:
  """(worker threads per EnvPool pool, number of pools) that fill the sim quota."""
  if shape.multitask:
    return 1, shape.num_tasks * groups  # A pool per task (MT10: ten) already covers a small machine's cores.
  return max(1, len(layout["sim"]) // groups), groups


def _render_placed(layout: dict, render: bool) -> dict:
  """The layout with a render stage no quota was given for beside sim (every plan of a run that
  renders names the render stage's cores, so its threads always have a quota)."""
  return {**layout, "render": layout["sim"]} if render and "render" not in layout else layout


def _make(mode: str, profile: Profile, shape: RunShape, layout: dict, groups: int, recv: int,
          notes: tuple[str, ...] = (), threads: int = 0, placement: str = "threads", barrier: bool = False) -> Plan:
  layout = _render_placed(layout, bool(profile.render) or shape.render_stage)
  auto_threads, pools = _sim_threads(layout, groups, shape)
  threads = threads or auto_threads
  gen_batch = recv * groups
  costs = stage_costs(profile, groups, recv, placement)
  idle = placement == "processes" and shape.learner_priority == "idle"
  caps = stage_caps(profile, layout, threads, pools, gen_batch, recv, placement,
                    learner_take=0.0 if idle else costs["train"] / max(sum(costs.values()), 1e-9))
  rates, e2e, bottleneck = predict(costs, layout, caps)
  rollout = rollout_rate(profile, layout, groups, recv, threads, pools)
  train_us = 1e6 / max(profile.train_rate(), 1e-9)
  if barrier:  # Rollout and updates take turns, each alone.
    e2e, bottleneck = 1e6 / (1e6 / max(rollout, 1e-9) + train_us), "rollout and updates in turn (barrier)"
  elif (speeds := profile.overlap_speeds(placement)) is not None:
    side = 1e6 / side_by_side_us(1e6 / max(rollout, 1e-9), train_us, speeds)
    if side < e2e:
      e2e, bottleneck = side, "rollout and updates slowing each other"
  sim = layout["sim"]
  contiguous = list(sim) == list(range(sim[0], sim[0] + len(sim)))
  # EnvPool pins worker i to core offset + i: only meaningful for one pool on a dedicated block.
  others = set(layout["gen"]) | set(layout.get("render", ()))
  offset = sim[0] if (pools == 1 and contiguous and set(sim).isdisjoint(others) and threads == len(sim)) else -1
  return Plan(mode=mode, cpu_sets={k: tuple(v) for k, v in layout.items()}, sim_threads=threads,
              thread_affinity_offset=offset, num_groups=groups, recv_batch=recv, max_gen_batch=gen_batch,
              max_wait_ms=shape.max_wait_ms, num_minibatches=shape.num_minibatches, stage_cost_us=costs,
              predicted_rates=rates, predicted_env_steps_per_s=e2e, bottleneck=bottleneck, notes=notes,
              placement=placement, barrier=barrier)


PROCESS_GAIN = 1.03  # The predicted speed-up that moves the learner into a process of its own.
# The predicted speed-up that plans a barrier: a learner at the rollout's priority that takes its
# share of the chain's cores predicts the same for overlapping and taking turns; ties overlap.
BARRIER_GAIN = 1.02


def placements(profile: Profile) -> tuple[str, ...]:
  """The learner placements a profile can predict: a learner process only where it was measured."""
  return ("threads", "processes") if profile.placement else ("threads",)


def plan_auto(profile: Profile, cores: tuple[int, ...], shape: RunShape, notes: tuple[str, ...] = (),
              fixed: tuple[int, int] | None = None, placement: str | None = None) -> Plan:
  """The plan with the highest predicted rate (ties: fewer groups, bigger batches, shared pool,
  the learner in this process).

  `fixed` = (groups, recv_batch) and `placement` keep what a running run cannot change (its
  simulators and its learner exist).
  """
  best: dict[str, Plan] = {}
  for where in ((placement,) if placement else placements(profile)):
    best_key = None
    for groups, recv in ([fixed] if fixed else _batch_choices(shape, cores)):
      for order, (_, layout) in enumerate(_layouts(cores, render=bool(profile.render))):
        plan = _make("auto", profile, shape, layout, groups, recv, notes, placement=where)
        key = (round(plan.predicted_env_steps_per_s, 6), -groups, recv, -order)
        if best_key is None or key > best_key:
          best[where], best_key = plan, key
  if not best:
    raise ValueError(f"no feasible plan for {shape.num_envs} envs")
  # A learner process costs a start-up and a second copy of the model: only for a clear gain.
  chosen = next(iter(best.values()))
  if "processes" in best and "threads" in best:
    gain = best["processes"].predicted_env_steps_per_s / max(best["threads"].predicted_env_steps_per_s, 1e-9)
    chosen = best["processes"] if gain >= PROCESS_GAIN else best["threads"]
  if shape.barrier and fixed is None:
    turns = plan_barrier(profile, cores, shape, notes, placement=placement or "threads")
    if turns.predicted_env_steps_per_s > BARRIER_GAIN * chosen.predicted_env_steps_per_s:
      return turns
  return chosen


def plan_barrier(profile: Profile, cores: tuple[int, ...], shape: RunShape, notes: tuple[str, ...] = (),
                 placement: str = "threads") -> Plan:
  """The sync schedule under this scheduler: the fully batched layout on a shared pool, rollout
  and updates in turn (the learner best in this process, unless placed: nothing runs beside it)."""
  _, layout = next(iter(_layouts(cores, render=bool(profile.render))))
  return _make("auto", profile, shape, layout, 1, shape.num_envs, notes, placement=placement, barrier=True)


def naive_layout(cores: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
  """Equal split: sim, gen and train each get a contiguous third of the cores (the last takes the
  remainder); with fewer cores than stages, the later stages share the last block. Bookkeeping
  runs on the sampler's thread, so it shares gen's block; a render stage, part of the
  simulator's side, shares sim's (_render_placed)."""
  n = len(cores)
  blocks = min(n, 3)
  size = n // blocks
  bounds = [(i * size, (i + 1) * size if i < blocks - 1 else n) for i in range(blocks)]
  get = lambda i: tuple(cores[bounds[min(i, blocks - 1)][0]:bounds[min(i, blocks - 1)][1]])
  return {"sim": get(0), "gen": get(1), "assemble": get(1), "train": get(2)}


def _unpredicted(mode: str, shape: RunShape, layout: dict, groups: int, recv: int, threads: int) -> Plan:
  layout = _render_placed(layout, shape.render_stage)
  return Plan(mode=mode, cpu_sets=layout, sim_threads=threads, thread_affinity_offset=-1, num_groups=groups,
              recv_batch=recv, max_gen_batch=recv * groups, max_wait_ms=shape.max_wait_ms,
              num_minibatches=shape.num_minibatches, stage_cost_us={}, predicted_rates={},
              predicted_env_steps_per_s=float("nan"), bottleneck="unknown (no profile)")


def plan_naive(shape: RunShape, cores: tuple[int, ...], groups: int, recv: int,
               profile: Profile | None = None) -> Plan:
  """Equal split, the config's own batch sizes, no runtime feedback."""
  layout = naive_layout(cores)
  if profile is not None:
    return _make("naive", profile, shape, layout, groups, recv)
  return _unpredicted("naive", shape, layout, groups, recv, _sim_threads(layout, groups, shape)[0])


def plan_manual(shape: RunShape, layout: dict[str, tuple[int, ...]], groups: int, recv: int, threads: int,
                profile: Profile | None = None) -> Plan:
  """The user's core sets and sizes (a render stage without its own: sim's), with a prediction
  when a profile is at hand."""
  layout = {**layout, "assemble": layout["gen"]}
  threads = threads or _sim_threads(layout, groups, shape)[0]
  if profile is None:
    return _unpredicted("manual", shape, layout, groups, recv, threads)
  return _make("manual", profile, shape, layout, groups, recv, threads=threads)


def work_conserving_bound(profile: Profile, cores: tuple[int, ...], shape: RunShape) -> dict[str, float]:
  """Cores / total CPU per step at the cheapest batching each stage was measured at, capped by the
  simulator alone on every core: no schedule of these stages beats it."""
  n = shape.num_envs
  most = max(p["cores"] for p in profile.sim)
  # The cheapest measured: async recvs can cost less per step than stepping every env (MT10's
  # pools), and generation pads to a power of two, so a call for all envs is not always cheapest.
  costs = {"sim": min(p["cpu_us_per_step"] for p in profile.sim if p["cores"] == most),
           "gen": min(profile.gen_cpu_us(b) / b for b in range(1, n + 1)),
           "train": profile.train_cpu_us_per_step(),
           "assemble": profile.assemble_cpu_us(n) / n}
  rate = profile.sim_rate(len(cores))
  if profile.render:  # Draws one after another: capped by back-to-back draws at the cheapest batch.
    costs["render"] = min(p["cpu_us"] / p["batch"] for p in profile.render)
    rate = min(rate, max(p["batch"] * 1e6 / max(p["wall_us"], 1e-9) for p in profile.render))
  total = sum(costs.values())
  rate = min(len(cores) * 1e6 / total, rate)
  return {"env_steps_per_s": rate, "cpu_us_per_step": total, **{f"{k}_us": v for k, v in costs.items()}}


def learner_share(profile: Profile, shape: RunShape, plan: Plan) -> tuple[int, float] | None:
  """The learner process's SM share under MPS for `plan`: of the shares the profile measured, the
  one whose predicted rate is highest ((percent, rate); ties within 1% go to the smaller share,
  which leaves generation the most), or None where no shares were measured.

  Each measured share is a profile of its own (Profile.at_learner_share: updates as long as at
  that share, generation calls as long as beside them), scored by the same model as every plan,
  so a share is chosen for what it does to the run's rate, not to one stage's.
  """
  if not profile.sm_shares:
    return None
  scored = []
  for point in profile.sm_shares:
    at = profile.at_learner_share(point)
    rate = _make(plan.mode, at, shape, plan.cpu_sets, plan.num_groups, plan.recv_batch,
                 threads=plan.sim_threads, placement="processes").predicted_env_steps_per_s
    scored.append((int(point["sm_percent"]), rate))
  top = max(rate for _, rate in scored)
  return min((p, rate) for p, rate in scored if rate >= 0.99 * top)
