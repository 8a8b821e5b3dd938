"""The render stage: state and pixels, frames drawn on render threads, spans on the clock."""

from __future__ import annotations

import ctypes.util

import numpy as np
import pytest

from ebrl.telemetry.stages import StageClock
from ebrl.telemetry.trace import Tracer
from sim_adapters.envpool_adapter import gather_all

pytestmark = pytest.mark.skipif(not ctypes.util.find_library("EGL"),
                                reason="no libEGL on this machine (apt install libegl1)")


def _run(make, steps=3, clock=None):
  sim = make("MetaWorld/Reach-v3", 4, from_pixels=True, render_stage=True, render_size=32, seed=3)
  if clock is not None:
    sim.set_clock(clock)
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
