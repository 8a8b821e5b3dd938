"""Stage profiles: what each stage costs on this machine, measured in a short calibration.

The planner needs numbers, not guesses: CPU microseconds per env step of the
simulator at a given recv batch (EnvPool's per-call overhead is amortised over
the batch), its wall rate against worker threads, the sampler's latency and
CPU per call against batch size, the learner's time per update against the
number of samples, and the host bookkeeping per step. Each is timed for a
fraction of a second after a warm-up, with process CPU time beside wall time,
so costs stay right when a stage's library spreads work over several threads.

A profile depends on the machine and on the run's shapes, not on the schedule,
so it is saved as JSON (`profile.json`) and reused while both match
(`load_or_measure`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from ebrl.resources.inventory import Inventory
from policies.base import action_size

if TYPE_CHECKING:
  from ebrl.spec import RunSpec

_WARMUP_S = 0.2


PROFILE_VERSION = 7  # Bumped when what a profile measures changes: older cached files are measured again.


def run_shape(run: RunSpec) -> dict[str, Any]:
  """The config values a profile depends on (anything else may change freely)."""
  return {"version": PROFILE_VERSION, "env": run.env.name, "num_envs": int(run.num_envs),
          "from_pixels": bool(run.env.from_pixels),
          "render_stage": bool(run.env.render_stage), "render_size": int(run.env.render_size),
          # Every policy setting: a vla's decoding mode and size, a flow's denoising steps, the chunk
          # change what generation and updates cost as much as the policy's name does.
          "policy": json.loads(json.dumps(dataclasses.asdict(run.policy))), "rollout_length": int(run.rollout_length),
          "segments_per_update": int(run.layout.segments_per_update),
          "epochs": int(run.algorithm.epochs), "num_minibatches": int(run.algorithm.num_minibatches),
          "correction": run.algorithm.correction,
          # Per-token ratios and a reference policy change what an update computes.
          "ratio_level": str(run.algorithm.ratio_level), "reference": float(run.algorithm.ref_kl_coef) > 0,
          # What the placement probe's learner process ran at (it slows generation beside it or not).
          "learner_priority": learner_priority(run)}


def learner_priority(run: RunSpec) -> str:
  """The learner process's CPU priority this run would get (learner_process.resolve_priority)."""
  import jax  # pylint: disable=g-import-not-at-top

  from ebrl.learner_process import resolve_priority  # pylint: disable=g-import-not-at-top
  return resolve_priority(run.quotas.learner_priority, jax.default_backend())


