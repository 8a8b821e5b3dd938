"""A training run: its stages (built by ebrl/stages.py from the run's spec) and its outputs.

The spec is resolved first (ebrl/validation.py: everything that can be wrong
with the user's request is checked before anything is compiled). `run` hands
the scheduler a RunContext (ebrl/scheduler/context.py) and drives it
(ebrl/driver.py): each update's report goes to `record`, which keeps the new
state, logs metrics.jsonl / TensorBoard / the progress bar, checkpoints, and
tracks time to success, and to the tuners (the overlap probe, the resource
controller), whose knobs go back to the scheduler. `finish` writes the final
checkpoint, summary.json and plots.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import Callable, Iterator

import jax
import ml_collections
import numpy as np
import tqdm
import tqdm.auto

from ebrl import interrupts, validation
from ebrl import workdir as workdir_lib
from ebrl.checkpointing import Checkpointer
from ebrl.driver import Budget, drive
from ebrl.errors import UserError
from ebrl.learner import with_reference
from ebrl.scheduler import make_scheduler
from ebrl.scheduler.context import RunContext
from ebrl.spec import RunSpec
from ebrl.stages import build, start_learner_process
from ebrl.telemetry import plots
from ebrl.telemetry.writers import MetricsWriter, read_jsonl, write_json
from ebrl.tuning import Mark, UpdateReport

def _finite_or_none(x: float):
  return x if x is not None and math.isfinite(x) else None


def launch_env_seed(seed: int, env_steps: int) -> int:
  """The env seed of a launch that starts at `env_steps`: the run seed for the first launch, a
  fresh reproducible one (within EnvPool's int32, with room for per-group offsets) after."""
  if env_steps == 0:
    return seed
  return int(np.random.SeedSequence([seed, env_steps]).generate_state(1)[0]) % (1 << 30)


def _drop_rows_after(path: str, env_steps: int) -> None:
  """Metrics rows past the checkpoint a run resumes from describe work that was lost: dropped,
  so the learning curve is one history (rewritten atomically)."""
  if not os.path.isfile(path):
    return
  rows = read_jsonl(path)
  keep = [r for r in rows if r.get("env_steps", 0) <= env_steps]
  if len(keep) < len(rows):
    with open(path + ".tmp", "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in keep)
    os.replace(path + ".tmp", path)


def _latest_meta(directory: str) -> dict | None:
  """The newest checkpoint's metadata, read before anything is built (no directory is created)."""
  if not os.path.isdir(directory):
    return None
  probe = Checkpointer(directory, warn=lambda m: None)
  try:
    return probe.latest_meta()
  finally:
    probe.close()


def _best_by_task(best: dict[str, float | None], now: dict[str, float | None]) -> dict[str, float | None]:
  """Each task's best window so far, after this update's."""
  return {t: v if best.get(t) is None else (best[t] if v is None else max(best[t], v)) for t, v in now.items()}


def _skipped(state) -> int | None:
  return None if state.skipped_updates.is_deleted() else int(state.skipped_updates)


class _Stage:
  """A Trainer attribute that is its stages' (ebrl/stages.py): read and set there."""

  def __set_name__(self, owner, name: str) -> None:
    self.name = name

  def __get__(self, obj, owner=None):
    return self if obj is None else getattr(obj.stages, self.name)

  def __set__(self, obj, value) -> None:
    setattr(obj.stages, self.name, value)


class Trainer:
  """A run: its stages (`build`, ebrl/stages.py) and its outputs, which it records from each
  update's report. Everything it holds (env pools, the learner process and its shared memory, open
  files, the checkpointer) is released by `finish` or `abort`, and by the constructor itself when
  building fails part way, each in its own guard."""

  # The stages, as attributes of the run (benchmarks, tests and notebooks reach them here).
  layout = _Stage()
  placement = _Stage()
  resources = _Stage()
  overlap = _Stage()
  tracer = _Stage()
  clock = _Stage()
  host_envs = _Stage()
  device_sim = _Stage()
  spec = _Stage()
  policy = _Stage()
  action_size = _Stage()
  learner = _Stage()
  stage_placement = _Stage()
  params = _Stage()
  sampler = _Stage()
  tracker = _Stage()
  envs = _Stage()
  tuners = _Stage()

  def __init__(self, run_spec: RunSpec | ml_collections.ConfigDict, workdir: str, *,
               launch_time: float | None = None, progress: bool = True,
               stop_requested: threading.Event | None = None):
    self._closers: list[tuple[str, Callable[[], None]]] = []  # Released last to first.
    self._finished: dict | None = None
    # Ctrl-C / SIGTERM (ebrl.interrupts) ask the run to stop at the next update boundary.
    self.stop_requested = stop_requested if stop_requested is not None else threading.Event()
    try:
      self._build(run_spec, workdir, launch_time, progress)
    except BaseException:
      self._release(raise_errors=False)
      raise

  def _hold(self, name: str, close: Callable[[], None]) -> None:
    """Registers something the run must release (see `_release`)."""
    self._closers.append((name, close))

  def _release(self, raise_errors: bool) -> None:
    """Releases everything held, last built first, each in its own guard: one that fails does not
    keep the others. The first failure is raised afterwards (`raise_errors`) or only reported."""
    first = None
    while self._closers:
      name, close = self._closers.pop()
      try:
        close()
      except Exception as e:  # pylint: disable=broad-except  # Every other resource must still go.
        first = first or e
        tqdm.tqdm.write(f"while releasing the run's {name}: {type(e).__name__}: {e}")
    if first is not None and raise_errors:
      raise first

  def _build(self, run_spec: RunSpec | ml_collections.ConfigDict, workdir: str, launch_time: float | None,
             progress: bool) -> None:
    if not isinstance(run_spec, RunSpec):  # A config, from a notebook or a test: checked and translated here.
      run_spec = validation.resolve(run_spec)
    self.run_spec = run_spec
    self.workdir = os.path.abspath(workdir)
    self.launch_time = launch_time or time.time()
    say = tqdm.tqdm.write if progress else (lambda m: None)
    # Start-up, in seconds from launch: imports done, envs and learner built, first env steps
    # taken, first update applied (startup_s in summary.json; the last two include compiles).
    self.startup_s: dict[str, float] = {"imports": time.time() - self.launch_time}
    device_placement = validation.check_devices(run_spec, jax.local_device_count())
    workdir_lib.prepare(self.workdir, run_spec.config, run_spec.outputs.resume)
    # A resumed launch draws fresh initial states: its env seed derives from the run seed and the
    # env steps it resumes at, so each launch from the same checkpoint is the same, and a run
    # preempted N times does not replay its first episodes N times.
    resume_meta = _latest_meta(os.path.join(self.workdir, "checkpoints")) if run_spec.outputs.resume else None
    self.env_seed = launch_env_seed(run_spec.seed, int(resume_meta["env_steps"]) if resume_meta else 0)
    self.stages = build(run_spec, device_placement, self.env_seed, self._hold, say)
    self.checkpointer = Checkpointer(os.path.join(self.workdir, "checkpoints"),
                                     keep=run_spec.outputs.keep_checkpoints, warn=lambda m: tqdm.tqdm.write(m))
    self._hold("checkpointer", self.checkpointer.close)
    self.state = self.learner.init(jax.random.PRNGKey(run_spec.seed))
    self.prior_wall_s = 0.0  # Wall time of earlier launches of this run (resume).
    self.time_to_success_s = None
    self.env_steps_to_success = None  # Env steps when time_to_success_s was reached (sample efficiency).
    self.best_success_rate = float("nan")
    # A multi-task env's best window per task (None until a task finishes an episode).
    self.best_success_by_task = {t: None for t in self.tracker.tasks}
    # Samples the learner masked as too stale, and segments the deadlock breaker started beyond
    # capacity (the only source of such samples), over every launch of the run.
    self.stale_dropped = 0
    self.force_started = 0
    self.events: list[dict] = []  # {"t": run wall_s, "label"}: the tuners' actions, for the controller plot.
    self.start_eval: dict | None = None  # run_spec.outputs.eval_episodes > 0: the starting policy's evaluation.
    restored = self._resume() if run_spec.outputs.resume else False
    if run_spec.outputs.warm_start and restored:
      tqdm.tqdm.write(f"warm start from {run_spec.outputs.warm_start} not applied: "
                      "the restored checkpoint's params win")
    elif run_spec.outputs.warm_start:  # Whenever no checkpoint was restored (also a first launch with resume=True).
      self._warm_start(run_spec.outputs.warm_start)
    if run_spec.outputs.eval_episodes > 0 and self.start_eval is None:  # A resumed run keeps its own.
      self.start_eval = self.evaluate("start")
    self.params.publish(self.state)
    # Updates made so far, as a Python int any thread may read (the state itself is donated to
    # each update while the learner thread runs it).
    self.updates_done = int(self.state.version)

    self.writer = MetricsWriter(self.workdir)
    self._hold("metrics writer", self.writer.close)
    self.startup_s["built"] = time.time() - self.launch_time
    self.start_env_steps = self.env_steps
    self.start_time = time.time()
    self._last_log = (self.start_time, self.env_steps)
    self._last_ckpt = self.start_time
    self._last_metrics: dict = {}
    # tqdm.auto: a widget in a notebook, the text bar in a terminal.
    self.bar = tqdm.auto.tqdm(total=run_spec.total_env_steps, initial=self.env_steps, unit="step",
                              unit_scale=True, mininterval=1.0, dynamic_ncols=True, disable=not progress)
    self._hold("progress bar", self.bar.close)
    if self.stages.learner_process_spec is not None:
      self.stages.learner = start_learner_process(run_spec, self.stages, say)
      self._hold("learner process", self.stages.learner.close)
    # Last: a run that failed to build leaves no config.json, so the same workdir takes a retry.
    workdir_lib.write_config(self.workdir, run_spec.config)

  def run_context(self) -> RunContext:
    """What the scheduler drives (ebrl/scheduler/context.py)."""
    run_spec = self.run_spec
    return RunContext(
        layout=self.layout, spec=self.spec, action_size=self.action_size, policy=self.policy,
        sampler=self.sampler, learner=self.learner, params=self.params, clock=self.clock, tracker=self.tracker,
        stop=self.stop_requested, host_envs=self.host_envs, device_sim=self.device_sim, seed=run_spec.seed,
        env_seed=self.env_seed, max_staleness=run_spec.max_staleness,
        max_wait_s=run_spec.async_.max_wait_s if run_spec.async_ else 0.0,
        pinning=self.resources.enforcer if self.resources is not None else None)

  def run(self, total_env_steps: int | None = None, scheduler=None) -> Iterator[UpdateReport]:
    """Drives the config's scheduler (or `scheduler`) from the current state until the budget
    (default the config's) is spent or a stop is requested, yielding each update's report once
    recorded; `finish` then writes the outputs."""
    total = self.run_spec.total_env_steps if total_env_steps is None else total_env_steps
    scheduler = scheduler or make_scheduler(self.run_spec.scheduler, self.run_context())
    budget = Budget(updates=self.layout.updates_for(total), env_steps=total, stop=self.stop_requested)
    return drive(scheduler, self.state, self, self.tuners, budget, self.updates_done, self.env_steps)

  def train(self, total_env_steps: int | None = None, scheduler=None) -> None:
    """`run` to the end."""
    for _ in self.run(total_env_steps, scheduler):
      pass

  def _controller_plot(self, rows: list[dict], title: str) -> None:
    """plots/controller.png: throughput against the plan's prediction, shifts and re-plans marked."""
    from ebrl.telemetry.shift_plot import demand_shift

    events = list(self.events)
    shifted = self.host_envs[0].shifted_at if self.run_spec.env.shift_sim_us else None  # Every group shifts at once.
    if shifted is not None:
      events.append({"t": self.prior_wall_s + shifted - self.launch_time,
                     "label": f"sim +{self.run_spec.env.shift_sim_us:.0f} us/step"})
    demand_shift(rows, events, os.path.join(self.workdir, "plots", "controller.png"), title)

  # -- resume / checkpoint --------------------------------------------------

  def _resume(self) -> bool:
    """Restores the newest readable checkpoint, if any; returns whether one was restored."""
    restored = self.checkpointer.restore_latest(self.state)
    if restored is None:
      return False
    self.state, meta = restored
    self.tracker.env_steps = int(meta["env_steps"])
    self.prior_wall_s = float(meta["wall_s"])
    self.time_to_success_s = meta.get("time_to_success_s")
    self.env_steps_to_success = meta.get("env_steps_to_success")
    best = meta.get("best_success_rate")
    self.best_success_rate = float("nan") if best is None else float(best)
    best_by_task = meta.get("best_success_rate_by_task") or {}
    self.best_success_by_task = {t: best_by_task.get(t) for t in self.best_success_by_task}
    self.stale_dropped = int(meta.get("stale_dropped", 0))
    self.force_started = int(meta.get("force_started", 0))
    self.start_eval = meta.get("start_eval")
    self.tracker.load_state_dict(meta.get("episodes", {}))
    self.sampler.restore_counter(int(meta.get("sampler_calls", 0)))
    _drop_rows_after(os.path.join(self.workdir, "metrics.jsonl"), self.env_steps)
    tqdm.tqdm.write(f"resumed from {self.checkpointer.path(self.env_steps)} at {self.env_steps} env steps")
    return True

  def _warm_start(self, path: str) -> None:
    from ebrl.warm_start import load_params
    try:
      params = load_params(path, self.state.params)
    except ValueError as e:
      raise UserError(str(e)) from None
    self.state = with_reference(self.state, params)
    tqdm.tqdm.write(f"warm start: policy params from {path}")

  def evaluate(self, when: str) -> dict:
    """`run_spec.outputs.eval_episodes` episodes (per task on a multi-task env) of the current policy, one per env,
    on held-out env seeds, with the run's own env options; printed and returned."""
    from ebrl.evaluation import HELD_OUT_SEED, RunEnv, make_runner  # pylint: disable=g-import-not-at-top
    run_spec = self.run_spec
    n = run_spec.outputs.eval_episodes * max(1, len(self.tracker.tasks))
    result = make_runner(run_spec.env.name, n, HELD_OUT_SEED + run_spec.seed, RunEnv.of_spec(run_spec)).run(
        self.policy, jax.device_get(self.state.params))
    rate = result.get("success_rate")
    tqdm.tqdm.write(f"{when} evaluation ({n} episodes): success {'n/a' if rate is None else f'{rate:.2f}'}, "
                    f"return {result['episode_return']:.1f}")
    return result

  def checkpoint(self) -> None:
    if any(x.is_deleted() for x in jax.tree.leaves(self.state)):
      # An update was cut off after it took (donated) the state: the last checkpoint stays the good one.
      tqdm.tqdm.write("not checkpointing: the train state is inside an unfinished update")
      return
    env_steps = self.env_steps  # Read once: the sampler thread may be adding to it.
    meta = {"env_steps": env_steps, "wall_s": self.wall_s(), "time_to_success_s": self.time_to_success_s,
            "env_steps_to_success": self.env_steps_to_success,
            "best_success_rate": _finite_or_none(self.best_success_rate),
            **({"best_success_rate_by_task": dict(self.best_success_by_task)} if self.tracker.tasks else {}),
            "stale_dropped": self.stale_dropped, "force_started": self.force_started, "env_seed": self.env_seed,
            **({"start_eval": self.start_eval} if self.start_eval is not None else {}),
            "episodes": self.tracker.state_dict(), "sampler_calls": self.sampler.calls}
    with interrupts.uninterruptible():
      self.checkpointer.save(env_steps, self.state, meta)
    self._last_ckpt = time.time()

  # -- progress ---------------------------------------------------------------

  def wall_s(self) -> float:
    return self.prior_wall_s + time.time() - self.launch_time

  def sim_steps(self) -> int:
    """Physics steps taken; with action chunks env_steps counts decisions (one per chunk)."""
    return sum(int(group.sim_steps) for group in self.host_envs)  # Chunks run on host envs only.

  @property
  def env_steps(self) -> int:
    """The run's env steps (decisions), as the schedulers count them on the tracker."""
    return self.tracker.env_steps

  def _note_success(self) -> None:
    """Takes the moment the episode window first reached the target (the tracker notes it as the
    episodes finish, and the env steps taken by then, to within one step batch)."""
    if self.time_to_success_s is None and self.tracker.env_steps_at_hit is not None:
      self.time_to_success_s = self.prior_wall_s + self.tracker.first_hit - self.launch_time
      self.env_steps_to_success = self.tracker.env_steps_at_hit

  def record(self, report: UpdateReport) -> None:
    """An update's report: its state becomes the run's; metrics, checkpoint and progress as due."""
    now = time.time()
    if "first_env_steps" not in self.startup_s and self.tracker.first_step_time is not None:
      self.startup_s["first_env_steps"] = self.tracker.first_step_time - self.launch_time
    if "first_update" not in self.startup_s:
      self.startup_s["first_update"] = now - self.launch_time
    self.state = report.state
    metrics = report.metrics
    self.updates_done = int(report.state.version)
    self.force_started += report.force_started
    if "stale_dropped" in metrics:
      self.stale_dropped += int(metrics["stale_dropped"])
    self._note_success()
    sr = self.tracker.success_rate
    if math.isfinite(sr):
      self.best_success_rate = sr if not math.isfinite(self.best_success_rate) else max(self.best_success_rate, sr)
      if (self.time_to_success_s is None and self.tracker.window_full and sr >= self.run_spec.outputs.target_success):
        self.time_to_success_s = self.wall_s()  # A window restored at the target (resume).
        self.env_steps_to_success = self.env_steps
    if self.tracker.tasks:
      self.best_success_by_task = _best_by_task(self.best_success_by_task, self.tracker.success_rate_by_task)
    self._last_metrics = metrics
    if now - self._last_log[0] >= self.run_spec.outputs.log_every_s:
      self.log(metrics)
    if now - self._last_ckpt >= self.run_spec.outputs.checkpoint_every_s:
      self.checkpoint()
    # tqdm shows env steps/s itself (smoothed) and redraws at most once a second.
    self.bar.set_postfix_str(f"success {sr:.2f}" if math.isfinite(sr)
                             else f"return {self.tracker.episode_return:.1f}", refresh=False)
    self.bar.update(min(self.env_steps, self.run_spec.total_env_steps) - self.bar.n)

  def mark(self, mark: Mark, t: float) -> None:
    """A tuner's action at time.time() `t`: on the trace's timeline and the controller plot."""
    self.events.append({"t": self.prior_wall_s + t - self.launch_time, "label": mark.label})
    self.tracer.instant(mark.name, mark.args)

  def staleness_mean(self) -> float:
    """Mean policy-version lag of the samples in the last update (0 for sync)."""
    v = self._last_metrics.get("staleness")
    return float(v) if v is not None else 0.0

  def interval_rate(self) -> float:
    t, s = self._last_log
    return (self.env_steps - s) / max(time.time() - t, 1e-9)

  def log(self, metrics: dict) -> dict:
    now = time.time()
    stages = self.clock.snapshot()
    elapsed = now - self.start_time
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    row = {
        "env_steps": self.env_steps,
        "wall_s": self.wall_s(),
        "env_steps_per_s": self.interval_rate(),
        "success_rate": self.tracker.success_rate,
        **({"success_rate_by_task": self.tracker.success_rate_by_task} if self.tracker.tasks else {}),
        "episode_return": self.tracker.episode_return,
        "episode_length": self.tracker.episode_length,
        "episodes": self.tracker.episodes,
        "policy_version": int(self.state.version),
        "time_sim_s": stages["sim"],
        "time_gen_s": stages["gen"],
        "time_train_s": stages["train"],
        "time_other_s": max(0.0, elapsed - sum(stages.values())),
        "nan_resets": self.envs.nan_resets,
        **({"sim_steps": self.sim_steps()} if self.run_spec.policy.chunk_size > 1 else {}),
        **metrics,
        **(self.resources.metrics() if self.resources is not None else {}),
        **(self.overlap.metrics() if self.overlap is not None else {}),
    }
    self.writer.write(row)
    self._last_log = (now, self.env_steps)
    return row

  def abort(self) -> None:
    """Releases everything the run holds (the learner process and its shared memory, the envs,
    writers and checkpointer) without a final checkpoint: after an error, or a second interrupt
    that may have come mid-update, when the state the trainer holds was donated to an update that
    never returned. The last checkpoint on disk is the run's."""
    if self._finished is not None:
      return
    with interrupts.uninterruptible():
      self._finished = {}
      self._release(raise_errors=False)

  def finish(self) -> dict:
    """Final checkpoint, summary.json and plots, once; returns the summary (again on a second call).
    A second interrupt (Python API) waits until all of it is written."""
    if self._finished is not None:
      return self._finished
    with interrupts.uninterruptible():
      return self._finish()

  def _finish(self) -> dict:
    self.bar.close()
    self._note_success()  # Episodes that reached the target after the last update.
    if self._last_metrics:
      self.log(self._last_metrics)
    if self.tracker.tasks:  # Episodes that finished after the last update count too.
      self.best_success_by_task = _best_by_task(self.best_success_by_task, self.tracker.success_rate_by_task)
    self.checkpoint()
    self._release(raise_errors=True)  # The checkpointer waits for its writes here.
    elapsed = time.time() - self.start_time
    stages = self.clock.snapshot()
    final_eval = self.evaluate("final") if self.run_spec.outputs.eval_episodes > 0 else None  # Not in the run's rates.
    summary = {
        "env": self.run_spec.env.name,
        "policy": self.run_spec.policy.name,
        "scheduler": self.run_spec.scheduler,
        "env_steps": self.env_steps,
        "wall_s": self.wall_s(),
        "env_steps_per_s": (self.env_steps - self.start_env_steps) / max(elapsed, 1e-9),
        "final_success_rate": _finite_or_none(self.tracker.success_rate),
        "best_success_rate": _finite_or_none(self.best_success_rate),
        **({"success_rate_by_task": self.tracker.success_rate_by_task,
            "best_success_rate_by_task": dict(self.best_success_by_task)} if self.tracker.tasks else {}),
        "time_to_success_s": self.time_to_success_s,
        "env_steps_to_success": self.env_steps_to_success,
        "target_success": self.run_spec.outputs.target_success,
        "final_episode_return": _finite_or_none(self.tracker.episode_return),
        "episodes": self.tracker.episodes,
        "policy_version": int(self.state.version),
        "nan_resets": self.envs.nan_resets,
        "skipped_updates": _skipped(self.state),
        "stale_dropped": self.stale_dropped,
        "force_started": self.force_started,
        "env_seed": self.env_seed,
        "startup_s": self.startup_s,
        "stage_busy": {k: v / max(elapsed, 1e-9) for k, v in stages.items()},
        **({"start_eval": self.start_eval, "final_eval": final_eval} if final_eval is not None else {}),
    }
    write_json(os.path.join(self.workdir, "summary.json"), summary)
    title = f"{self.run_spec.env.name} · {self.run_spec.policy.name} · {self.run_spec.scheduler}"
    rows = read_jsonl(os.path.join(self.workdir, "metrics.jsonl"))
    plots.learning_curve(rows, os.path.join(self.workdir, "plots", "learning_curve.png"), title)
    if self.tracker.tasks:
      plots.success_by_task(summary["success_rate_by_task"], summary["best_success_rate_by_task"],
                            os.path.join(self.workdir, "plots", "success_by_task.png"), title)
    if self.resources is not None and self.resources.controller is not None:
      self._controller_plot(rows, title)
    self.tracer.write_chrome(os.path.join(self.workdir, "trace.json"))
    plots.timeline(self.tracer.spans(), os.path.join(self.workdir, "plots", "timeline.png"), title)
    self._finished = summary
    return summary
