"""The render stage: camera images next to the state, drawn for the envs handed back.

Why a stage: rendering is usually the heaviest CPU work of a pixel run (MetaWorld
at 64x64 through Mesa: ~8.5 ms per frame against ~0.1 ms of physics), and a
manipulation policy wants the proprioceptive state and the goal beside the
image, which EnvPool's pixel pools (pixels only) do not give. So the simulator
stays a state pool and this wrapper renders the envs it hands back, and only
those: an env waiting for its action is idle, so its frame is the observation
it is about to act on, while the other envs keep stepping on EnvPool's workers.

Every draw of the process runs on one render thread (`render_thread_ids`),
which the resource manager places on the render quota of its plan; Mesa's
rasterizer threads (llvmpipe-*) are created by that thread's first draw and
inherit its cores. One thread, because draws must not overlap: EnvPool's render
releases the GIL, and two threads drawing at once ran faster but segfaulted
inside EnvPool's renderer after tens of thousands of frames. The receiving thread
waits for its frames (EnvPool's workers meanwhile step the envs still in
flight). Every draw is a "render" span on lane render<i> of the run's clock
when one is attached (`set_clock`): render time shows in trace.json and the
timeline next to sim, gen and train.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable

import numpy as np

from sim_adapters.base import ObsSpec, StepBatch
from sim_adapters.workers import WorkerPool

_renderer: WorkerPool | None = None  # The process's render thread, started by the first RenderStage.
_renderer_lock = threading.Lock()


def _render_workers() -> WorkerPool:
  global _renderer
  with _renderer_lock:
    if _renderer is None:
      _renderer = WorkerPool(1, "ebrl-render")
      _renderer.start()
    return _renderer


def render_thread_ids() -> list[int]:
  """Native ids of the thread every draw runs on (empty before any RenderStage exists)."""
  return _renderer.native_ids if _renderer is not None else []


class RenderStage:
  """Wraps a state SimAdapter; every returned row also carries obs["pixels"] uint8 [3, H, W]."""

  _count = 0  # Render lanes are numbered across the process's stages (one per env group).

  def __init__(self, inner, render_fn: Callable[[np.ndarray], np.ndarray], size: int, clock=None):
    """clock: a StageClock (ebrl/telemetry/stages.py) that records every draw as a "render" span."""
    self.inner = inner
    self._render_fn = render_fn  # env ids -> frames [k, H, W, 3] uint8 of their current state.
    self.num_envs = inner.num_envs
    self.spec = dataclasses.replace(inner.spec, obs={**inner.spec.obs, "pixels": ObsSpec((3, size, size),
                                                                                        np.dtype(np.uint8))})
    self._lane = f"render{RenderStage._count}"  # Where its draws show on the timeline.
    RenderStage._count += 1
    self._clock = clock
    self.frames = 0
    self._workers = _render_workers()

  def __getattr__(self, name: str):
    return getattr(self.inner, name)

  def _draw_here(self, env_ids: np.ndarray) -> np.ndarray:
    span = self._clock.stage("render", lane=self._lane) if self._clock is not None else contextlib.nullcontext()
    with span:
      frames = self._render_fn(env_ids)
    return np.ascontiguousarray(frames.transpose(0, 3, 1, 2))

  def draw(self, env_ids: np.ndarray) -> np.ndarray:
    """uint8 [len(env_ids), 3, H, W] frames of these envs' current state, drawn on the render thread
    (the envs must not be in flight)."""
    frames = self._workers.submit(self._draw_here, np.asarray(env_ids)).result()
    self.frames += len(env_ids)
    return frames

  def _with_pixels(self, b: StepBatch) -> StepBatch:
    b.obs["pixels"] = self.draw(b.env_ids)
    return b

  def reset(self) -> None:
    self.inner.reset()

  def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
    self.inner.send(actions, env_ids)

  def recv(self) -> StepBatch:
    return self._with_pixels(self.inner.recv())

  def step(self, actions: np.ndarray) -> StepBatch:
    return self._with_pixels(self.inner.step(actions))

  def can_recv(self) -> bool:
    return self.inner.can_recv()

  def reset_envs(self, env_ids: np.ndarray) -> None:
    self.inner.reset_envs(env_ids)

  def close(self) -> None:
    self.inner.close()