@dataclasses.dataclass
class Profile:
  """Measured points per stage, and the interpolations the planner reads them through.

  sim:      {cores, threads, batch, env_steps_per_s, cpu_us_per_step}: the simulator pinned to
            `cores` cores with `threads` EnvPool workers per pool; batch = the adapter's recv batch
  gen:      {batch, wall_us, cpu_us} per sampler call (batches are powers of two: the sampler pads)
  train:    {samples, wall_s, cpu_s} per update
  assemble: {batch, cpu_us} per batch of rows closed and started
  render:   {batch, wall_us, cpu_us} per draw of the render stage (env.render_stage only; then
            `sim` is the state simulator alone. EnvPool's pixel pools draw inside their workers,
            so there rendering is part of `sim`)
  """
  fingerprint: dict[str, Any]
  shape: dict[str, Any]
  sim: list[dict[str, float]]
  gen: list[dict[str, float]]
  train: list[dict[str, float]]
  assemble: list[dict[str, float]]
  render: list[dict[str, float]] | None = None
  # The rollout's host work (a generation call at the full batch) while updates
  # run back to back beside it: {batch, alone_us, threads_us, processes_us} wall µs per call, the
  # updates in a thread of this process or in a learner process, and {threads,processes}_update_s,
  # those updates' wall seconds beside the calls. None: not measured.
  placement: dict[str, float] | None = None
  # Under MPS: the learner process at a few SM shares, {sm_percent, update_s, gen_us}: wall seconds
  # per update with that share, and wall µs of a generation call for every env (this process, every
  # SM) while those updates run. None: not measured (no MPS).
  sm_shares: list[dict[str, float]] | None = None
  measured_s: float = 0.0

  # -- what the planner reads --------------------------------------------------

  def sim_cpu_us(self, batch: int) -> float:
    """CPU µs per env step with recvs of `batch` envs: step cost + per-call cost / batch,
    fitted to the points on the most cores (the planner runs sim on its whole quota)."""
    most = max(p["cores"] for p in self.sim)
    pts = sorted((p["batch"], p["cpu_us_per_step"]) for p in self.sim
                 if p["cores"] == most and p.get("async", p["batch"] < self.shape["num_envs"]))
    if not pts:
      return self.sim_sync_cpu_us()
    if len(pts) == 1:
      return pts[0][1]
    x = np.array([1.0 / b for b, _ in pts])
    y = np.array([c for _, c in pts])
    call, step = np.polyfit(x, y, 1)  # cost = step + call / batch, least squares over async points.
    return float(max(step, 0.0) + max(call, 0.0) / batch)

  def sim_sync_cpu_us(self, batch: int | None = None) -> float:
    """CPU µs per env step stepping every env at once (the cheapest batching there is); with
    `batch`, stepping sync-mode pools of `batch` of the envs together (batched groups): the
    per-call cost the async fit measured, over fewer envs."""
    most = max(p["cores"] for p in self.sim)
    n = self.shape["num_envs"]
    full = min(p["cpu_us_per_step"] for p in self.sim if p["cores"] == most and p["batch"] == n)
    if batch is None or batch >= n:
      return full
    return full + max(0.0, self.sim_cpu_us(batch) - self.sim_cpu_us(n))

  def sim_rate(self, cores: float) -> float:
    """Env steps/s the simulator alone reaches on `cores` cores (linear between points)."""
    full = max(p["batch"] for p in self.sim)
    pts = sorted((p["cores"], p["env_steps_per_s"]) for p in self.sim if p["batch"] == full)
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    if cores <= xs[-1]:
      return float(np.interp(cores, [0.0] + xs, [0.0] + ys))
    return ys[-1] * cores / xs[-1]  # Beyond the measured cores: linear (more workers, more cores).

  def _gen(self, batch: int, key: str) -> float:
    size = 1 << max(0, (int(batch) - 1).bit_length())  # The sampler pads to a power of two.
    pts = sorted((p["batch"], p[key]) for p in self.gen)
    return float(np.interp(size, [b for b, _ in pts], [v for _, v in pts]))

  def gen_cpu_us(self, batch: int) -> float:
    """CPU µs of one generation call serving `batch` rows."""
    return self._gen(batch, "cpu_us")

  def gen_wall_us(self, batch: int) -> float:
    return self._gen(batch, "wall_us")

  def train_cpu_us_per_step(self) -> float:
    p = max(self.train, key=lambda p: p["samples"])
    return p["cpu_s"] * 1e6 / p["samples"]

  def train_rate(self) -> float:
    """Samples/s the learner digests (updates back to back)."""
    p = max(self.train, key=lambda p: p["samples"])
    return p["samples"] / p["wall_s"]

  def assemble_cpu_us(self, batch: int) -> float:
    pts = sorted((p["batch"], p["cpu_us"]) for p in self.assemble)
    return float(np.interp(batch, [b for b, _ in pts], [v for _, v in pts]))

  def _render(self, batch: int, key: str) -> float:
    """Per-draw cost at `batch` frames: linear in the frames between points, per-frame beyond."""
    pts = sorted((p["batch"], p[key]) for p in self.render or ())
    if not pts:
      return 0.0
    xs, ys = [b for b, _ in pts], [v for _, v in pts]
    if batch > xs[-1]:
      return ys[-1] * batch / xs[-1]
    if batch < xs[0]:
      return ys[0] * batch / xs[0]
    return float(np.interp(batch, xs, ys))

  def render_cpu_us(self, batch: int) -> float:
    """CPU µs of one draw of `batch` frames (0 without a render stage)."""
    return self._render(batch, "cpu_us")

  def render_wall_us(self, batch: int) -> float:
    return self._render(batch, "wall_us")

  def host_slowdown(self, placement: str) -> float:
    """How much longer the rollout's host work takes with the learner placed so, relative to a
    learner process (1 for processes; both measured beside the same updates on the same cores,
    so what differs is sharing one interpreter, not cores). 1 when not measured."""
    p = self.placement
    if not p or placement == "processes":
      return 1.0
    return max(1.0, p["threads_us"] / max(p["processes_us"], 1e-9))

  def overlap_speeds(self, placement: str) -> tuple[float, float] | None:
    """(generation's, the learner's) fraction of its own speed while the other runs beside it
    with the learner placed so, as the placement probe measured them; None when not measured.

    Their sum says whether overlap pays at all: above 1 the two side by side get more done than
    one after the other; below, they slow each other more than they gain (XLA's thread pools of
    two programs contending for the same few cores; a learner at idle priority that only gets
    the rollout's gaps)."""
    p = self.placement
    if not p or f"{placement}_update_s" not in p:
      return None
    update_s = max(self.train, key=lambda q: q["samples"])["wall_s"]
    return (min(1.0, p["alone_us"] / max(p[f"{placement}_us"], 1e-9)),
            min(1.0, update_s / max(p[f"{placement}_update_s"], 1e-9)))

  def at_learner_share(self, point: dict[str, float]) -> "Profile":
    """This profile as it stands with the learner process at one measured SM share: its updates
    take that point's time (scaled as this profile's own updates are, so a drifted train cost
    carries over) and generation calls that point's time beside them."""
    d = json.loads(json.dumps(self.to_dict()))
    full = max(self.sm_shares or [point], key=lambda p: p["sm_percent"])
    train_scale = point["update_s"] / max(full["update_s"], 1e-12)
    for p in d["train"]:
      p["wall_s"] *= train_scale
    n = int(self.shape["num_envs"])
    gen_scale = point["gen_us"] / max(self.gen_wall_us(n), 1e-9)
    for p in d["gen"]:
      p["wall_us"] *= gen_scale
    return Profile.from_dict(d)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "Profile":
    names = {f.name for f in dataclasses.fields(cls)}
    d = {k: v for k, v in d.items() if k in names}  # Older files may carry retired keys.
    if not isinstance(d.get("render"), list):  # Version 1 kept a sim difference here, not draws.
      d["render"] = None
    return cls(**d)

  def with_extra(self, stage: str, us_per_step: float) -> "Profile":
    """This profile with `us_per_step` CPU µs added to every env step of one stage (negative: removed).

    Runtime feedback measures a *change in CPU per env step*, which is additive
    (a burn of 110 µs per step costs 110 µs whatever the batch), not a factor.
    A stage never drops below a tenth of its profiled cost: a negative change
    the noise overstated must not make a stage free.
    """
    d = json.loads(json.dumps(self.to_dict()))
    x = float(us_per_step)
    if stage == "sim":
      for p in d["sim"]:
        new = max(p["cpu_us_per_step"] + x, 0.1 * p["cpu_us_per_step"])
        # The extra work spreads over the point's cores like the stepping does.
        wall_us = 1e6 / p["env_steps_per_s"] + (new - p["cpu_us_per_step"]) / p["cores"]
        p["cpu_us_per_step"], p["env_steps_per_s"] = new, 1e6 / wall_us
    elif stage == "gen":
      for p in d["gen"]:
        p["cpu_us"] = max(p["cpu_us"] + x * p["batch"], 0.1 * p["cpu_us"])
        p["wall_us"] = max(p["wall_us"] + x * p["batch"], 0.1 * p["wall_us"])
    elif stage == "train":
      for p in d["train"]:
        p["cpu_s"] = max(p["cpu_s"] + x * p["samples"] * 1e-6, 0.1 * p["cpu_s"])
        p["wall_s"] = max(p["wall_s"] + x * p["samples"] * 1e-6, 0.1 * p["wall_s"])
    elif stage == "assemble":
      for p in d["assemble"]:
        p["cpu_us"] = max(p["cpu_us"] + x * p["batch"], 0.1 * p["cpu_us"])
    elif stage == "render" and d["render"]:
      for p in d["render"]:
        p["cpu_us"] = max(p["cpu_us"] + x * p["batch"], 0.1 * p["cpu_us"])
        p["wall_us"] = max(p["wall_us"] + x * p["batch"], 0.1 * p["wall_us"])
    else:
      stages = "sim, gen, train, assemble" + (", render" if d["render"] else "")
      raise ValueError(f"unknown stage {stage!r}; stages: {stages}")
    return Profile.from_dict(d)


