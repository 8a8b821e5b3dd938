"""A run's outputs, recorded from its update reports: the recorder half of a run.

The driver (ebrl/driver.py) hands each update's report to `RunRecorder.record`,
which keeps the report's state as the run's and writes what is due: a
metrics.jsonl / TensorBoard row every `log_every_s`, a checkpoint every
`checkpoint_every_s`, the progress bar, time to success and the best success
windows. `summarize` writes summary.json, the plots and the trace at the end.

What a checkpoint carries besides the train state (wall time, time to success,
best windows, the episode window, the sampler's counter...) is the recorder's:
`restore` takes it back from a checkpoint's metadata before the first row is
written, so a resumed run's curve and summary continue the run's, not the launch's.

In a run over several processes every process records every update: the
run's figures are the processes' combined (ebrl/telemetry/process_tally.py, one
gather per update, which also carries the stop, log and checkpoint decisions so
that every process takes them at the same update), checkpoints are written by
all of them together (Orbax), and process 0 alone writes the metrics, the
progress bar, summary.json and the plots; each process writes its own trace.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
from typing import Any, Callable

import jax
import numpy as np
import tqdm
import tqdm.auto

from ebrl import interrupts
from ebrl.checkpointing import Checkpointer
from ebrl.errors import UserError
from ebrl.evaluation import success_figures
from ebrl.learner import process_local
from ebrl.process_group import ProcessGroup
from ebrl.spec import RunSpec
from ebrl.telemetry import plots
from ebrl.telemetry.episodes import EpisodeTracker
from ebrl.telemetry.process_tally import ProcessTally
from ebrl.telemetry.stages import StageClock
from ebrl.telemetry.trace import Tracer
from ebrl.telemetry.writers import MetricsWriter, read_jsonl, write_json
from ebrl.tuning import Mark, UpdateReport


def finite_or_none(x: float | None) -> float | None:
  return x if x is not None and math.isfinite(x) else None


def drop_rows_after(path: str, env_steps: int) -> None:
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


def _best_by_task(best: dict[str, float | None], now: dict[str, float | None]) -> dict[str, float | None]:
  """Each task's best window so far, after this update's."""
  return {t: v if best.get(t) is None else (best[t] if v is None else max(best[t], v)) for t, v in now.items()}


def _skipped(state) -> int | None:
  return None if state.skipped_updates.is_deleted() else int(state.skipped_updates)


class RunRecorder:
  """Records a run from its reports. It reads the stages it reports on (the episode tracker, the
  stage clock, the sampler's call counter, the simulators' NaN resets, the tuners' metrics) and
  never drives them; the files it opens are released by `close`."""

  def __init__(self, workdir: str, run: RunSpec, state, checkpointer: Checkpointer, *, tracker: EpisodeTracker,
               clock: StageClock, tracer: Tracer, sampler, envs, host_envs, tuner_metrics: Callable[[], dict],
               controller_plot: bool, env_seed: int, launch_time: float, startup_s: dict[str, float],
               group: ProcessGroup = ProcessGroup(), stop: threading.Event | None = None,
               stop_signal: threading.Event | None = None):
    """Over several processes (`group`), a stop asked of any process (`stop_signal`) sets `stop`
    on every process at the same update (the one event a run of one process uses for both)."""
    self.workdir = workdir
    self.run = run
    self.state = state  # The latest update's (the report's) state: what a checkpoint saves.
    self.checkpointer = checkpointer
    self.tracker = tracker  # This process's envs.
    self.group = group
    # What the run's figures are read from: the tracker itself, or every process's combined.
    self.tally = tracker if group.count == 1 else ProcessTally(tracker, clock, group)
    self.stop, self.stop_signal = stop, stop_signal
    self.clock = clock
    self.tracer = tracer
    self.sampler = sampler
    self.envs = envs
    self.host_envs = host_envs
    self.tuner_metrics = tuner_metrics
    self.controller_plot = controller_plot
    self.env_seed = env_seed
    self.launch_time = launch_time
    # Carried by checkpoints across launches (`restore`).
    self.prior_wall_s = 0.0  # Wall time of earlier launches of this run.
    self.time_to_success_s: float | None = None
    self.env_steps_to_success: int | None = None  # Env steps when time_to_success_s was reached.
    self.best_success_rate = float("nan")
    self.best_success_by_task: dict[str, float | None] = {t: None for t in tracker.tasks}
    # Samples the learner masked as too stale, and segments the deadlock breaker started beyond
    # capacity (the only source of such samples), over every launch of the run.
    self.stale_dropped = 0
    self.force_started = 0
    self.start_eval: dict | None = None  # The starting policy's evaluation (eval_episodes > 0), sampled actions.
    self.start_eval_mean: dict | None = None  # The same with its mean actions.
    # This launch's.
    self.startup_s = startup_s  # Seconds from launch to each start-up milestone (summary.json).
    self.events: list[dict] = []  # {"t": run wall_s, "label"}: the tuners' actions, for the controller plot.
    self.updates_done = int(state.version)  # A Python int any thread may read (the state is donated).
    self.writer: MetricsWriter | None = None
    self.bar = None
    self._last_metrics: dict = {}

  # -- launch -----------------------------------------------------------------

  def restore(self, state, meta: dict) -> None:
    """Continues the run a checkpoint (`state`, `meta`) left; before `open`."""
    self.state = state
    self.updates_done = int(state.version)
    mine = self._process_meta(meta)
    self.tracker.env_steps = int(mine["env_steps"])
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
    self.start_eval_mean = meta.get("start_eval_mean")
    self.tracker.load_state_dict(mine.get("episodes", {}))
    self.sampler.restore_counter(int(mine.get("sampler_calls", 0)))
    if self.group.leader:
      drop_rows_after(os.path.join(self.workdir, "metrics.jsonl"), int(meta["env_steps"]))
    if self.group.count > 1:
      self.tally.refresh(())  # The run's counts as they were saved, for the first row and the bar.

  def _process_meta(self, meta: dict) -> dict:
    """This process's part of a checkpoint's metadata (a run of one process: the metadata itself);
    a UserError when the checkpoint was written by a run of another number of processes."""
    parts = meta.get("processes")
    saved = len(parts) if parts else 1
    if saved != self.group.count:
      raise UserError(f"the checkpoint at {int(meta['env_steps'])} env steps was written by a run of {saved} "
                      f"process{'es' if saved > 1 else ''}; resume it with --num_processes={saved}")
    return parts[self.group.index] if parts else meta

  def open(self, progress: bool) -> None:
    """Opens metrics.jsonl / TensorBoard and the progress bar; the launch's clock starts here."""
    self.writer = MetricsWriter(self.workdir) if self.group.leader else None
    self.startup_s["built"] = time.time() - self.launch_time
    self.start_env_steps = self.env_steps
    self.start_time = time.time()
    self._last_log = (self.start_time, self.env_steps)
    self._last_ckpt = self.start_time
    # tqdm.auto: a widget in a notebook, the text bar in a terminal.
    self.bar = tqdm.auto.tqdm(total=self.run.total_env_steps, initial=self.env_steps, unit="step",
                              unit_scale=True, mininterval=1.0, dynamic_ncols=True,
                              disable=not (progress and self.group.leader))

  def close(self) -> None:
    """Closes the progress bar and the metrics files (each guarded by its caller's release)."""
    if self.bar is not None:
      self.bar.close()
    if self.writer is not None:
      self.writer.close()

  # -- each update ----------------------------------------------------------------

  @property
  def env_steps(self) -> int:
    """The run's env steps (decisions), as the schedulers count them on the tracker (every
    process's, as of the last update, in a run over several)."""
    return self.tally.env_steps

  def wall_s(self) -> float:
    return self.prior_wall_s + time.time() - self.launch_time

  def sim_steps(self) -> int:
    """Physics steps taken; with action chunks env_steps counts decisions (one per chunk)."""
    return sum(int(group.sim_steps) for group in self.host_envs)  # Chunks run on host envs only.

  def _note_success(self) -> None:
    """Takes the moment the episode window first reached the target (the tracker notes it as the
    episodes finish, and the env steps taken by then, to within one step batch)."""
    if self.time_to_success_s is None and self.tally.env_steps_at_hit is not None:
      self.time_to_success_s = self.prior_wall_s + self.tally.first_hit - self.launch_time
      self.env_steps_to_success = self.tally.env_steps_at_hit

  def _note_best(self) -> None:
    sr = self.tally.success_rate
    if math.isfinite(sr):
      self.best_success_rate = sr if not math.isfinite(self.best_success_rate) else max(self.best_success_rate, sr)
      if self.time_to_success_s is None and self.tally.window_full and sr >= self.run.outputs.target_success:
        self.time_to_success_s = self.wall_s()  # A window restored at the target (resume).
        self.env_steps_to_success = self.env_steps
    if self.tally.tasks:
      self.best_success_by_task = _best_by_task(self.best_success_by_task, self.tally.success_rate_by_task)

  def record(self, report: UpdateReport) -> None:
    """An update's report: its state becomes the run's; metrics, checkpoint and progress as due."""
    now = time.time()
    if "first_env_steps" not in self.startup_s and self.tracker.first_step_time is not None:
      self.startup_s["first_env_steps"] = self.tracker.first_step_time - self.launch_time
    if "first_update" not in self.startup_s:
      self.startup_s["first_update"] = now - self.launch_time
    self.state = report.state
    self.updates_done = int(report.state.version)
    self.force_started += report.force_started
    if "stale_dropped" in report.metrics:
      self.stale_dropped += int(report.metrics["stale_dropped"])
    log_due = now - self._last_log[0] >= self.run.outputs.log_every_s
    checkpoint_due = now - self._last_ckpt >= self.run.outputs.checkpoint_every_s
    if self.group.count > 1:  # Process 0's clock decides, every process's stop counts.
      agreed = self.tally.refresh((self.stop_signal.is_set(), log_due, checkpoint_due))
      log_due, checkpoint_due = bool(agreed[0, 1]), bool(agreed[0, 2])
      if agreed[:, 0].any():
        self.stop.set()
    self._note_success()
    self._note_best()
    self._last_metrics = report.metrics
    if log_due:
      self.log(report.metrics)
    if checkpoint_due:
      self.checkpoint()
    # tqdm shows env steps/s itself (smoothed) and redraws at most once a second.
    sr = self.tally.success_rate
    self.bar.set_postfix_str(f"success {sr:.2f}" if math.isfinite(sr)
                             else f"return {self.tally.episode_return:.1f}", refresh=False)
    self.bar.update(min(self.env_steps, self.run.total_env_steps) - self.bar.n)

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

  def busy_s(self) -> dict[str, float]:
    """Each stage's busy seconds (the processes' mean in a run over several)."""
    stages = self.clock.snapshot()
    if self.group.count > 1:
      stages.update(self.tally.busy_s())
    return stages

  def log(self, metrics: dict) -> dict:
    """One metrics.jsonl / TensorBoard row (process 0's to write): progress, episodes, stage times,
    the update's metrics."""
    now = time.time()
    stages = self.busy_s()
    elapsed = now - self.start_time
    tracker = self.tally
    row = {
        "env_steps": self.env_steps,
        "wall_s": self.wall_s(),
        "env_steps_per_s": self.interval_rate(),
        "success_rate": tracker.success_rate,
        **({"success_rate_by_task": tracker.success_rate_by_task} if tracker.tasks else {}),
        "episode_return": tracker.episode_return,
        "episode_length": tracker.episode_length,
        "episodes": tracker.episodes,
        "policy_version": int(self.state.version),
        "time_sim_s": stages["sim"],
        "time_gen_s": stages["gen"],
        "time_train_s": stages["train"],
        "time_other_s": max(0.0, elapsed - sum(stages.values())),
        "nan_resets": self.envs.nan_resets,
        **({"sim_steps": self.sim_steps()} if self.run.policy.chunk_size > 1 else {}),
        **{k: float(v) for k, v in jax.device_get(process_local(metrics)).items()},
        **self.tuner_metrics(),
    }
    if self.writer is not None:
      self.writer.write(row)
    self._last_log = (now, self.env_steps)
    return row

  def checkpoint(self) -> None:
    """The latest state and what resuming needs (see `restore`), atomically (ebrl/checkpointing.py)."""
    cut_off = any(x.is_deleted() for x in jax.tree.leaves(self.state))
    if self.group.count > 1:  # Orbax saves with every process: all of them save, or none does.
      cut_off = bool(self.group.gather(np.array([cut_off])).any())
    if cut_off:
      # An update was cut off after it took (donated) the state: the last checkpoint stays the good one.
      tqdm.tqdm.write("not checkpointing: the train state is inside an unfinished update")
      return
    env_steps = self.env_steps  # Read once: the sampler thread may be adding to it.
    mine = {"episodes": self.tracker.state_dict(), "sampler_calls": self.sampler.calls}
    if self.group.count > 1:  # Each process's own counts, in process order; the step is the run's.
      mine = {"processes": self.group.gather_json({**mine, "env_steps": self.tracker.env_steps})}
    meta = {"env_steps": env_steps, "wall_s": self.wall_s(), "time_to_success_s": self.time_to_success_s,
            "env_steps_to_success": self.env_steps_to_success,
            "best_success_rate": finite_or_none(self.best_success_rate),
            **({"best_success_rate_by_task": dict(self.best_success_by_task)} if self.tracker.tasks else {}),
            "stale_dropped": self.stale_dropped, "force_started": self.force_started, "env_seed": self.env_seed,
            **({"start_eval": self.start_eval} if self.start_eval is not None else {}),
            **({"start_eval_mean": self.start_eval_mean} if self.start_eval_mean is not None else {}),
            **mine}
    with interrupts.uninterruptible():
      self.checkpointer.save(env_steps, self.state, meta)
    self._last_ckpt = time.time()

  # -- the end ----------------------------------------------------------------------

  def last_row(self) -> None:
    """Before the final checkpoint: episodes that finished after the last update count, and the
    last update's metrics get their row."""
    self.bar.close()
    if self.group.count > 1:
      self.tally.refresh(())
    self._note_success()
    if self._last_metrics:
      self.log(self._last_metrics)
    if self.tally.tasks:
      self.best_success_by_task = _best_by_task(self.best_success_by_task, self.tally.success_rate_by_task)

  def summarize(self, final_eval: dict | None, final_eval_mean: dict | None = None) -> dict:
    """summary.json and the plots (process 0's to write) and this process's trace; returns the summary.
    With an evaluation (`final_eval`, sampled actions; `final_eval_mean`, mean actions): start_eval and
    final_eval (the sampled ones, whole) and success_before / success_after: {"mean": ..., "sample":
    ...}, each the success figures of `success_figures` (None for a mode that was not evaluated)."""
    run, tracker = self.run, self.tally
    elapsed = time.time() - self.start_time
    stages = self.busy_s()
    summary: dict[str, Any] = {
        "env": run.env.name,
        "policy": run.policy.name,
        "scheduler": run.scheduler,
        "env_steps": self.env_steps,
        "wall_s": self.wall_s(),
        "env_steps_per_s": (self.env_steps - self.start_env_steps) / max(elapsed, 1e-9),
        "final_success_rate": finite_or_none(tracker.success_rate),
        "best_success_rate": finite_or_none(self.best_success_rate),
        **({"success_rate_by_task": tracker.success_rate_by_task,
            "best_success_rate_by_task": dict(self.best_success_by_task)} if tracker.tasks else {}),
        "time_to_success_s": self.time_to_success_s,
        "env_steps_to_success": self.env_steps_to_success,
        "target_success": run.outputs.target_success,
        "final_episode_return": finite_or_none(tracker.episode_return),
        "episodes": tracker.episodes,
        "policy_version": int(self.state.version),
        "nan_resets": self.envs.nan_resets,
        "skipped_updates": _skipped(self.state),
        "stale_dropped": self.stale_dropped,
        "force_started": self.force_started,
        "env_seed": self.env_seed,
        "startup_s": self.startup_s,
        "stage_busy": {k: v / max(elapsed, 1e-9) for k, v in stages.items()},
        **({"start_eval": self.start_eval, "final_eval": final_eval,
            "success_before": {"mean": success_figures(self.start_eval_mean),
                               "sample": success_figures(self.start_eval)},
            "success_after": {"mean": success_figures(final_eval_mean), "sample": success_figures(final_eval)}}
           if final_eval is not None else {}),
        "num_processes": self.group.count,
        "params_sha256_by_process": self.params_digests(),
    }
    if not self.group.leader:
      self.tracer.write_chrome(os.path.join(self.workdir, f"trace.process{self.group.index}.json"))
      return summary
    write_json(os.path.join(self.workdir, "summary.json"), summary)
    title = f"{run.env.name} · {run.policy.name} · {run.scheduler}"
    rows = read_jsonl(os.path.join(self.workdir, "metrics.jsonl"))
    plots.learning_curve(rows, os.path.join(self.workdir, "plots", "learning_curve.png"), title)
    if tracker.tasks:
      plots.success_by_task(summary["success_rate_by_task"], summary["best_success_rate_by_task"],
                            os.path.join(self.workdir, "plots", "success_by_task.png"), title)
    if self.controller_plot:
      self._controller_plot(rows, title)
    self.tracer.write_chrome(os.path.join(self.workdir, "trace.json"))
    plots.timeline(self.tracer.spans(), os.path.join(self.workdir, "plots", "timeline.png"), title)
    return summary

  def params_digests(self) -> list[str]:
    """Each process's SHA-256 of the policy params it holds, in process order; a RuntimeError when
    they differ (a learner over several processes keeps one replicated state: checked, not assumed)."""
    params = jax.device_get(process_local(self.state.params))
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
      digest.update(np.ascontiguousarray(leaf).tobytes())
    digests = self.group.gather_json(digest.hexdigest())
    if len(set(digests)) > 1:
      raise RuntimeError(f"the processes' policy params differ after {int(self.state.version)} updates "
                         f"(SHA-256 by process: {digests})")
    return digests

  def _controller_plot(self, rows: list[dict], title: str) -> None:
    """plots/controller.png: throughput against the plan's prediction, shifts and re-plans marked."""
    from ebrl.telemetry.shift_plot import demand_shift  # pylint: disable=g-import-not-at-top

    events = list(self.events)
    shift_us = self.run.env.shift_sim_us
    shifted = self.host_envs[0].shifted_at if shift_us else None  # Every group shifts at once.
    if shifted is not None:
      events.append({"t": self.prior_wall_s + shifted - self.launch_time, "label": f"sim +{shift_us:.0f} us/step"})
    demand_shift(rows, events, os.path.join(self.workdir, "plots", "controller.png"), title)
