"""The render stage: state and pixels, frames drawn on render threads, spans on the clock."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ebrl.resources import enforce
from ebrl.telemetry.stages import StageClock
from ebrl.telemetry.trace import Tracer
from sim_adapters.base import gather_all

pytestmark = pytest.mark.egl


def _run(make, steps=3, clock=None):
  sim = make("MetaWorld/Reach-v3", 4, from_pixels=True, render_stage=True, render_size=32, seed=3, clock=clock)
  sim.reset()
  rows = [gather_all(sim, 4)]
  rng = np.random.default_rng(0)
  for _ in range(steps):
    rows.append(sim.step(rng.uniform(-1, 1, (4, 4)).astype(np.float32)))
  return sim, rows


def test_rows_carry_state_and_the_frame_of_the_state_they_report(make):
  sim, rows = _run(make)
  assert set(sim.spec.obs) == {"state", "pixels"} and sim.spec.obs["pixels"].shape == (3, 32, 32)
  px = rows[-1].obs["pixels"]
  assert px.shape == (4, 3, 32, 32) and px.dtype == np.uint8 and len(np.unique(px)) > 20
  assert rows[-1].obs["state"].shape == (4, 39)
  assert not np.array_equal(rows[0].obs["pixels"], rows[-1].obs["pixels"])  # The arm moved.
  assert sim.frames == 4 * len(rows)


def test_frames_are_deterministic_for_a_seed(make):
  _, one = _run(make)
  _, two = _run(make)
  for a, b in zip(one, two):
    np.testing.assert_array_equal(a.obs["state"], b.obs["state"])
    np.testing.assert_array_equal(a.obs["pixels"], b.obs["pixels"])


def test_draws_are_render_spans_on_their_own_lanes(make):
  tracer = Tracer()
  clock = StageClock(tracer)
  _run(make, clock=clock)
  spans = [s for s in tracer.spans() if s.name == "render"]
  assert spans and len({s.lane for s in spans}) == 1 and spans[0].lane.startswith("render")
  assert clock.snapshot()["render"] > 0


def test_render_stage_needs_pixels_and_one_pool(make):
  with pytest.raises(ValueError, match="needs from_pixels=True"):
    make("MetaWorld/Reach-v3", 2, render_stage=True)
  with pytest.raises(ValueError, match="one pool per task"):
    make("MetaWorld/MT10", 10, from_pixels=True, render_stage=True)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
def test_resource_manager_runs_the_draws_on_the_render_quota(tmp_path):
  """resources=manual with quotas.render_cores: the render thread and Mesa's rasterizer threads run
  on the render cores, EnvPool's workers on sim's, and the draws are timed as render spans."""
  from ebrl.trainer import Trainer
  from launch.configs import default
  from sim_adapters.render_stage import render_thread_ids

  usable = tuple(sorted(os.sched_getaffinity(0)))
  first, last = str(usable[0]), str(usable[-1])
  cfg = default.get_config()
  cfg.scheduler, cfg.num_envs, cfg.rollout_length, cfg.total_env_steps = "ebrl", 8, 8, 256
  cfg.env.from_pixels, cfg.env.render_stage, cfg.env.render_size = True, True, 32
  cfg.policy.name, cfg.policy.hidden = "cnn", (16,)
  cfg.algorithm.epochs, cfg.algorithm.num_minibatches, cfg.ebrl.num_groups = 1, 2, 2
  cfg.resources = "manual"
  cfg.quotas.sim_cores, cfg.quotas.gen_cores, cfg.quotas.train_cores, cfg.quotas.render_cores = first, last, last, last
  cfg.checkpoint_every_s = 1e9
  trainer = Trainer(cfg, str(tmp_path), progress=False)
  enforcer = trainer.resources.enforcer
  assert trainer.resources.plan.cpu_sets["render"] == (usable[-1],)
  placed = enforcer.readback()
  assert {placed["render"][t] for t in render_thread_ids()} == {(usable[-1],)}
  assert set(render_thread_ids()).isdisjoint(placed["sim"])
  assert placed["sim"] and set(placed["sim"].values()) == {(usable[0],)}  # EnvPool's workers.
  trainer.train(256)
  placed = enforcer.readback()
  mesa = [t for t in placed["render"] if enforce.thread_name(t).startswith(enforce.MESA_THREAD_PREFIX)]
  assert mesa and {placed["render"][t] for t in mesa} == {(usable[-1],)}
  assert trainer.clock.snapshot()["render"] > 0
  summary = trainer.finish()
  assert summary["env_steps"] >= 256