# -- measurements -----------------------------------------------------------------


def _timed(fn, seconds: float) -> tuple[int, float, float, float]:
  """Runs fn() (returning units of work) for `seconds` after a warm-up: (units, wall, cpu, calls)."""
  end = time.perf_counter() + _WARMUP_S
  while time.perf_counter() < end:
    fn()
  units, calls = 0, 0
  w0, c0 = time.perf_counter(), time.process_time()
  while time.perf_counter() - w0 < seconds:
    units += fn()
    calls += 1
  return units, time.perf_counter() - w0, time.process_time() - c0, calls


@contextlib.contextmanager
def _on_cores(cores: tuple[int, ...]) -> Iterator[Callable[..., None]]:
  """Runs the block on `cores`: the calling thread at once, and every thread started since (plus
  `extra`) when the block calls the yielded `pin_new(extra=())`. The caller's mask comes back after."""
  from ebrl.resources import enforce

  before, mine = enforce.thread_ids(), tuple(sorted(os.sched_getaffinity(0)))
  enforce.pin(0, cores)

  def pin_new(extra=()) -> None:
    for tid in (enforce.thread_ids() - before) | set(extra):
      with contextlib.suppress(OSError):  # A thread that already ended.
        enforce.pin(tid, cores)

  try:
    yield pin_new
  finally:
    enforce.pin(0, mine)


