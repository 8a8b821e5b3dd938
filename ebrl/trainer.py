"""A training run: build, record, drive.

The spec is resolved first (ebrl/validation.py: everything that can be wrong
with the user's request is checked before anything is compiled). The stages
are built from it (ebrl/stages.py), the recorder restores a checkpoint if the
run resumes (ebrl/recorder.py), and `run` drives the scheduler
(ebrl/driver.py): each update's report goes to the recorder (state, metrics,
checkpoints, progress, time to success) and to the tuners (the overlap probe,
the resource controller), whose knobs go back to the scheduler. `finish` writes
the final checkpoint, summary.json and plots.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Iterator

import jax
import ml_collections
import numpy as np
import tqdm

from ebrl import interrupts, validation
from ebrl import workdir as workdir_lib
from ebrl.checkpointing import Checkpointer, latest_meta
from ebrl.driver import Budget, drive
from ebrl.errors import UserError
from ebrl.learner import process_local, with_reference
from ebrl.process_group import ProcessGroup, joined
from ebrl.recorder import RunRecorder
from ebrl.scheduler import make_scheduler
from ebrl.scheduler.context import RunContext
from ebrl.spec import RunSpec
from ebrl.stages import build, start_learner_process
from ebrl.tuning import UpdateReport

def launch_env_seed(seed: int, env_steps: int) -> int:
  """The env seed of a launch that starts at `env_steps`: the run seed for the first launch, a
  fresh reproducible one (within EnvPool's int32, with room for per-group offsets) after."""
  if env_steps == 0:
    return seed
  return int(np.random.SeedSequence([seed, env_steps]).generate_state(1)[0]) % (1 << 30)


def _prepare_workdir(group: ProcessGroup, workdir: str, run_spec: RunSpec) -> None:
  """Process 0 prepares the workdir (ebrl/workdir.py) and tells the others whether it could: a
  workdir a run cannot use is the same one-line error on every process."""
  error = None
  if group.leader:
    try:
      workdir_lib.prepare(workdir, run_spec.config, run_spec.outputs.resume)
    except UserError as e:
      error = str(e)
  error = group.gather_json(error)[0]
  if error is not None:
    raise UserError(error)


class _Stage:
  """A Trainer attribute that is its stages' (ebrl/stages.py): read and set there."""

  def __set_name__(self, owner, name: str) -> None:
    self.name = name

  def __get__(self, obj, owner=None):
    return self if obj is None else getattr(obj.stages, self.name)

  def __set__(self, obj, value) -> None:
    setattr(obj.stages, self.name, value)


class Trainer:
  """A run: its stages (`build`, ebrl/stages.py), its recorder (ebrl/recorder.py), and `run`, the
  driver loop between them (ebrl/driver.py). Everything it holds (env pools, the learner process and its shared memory, open
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
    # Ctrl-C / SIGTERM (ebrl.interrupts) ask the run to stop at the next update boundary. Over
    # several processes the signal's event is only this process's request: the run stops when the
    # recorder's gather has told every process (`stop_requested` is then set at the same update).
    self.group = joined()
    self.watch = None  # Over several processes: the PeerWatch (ebrl/peer_watch.py).
    self.stop_signal = stop_requested if stop_requested is not None else threading.Event()
    self.stop_requested = self.stop_signal if self.group.count == 1 else threading.Event()
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
    group = self.group
    group.check_same_config(run_spec.config)  # The first exchange: before anything else is.
    if group.count > 1:
      from ebrl.peer_watch import PeerWatch  # pylint: disable=g-import-not-at-top
      self.watch = PeerWatch(group, os.path.join(os.path.abspath(workdir), "checkpoints")).start()
      self._hold("process watch", self.watch.stop)
    if run_spec.num_processes != group.count:  # This process's share of a run over several.
      run_spec = validation.check_processes(run_spec, group.count, group.index)
    self.run_spec = run_spec
    self.workdir = os.path.abspath(workdir)
    self.launch_time = launch_time or time.time()
    say = tqdm.tqdm.write if progress else (lambda m: None)
    # Start-up, in seconds from launch: imports done, envs and learner built, first env steps
    # taken, first update applied (startup_s in summary.json; the last two include compiles).
    startup_s = {"imports": time.time() - self.launch_time}
    device_placement = validation.check_devices(run_spec, jax.local_device_count())
    _prepare_workdir(group, self.workdir, run_spec)
    # A resumed launch draws fresh initial states: its env seed derives from the run seed and the
    # env steps it resumes at, so each launch from the same checkpoint is the same, and a run
    # preempted N times does not replay its first episodes N times.
    resume_meta = latest_meta(os.path.join(self.workdir, "checkpoints")) if run_spec.outputs.resume else None
    self.env_seed = launch_env_seed(run_spec.seed, int(resume_meta["env_steps"]) if resume_meta else 0)
    self.stages = build(run_spec, device_placement, self.env_seed, self._hold, say)
    self.checkpointer = Checkpointer(os.path.join(self.workdir, "checkpoints"),
                                     keep=run_spec.outputs.keep_checkpoints, warn=lambda m: tqdm.tqdm.write(m))
    self._hold("checkpointer", self.checkpointer.close)
    stages = self.stages
    self.recorder = RunRecorder(
        self.workdir, run_spec, self.learner.init(jax.random.PRNGKey(run_spec.seed)), self.checkpointer,
        tracker=stages.tracker, clock=stages.clock, tracer=stages.tracer, sampler=stages.sampler,
        envs=stages.envs, host_envs=stages.host_envs, tuner_metrics=self._tuner_metrics,
        controller_plot=stages.resources is not None and stages.resources.controller is not None,
        env_seed=self.env_seed, launch_time=self.launch_time, startup_s=startup_s, group=group,
        stop=self.stop_requested, stop_signal=self.stop_signal)
    restored = self._resume() if run_spec.outputs.resume else False
    if run_spec.outputs.warm_start and restored:
      tqdm.tqdm.write(f"warm start from {run_spec.outputs.warm_start} not applied: "
                      "the restored checkpoint's params win")
    elif run_spec.outputs.warm_start:  # Whenever no checkpoint was restored (also a first launch with resume=True).
      self._warm_start(run_spec.outputs.warm_start)
    if run_spec.outputs.eval_episodes > 0 and self.recorder.start_eval is None:  # A resumed run keeps its own.
      start = self.evaluate("start")
      self.recorder.start_eval, self.recorder.start_eval_mean = start["sample"], start.get("mean")
    self.params.publish(self.state)
    self.recorder.open(progress)
    self._hold("metrics and progress bar", self.recorder.close)
    if self.stages.learner_process_spec is not None:
      self.stages.learner = start_learner_process(run_spec, self.stages, say)
      self._hold("learner process", self.stages.learner.close)
    # Last: a run that failed to build leaves no config.json, so the same workdir takes a retry.
    if group.leader:
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
    return drive(scheduler, self.state, self.recorder, self.tuners, budget, self.recorder.updates_done,
                 self.env_steps)

  def train(self, total_env_steps: int | None = None, scheduler=None) -> None:
    """`run` to the end."""
    for _ in self.run(total_env_steps, scheduler):
      pass

  # -- resume / checkpoint --------------------------------------------------

  def _resume(self) -> bool:
    """Restores the newest readable checkpoint, if any; returns whether one was restored."""
    restored = self.checkpointer.restore_latest(self.state)
    if restored is None:
      return False
    self.recorder.restore(*restored)
    tqdm.tqdm.write(f"resumed from {self.checkpointer.path(self.env_steps)} at {self.env_steps} env steps")
    return True

  def _warm_start(self, path: str) -> None:
    from ebrl.warm_start import load_params_and_fresh
    try:
      params, fresh = load_params_and_fresh(path, self.state.params)
    except ValueError as e:
      raise UserError(str(e)) from None
    self.state = with_reference(self.state, params)
    note = f" (the critic's {len(fresh)} leaves the saved params lack or shape otherwise start fresh)" if fresh else ""
    tqdm.tqdm.write(f"warm start: policy params from {path}{note}")

  def evaluate(self, when: str) -> dict:
    """`run_spec.outputs.eval_episodes` episodes (per task on a multi-task env) of the current policy, one per env,
    on held-out env seeds, with the run's own env options, in both action modes from the same initial
    states: {"sample": as in training, "mean": the policy's deterministic mean action (absent for a
    policy without one)}, each ebrl.evaluation's summary; printed on one line and returned."""
    from ebrl.evaluation import HELD_OUT_SEED, RunEnv, make_runner  # pylint: disable=g-import-not-at-top
    run_spec = self.run_spec
    n = run_spec.outputs.eval_episodes * max(1, len(self.tracker.tasks))
    runner = make_runner(run_spec.env.name, n, HELD_OUT_SEED + run_spec.seed, RunEnv.of_spec(run_spec))
    params = jax.device_get(process_local(self.state.params))
    modes = ("sample", "mean") if callable(getattr(self.policy, "mean_action", None)) else ("sample",)
    results = {mode: runner.run(self.policy, params, mode) for mode in modes}

    def rate(r: dict) -> str:
      sr, ci = r.get("success_rate"), r.get("success_ci95")
      return "n/a" if sr is None else f"{sr:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"

    tqdm.tqdm.write(f"{when} evaluation ({n} episodes): success "
                    + ", ".join(f"{mode} {rate(r)}" for mode, r in results.items())
                    + f"; return {results['sample']['episode_return']:.1f} (sample)")
    return results

  def checkpoint(self) -> None:
    self.recorder.checkpoint()

  @property
  def state(self):
    """The run's train state: the last update's (the recorder keeps it)."""
    return self.recorder.state

  @state.setter
  def state(self, state) -> None:
    self.recorder.state = state

  @property
  def env_steps(self) -> int:
    """The run's env steps (decisions), as the schedulers count them on the tracker (every
    process's in a run over several, as of its last update)."""
    return self.recorder.env_steps

  def _tuner_metrics(self) -> dict:
    """The resource controller's and the overlap probe's figures for a metrics row."""
    return {**(self.resources.metrics() if self.resources is not None else {}),
            **(self.overlap.metrics() if self.overlap is not None else {})}

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
      summary = self._finish()
    # Every process leaves together: process 0's coordination service must outlive the others'
    # last calls (the watch stopped with the release, once no collective was left to fail).
    self.group.leave()
    return summary

  def _finish(self) -> dict:
    self.recorder.last_row()
    self.checkpoint()
    self._release(raise_errors=True)  # The checkpointer waits for its writes here.
    final = self.evaluate("final") if self.run_spec.outputs.eval_episodes > 0 else {}  # Not in the run's rates.
    self._finished = self.recorder.summarize(final.get("sample"), final.get("mean"))
    return self._finished