def measure_sim(run: RunSpec, cores: tuple[int, ...], threads: int, batch: int | None,
                seconds: float) -> dict[str, float]:
  """Steps the run's env with random actions on `cores` only (its workers and this thread pinned
  there): sync (batch None) or async recv/send of `batch`."""
  from sim_adapters import make_adapter
  from sim_adapters.base import gather_all

  n = run.num_envs
  # A render stage is a stage of its own (measure_render): the simulator under it is a state pool.
  pixels = run.env.from_pixels and not run.env.render_stage
  with _on_cores(cores) as pin_new:
    adapter = make_adapter(run.env.name, n, batch_size=batch, num_threads=threads, seed=run.seed,
                           max_episode_steps=run.env.max_episode_steps, from_pixels=pixels,
                           render_size=run.env.render_size, chunk_size=run.policy.chunk_size,
                           reward_type=run.env.reward_type)
    rng = np.random.default_rng(0)
    spec = adapter.spec
    low, high = spec.action_low, spec.action_high
    try:
      adapter.reset()
      if batch is None:
        # The first observations come from recv: a step sent to an env still resetting would
        # race its reset on another EnvPool worker.
        gather_all(adapter, n)
        step = lambda: len(adapter.step(rng.uniform(low, high, (n, spec.action_dim)).astype(np.float32)))

        def one():
          return step()
      else:
        def one():
          b = adapter.recv()
          adapter.send(rng.uniform(low, high, (len(b), spec.action_dim)).astype(np.float32), b.env_ids)
          return len(b)
      pin_new()  # Workers the pool or its reset started.
      steps, wall, cpu, _ = _timed(one, seconds)
    finally:
      adapter.close()
  return {"cores": len(cores), "threads": threads, "batch": batch or n, "async": batch is not None,
          "env_steps_per_s": steps / wall,
          "cpu_us_per_step": cpu * 1e6 / max(steps, 1)}


def measure_render(run: RunSpec, cores: tuple[int, ...], batches: list[int], seconds: float) -> list[dict[str, float]]:
  """Times the render stage's draws of `batch` frames (on its render thread, with Mesa's threads,
  all pinned to `cores`), from states a few random steps into their episodes."""
  from sim_adapters import make_adapter
  from sim_adapters.base import gather_all
  from sim_adapters.render_stage import render_thread_ids

  n = run.num_envs
  out = []
  with _on_cores(cores) as pin_new:
    adapter = make_adapter(run.env.name, n, num_threads=len(cores), seed=run.seed,
                           max_episode_steps=run.env.max_episode_steps, from_pixels=True,
                           render_size=run.env.render_size, render_stage=True)
    try:
      adapter.reset()
      gather_all(adapter, n)
      rng = np.random.default_rng(0)
      spec = adapter.spec
      for _ in range(3):
        adapter.step(rng.uniform(spec.action_low, spec.action_high, (n, spec.action_dim)).astype(np.float32))
      pin_new(render_thread_ids())  # The pool's workers, the render thread and Mesa's threads.
      for b in batches:
        ids = np.arange(b, dtype=np.int32) % n
        _, wall, cpu, calls = _timed(lambda: (adapter.draw(ids), b)[1], seconds)
        out.append({"batch": b, "wall_us": wall * 1e6 / calls, "cpu_us": cpu * 1e6 / calls})
    finally:
      adapter.close()
  return out


def _zeros_obs(spec, n: int) -> dict[str, np.ndarray]:
  return {k: np.zeros((n,) + v.shape, v.dtype) for k, v in spec.obs.items()}


def measure_gen(sampler, spec, batches: list[int], seconds: float) -> list[dict[str, float]]:
  out = []
  for b in batches:
    obs = _zeros_obs(spec, b)
    _, wall, cpu, calls = _timed(lambda: (sampler.act(obs, pad=True), 1)[1], seconds)
    out.append({"batch": b, "wall_us": wall * 1e6 / calls, "cpu_us": cpu * 1e6 / calls})
  return out


def measure_train(learner, spec, horizon: int, segments: list[int], seconds: float,
                  key_seed: int = 0) -> list[dict[str, float]]:
  import jax

  out = []
  width = action_size(learner.policy, spec)
  for s in segments:
    batch = _segment_batch(spec, horizon, s, width)
    box = [learner.init(jax.random.PRNGKey(key_seed))]

    def update():
      box[0], _ = learner.update_segments(box[0], batch)
      jax.block_until_ready(box[0])
      return horizon * s

    samples, wall, cpu, calls = _timed(update, seconds)
    out.append({"samples": horizon * s, "wall_s": wall / calls, "cpu_s": cpu / calls})
  return out


def _beside(update_learner, batch, one: Callable[[], int], seconds: float) -> tuple[float, float]:
  """(wall µs per `one()` call, wall seconds per update) while `update_learner` updates on `batch`
  back to back in a thread, as a run's learner thread drives it (the first update, compiling, is
  not timed)."""
  import threading

  import jax

  stop, box, done, failed = threading.Event(), [update_learner.init(jax.random.PRNGKey(0))], [0, 0.0], []

  def loop():
    try:
      while not stop.is_set():
        t0 = time.perf_counter()
        box[0], _ = update_learner.update_segments(box[0], batch)
        jax.block_until_ready(box[0])
        done[0], done[1] = done[0] + 1, done[1] + time.perf_counter() - t0
    except BaseException as e:  # pylint: disable=broad-except  # Re-raised below: never "0 s per update".
      failed.append(e)

  box[0], _ = update_learner.update_segments(box[0], batch)
  th = threading.Thread(target=loop, daemon=True)
  th.start()
  try:
    _, wall, _, calls = _timed(one, seconds)
    while done[0] == 0 and th.is_alive():  # At least one timed update, however long it takes.
      one()
  finally:
    stop.set()
    th.join()
  if failed:
    raise RuntimeError(f"the timed updates failed: {type(failed[0]).__name__}: {failed[0]}") from failed[0]
  return wall * 1e6 / calls, done[1] / done[0]


def _gen_call(sampler, spec, num_envs: int) -> Callable[[], int]:
  obs = _zeros_obs(spec, num_envs)

  def one():
    sampler.act(obs, pad=True)
    return 1
  return one


def measure_placement(learner, sampler, spec, num_envs: int, horizon: int, segments: int, seconds: float,
                      remote_factory: Callable[[], Any]) -> dict[str, float]:
  """Wall µs of one generation call for every env: alone, beside updates
  looping in a thread, and beside the same updates in a learner process (`remote_factory()` makes
  a RemoteLearner; its updates are driven from a thread here, as a run drives them); and the wall
  seconds of those updates beside the calls. Both sides' slowdowns together say whether running
  them side by side beats running them one after the other (Profile.overlap_speeds)."""
  batch = _segment_batch(spec, horizon, segments, action_size(learner.policy, spec))
  one = _gen_call(sampler, spec, num_envs)
  _, wall, _, calls = _timed(one, seconds)
  out = {"batch": num_envs, "alone_us": wall * 1e6 / calls}
  out["threads_us"], out["threads_update_s"] = _beside(learner, batch, one, seconds)
  remote = remote_factory()
  try:
    out["processes_us"], out["processes_update_s"] = _beside(remote, batch, one, seconds)
  finally:
    remote.close()
  return out


SM_SHARES = (25, 50, 75, 100)  # The learner process's SM percentages the MPS profile measures.


def measure_sm_shares(sampler, spec, num_envs: int, horizon: int, segments: int, seconds: float,
                      remote_at: Callable[[int], Any], action_width: int,
                      shares: tuple[int, ...] = SM_SHARES) -> list[dict[str, float]]:
  """The learner process at each SM share (`remote_at(percent)` starts one with that
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): its time per update, and a generation call's time here
  beside it. Both move with the share: the learner's kernels get fewer SMs, and generation's
  compete with fewer of the learner's. `action_width` is the policy's raw action width (the update
  batch's actions)."""
  batch = _segment_batch(spec, horizon, segments, action_width)
  one = _gen_call(sampler, spec, num_envs)
  points = []
  for percent in shares:
    remote = remote_at(percent)
    try:
      gen_us, update_s = _beside(remote, batch, one, seconds)
    finally:
      remote.close()
    points.append({"sm_percent": int(percent), "update_s": update_s, "gen_us": gen_us})
  return points


def _segment_batch(spec, horizon: int, s: int, width: int):
  """A segment batch of zeros whose actions are `width` wide: the policy's raw action (a flow policy's
  carries its denoising chain beside the env's action)."""
  from ebrl.types import SegmentBatch

  return SegmentBatch(
      obs={k: np.zeros((horizon + 1, s) + v.shape, v.dtype) for k, v in spec.obs.items()},
      actions=np.zeros((horizon, s, width), np.float32), logp=np.zeros((horizon, s), np.float32),
      rewards=np.zeros((horizon, s), np.float32), terminated=np.zeros((horizon, s), bool),
      done=np.zeros((horizon, s), bool), valid=np.ones((horizon, s), bool),
      version=np.zeros((horizon, s), np.int32))


def measure_assemble(spec, num_envs: int, horizon: int, batches: list[int], seconds: float) -> list[dict[str, float]]:
  """Host bookkeeping per batch: closing transitions, starting new ones, episode stats."""
  from ebrl.trajectories.assembler import TrajectoryAssembler
  from ebrl.sampler import Actions
  from ebrl.telemetry.episodes import EpisodeTracker
  from sim_adapters.base import StepBatch

  out = []
  for b in batches:
    sink: list = []
    assembler = TrajectoryAssembler(spec, num_envs, horizon, sink.append)
    tracker = EpisodeTracker(num_envs, spec.has_success)
    cursor = [0]
    zeros = np.zeros(b, np.float32)
    acts = Actions(np.zeros((b, spec.action_dim), np.float32), np.zeros((b, spec.action_dim), np.float32),
                   zeros, zeros)

    def one():
      ids = (np.arange(b) + cursor[0]) % num_envs
      cursor[0] += b
      rows = StepBatch(obs=_zeros_obs(spec, b), reward=zeros, terminated=np.zeros(b, bool),
                       truncated=np.zeros(b, bool), success=zeros, env_ids=ids.astype(np.int32),
                       reset_step=np.zeros(b, bool))
      tracker.observe(rows)
      assembler.complete(rows.env_ids, rows)
      assembler.start(rows.env_ids, rows.obs, acts, 0)
      sink.clear()
      return b

    _, wall, _, calls = _timed(one, seconds)
    # Single-threaded numpy: wall time is its CPU time, without other threads' noise.
    out.append({"batch": b, "cpu_us": wall * 1e6 / calls})
  return out


def _placeholder_demos(spec, n: int) -> dict:
  """Zero demo rows shaped as the env's: the demonstration term costs the same on any values, so the
  update is timed with it without reading the run's demos."""
  return {"obs": {k: np.zeros((n,) + tuple(v.shape), v.dtype) for k, v in spec.obs.items()},
          "actions": np.zeros((n, spec.action_dim), np.float32), "mask": np.ones((n, spec.action_dim), np.float32)}


def _pow2_upto(n: int) -> list[int]:
  top = 1 << max(0, (n - 1).bit_length())
  return [1 << k for k in range(top.bit_length()) if (1 << k) <= top]


def measure(run: RunSpec, inventory: Inventory, *, policy=None, spec=None, full: bool = False,
            seconds: float = 0.5, log=print, placement_probe: bool = True, mps_pipe_dir: str = "") -> Profile:
  """Calibrates every stage for this run's shapes (about 10-20 s; `full` adds update sizes; with
  `mps_pipe_dir`, a running MPS daemon's, the learner process at each of SM_SHARES too)."""
  import jax

  from ebrl.learner import Learner
  from ebrl.sampler import Sampler
  from ebrl.learner import LearnerConfig
  from ebrl.param_store import ParamStore
  from policies import make_policy

  t0 = time.perf_counter()
  usable = inventory.cpu_cores
  n = run.num_envs
  tasks = run.tasks
  # A multi-task env runs one worker per task pool (MT10's ten pools already outnumber small machines' cores).
  threads = (lambda k: 1) if tasks is not None else (lambda k: k)
  counts = sorted({1, len(usable)})
  sim = []
  log(f"[profile] sim: {run.env.name}, {n} envs, on {counts} cores")
  for k in counts:
    sim.append(measure_sim(run, usable[:k], threads(k), None, seconds))
  # Async recv batches: the per-call cost the planner trades against batch.
  for b in sorted({n // 4, n // 2, n - max(1, n // 8)}):
    if 1 <= b < n:
      sim.append(measure_sim(run, usable, threads(len(usable)), b, seconds))
  render = None
  if run.env.render_stage:
    batches = sorted({max(1, n // 4), max(1, n // 2), n})
    log(f"[profile] render: draws of {batches} frames")
    render = measure_render(run, usable, batches, seconds)
  if spec is None:
    from sim_adapters import make_adapter
    probe = make_adapter(run.env.name, min(n, len(tasks)) if tasks is not None else 1,
                         from_pixels=run.env.from_pixels, render_size=run.env.render_size,
                         render_stage=run.env.render_stage, chunk_size=run.policy.chunk_size)
    spec = probe.spec
    probe.close()
  policy = policy or make_policy(run.policy.name, spec, run.policy)
  layout = run.layout
  learner = Learner(policy, LearnerConfig.of(run.algorithm, layout, run.max_staleness),
                    demos=_placeholder_demos(spec, run.algorithm.bc_batch_size) if run.algorithm.bc_coef > 0 else None)
  store = ParamStore()
  store.publish(learner.init(jax.random.PRNGKey(0)))
  sampler = Sampler(policy, spec, store, seed=0)
  log(f"[profile] gen: batches {_pow2_upto(n)}")
  gen = measure_gen(sampler, spec, _pow2_upto(n), seconds / 2)
  segments = layout.segments_per_update
  sizes = sorted({segments, max(1, segments // 2)}) if full else [segments]
  log(f"[profile] train: {[s * run.rollout_length for s in sizes]} samples per update")
  train = measure_train(learner, spec, run.rollout_length, sizes, max(seconds, 1.0))
  assemble = measure_assemble(spec, n, run.rollout_length, sorted({8, 32, n}), seconds / 2)
  placement = sm_shares = None
  if placement_probe or mps_pipe_dir:
    from ebrl.learner_process import LearnerProcessSpec, RemoteLearner, shared_memory_bytes
    from ebrl.resources import mps
    from ebrl.transport import shm

    remote_spec = LearnerProcessSpec(policy_name=run.policy.name, policy_cfg=run.policy, env_spec=spec,
                                     learner_cfg=learner.cfg, rollout_length=run.rollout_length,
                                     segments_per_update=segments, action_size=action_size(policy, spec),
                                     priority=learner_priority(run))
    needed = shared_memory_bytes(learner, remote_spec)
    if not shm.fits(needed):  # The plan then keeps the learner in the run's process.
      log(f"[profile] placement: not measured: a learner process needs {needed / 2**20:,.1f} MiB of "
          f"{shm.SHM_DIR}, which has {(shm.free_bytes() or 0) / 2**20:,.1f} MiB free (placement=threads only)")
      placement_probe, mps_pipe_dir = False, ""
    if placement_probe:
      log("[profile] placement: generation beside updates in a thread, then in a learner process")
      placement = measure_placement(learner, sampler, spec, n, run.rollout_length, segments, max(seconds, 1.0),
                                    lambda: RemoteLearner(learner, remote_spec))
    if mps_pipe_dir:
      from ebrl.resources.gpu_sharing import LEARNER_MEM_FRACTION

      log(f"[profile] SM shares: the learner process at {list(SM_SHARES)}% of the SMs under MPS")
      def at(percent: int) -> RemoteLearner:
        base = dict(os.environ)  # What the learner process inherits from this one.
        env = {**mps.stage_env(percent, LEARNER_MEM_FRACTION, mps_pipe_dir, base=base), **ON_DEMAND_GPU_MEMORY}
        changed, removed = mps.env_change(env, base)
        return RemoteLearner(learner, dataclasses.replace(remote_spec, env=tuple(sorted(changed.items())),
                                                          unset_env=removed))

      sm_shares = measure_sm_shares(sampler, spec, n, run.rollout_length, segments, max(seconds, 1.0), at,
                                    action_size(policy, spec))
  prof = Profile(fingerprint=inventory.fingerprint(), shape=run_shape(run), sim=sim, gen=gen, train=train,
                 assemble=assemble, render=render, placement=placement, sm_shares=sm_shares)
  prof.measured_s = time.perf_counter() - t0
  return prof


def cache_path(run: RunSpec, inventory: Inventory) -> str:
  root = os.environ.get("EBRL_PROFILE_CACHE", os.path.expanduser("~/.cache/ebrl/profiles"))
  key = json.dumps({"fp": inventory.fingerprint(), "shape": run_shape(run)}, sort_keys=True)
  return os.path.join(root, hashlib.sha1(key.encode()).hexdigest()[:16] + ".json")


def load(path: str) -> Profile:
  with open(path) as f:
    d = json.load(f)
  return Profile.from_dict(d.get("profile", d))  # A launch.profile output or a bare profile.


def save(profile: Profile, path: str) -> None:
  from ebrl.telemetry.writers import write_json
  write_json(path, profile.to_dict())


def load_or_measure(run: RunSpec, inventory: Inventory, log=print, **kwargs) -> Profile:
  """The cached profile when hardware and shapes match, else a fresh calibration (then cached)."""
  path = cache_path(run, inventory)
  if os.path.exists(path):
    try:
      p = load(path)
      wants_shares = bool(kwargs.get("mps_pipe_dir")) and not p.sm_shares  # Cached before MPS ran.
      if p.fingerprint == inventory.fingerprint() and p.shape == run_shape(run) and not wants_shares:
        log(f"[profile] reusing {path}")
        return p
    except (OSError, ValueError, TypeError, KeyError):
      pass  # A stale or damaged cache entry: measure again.
  p = measure_in_subprocess(run, log=log, **kwargs)
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save(p, path)
  except OSError:
    pass  # A read-only home still trains; it only measures again next time.
  return p


ON_DEMAND_GPU_MEMORY = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def _measure_child(run: RunSpec, out: str, cache_dir: str | None, kwargs: dict[str, Any], parent_pid: int) -> None:
  from ebrl import spawn  # pylint: disable=g-import-not-at-top

  spawn.ignore_group_signals()  # A Ctrl-C or SIGTERM to the group is the run's to act on ...
  spawn.die_with_parent(parent_pid)  # ... and a run that dies takes its calibration with it.
  # On a GPU the run's process already holds its preallocated fraction while it calibrates: this
  # process and the learner processes it starts take memory as they need it (set before JAX's
  # backend starts here; the learner processes inherit it).
  os.environ.update(ON_DEMAND_GPU_MEMORY)
  import jax  # pylint: disable=g-import-not-at-top

  from ebrl.resources.inventory import take_inventory  # pylint: disable=g-import-not-at-top
  if cache_dir:  # The parent's compilation cache: the run then reuses what calibration compiled.
    jax.config.update("jax_compilation_cache_dir", cache_dir)
  save(measure(run, take_inventory(), **kwargs), out)


def measure_in_subprocess(run: RunSpec, log=print, **kwargs) -> Profile:
  """`measure` in a fresh process, whose simulators and compiled functions die with it.

  Why a process: the calibration builds and closes a dozen EnvPool pools, and
  EnvPool's MetaWorld pools have crashed (segfaults in a later pool's `recv`)
  when a process that closed pools goes on to build more; a run must not bet
  its life on its own calibration. The child inherits the environment (XLA
  flags, the compilation cache) and the CPU affinity mask, so it measures what
  the run will get; its fingerprint is checked like any cached profile's.
  """
  import tempfile  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  from ebrl import spawn  # pylint: disable=g-import-not-at-top

  log("[profile] calibrating the stages in a separate process")
  with tempfile.TemporaryDirectory(prefix="ebrl-profile-") as tmp:
    out = os.path.join(tmp, "profile.json")
    proc = spawn.SPAWN.Process(target=_measure_child, name="ebrl-profile", args=(
        run, out, jax.config.jax_compilation_cache_dir, kwargs, os.getpid()))
    with spawn.main_module_hidden():  # An unguarded user script must not run again in the child.
      proc.start()
    try:
      proc.join()
    finally:  # Interrupted (a second Ctrl-C in a notebook): the calibration goes with the run.
      if proc.is_alive():
        proc.kill()
        proc.join()
    if proc.exitcode != 0 or not os.path.exists(out):
      raise RuntimeError(f"the stage calibration process failed (exit code {proc.exitcode}); "
                         "run `python -m launch.profile` to see its output")
    return load(out)
