"""Stage calibration: measured in its own process, cached per machine and run shape."""

from __future__ import annotations

import json
import os

import pytest

from ebrl.resources import profiler
from ebrl.resources.inventory import take_inventory
from ebrl.spec import translate
from launch.configs import default


def _tiny(env="MetaWorld/Reach-v3", n=4):
  cfg = default.get_config()
  cfg.env.name, cfg.num_envs, cfg.rollout_length = env, n, 8
  cfg.policy.hidden = (16, 16)
  cfg.algorithm.epochs, cfg.algorithm.num_minibatches = 1, 2
  return cfg


def test_calibration_runs_in_a_child_and_is_cached(tmp_path, monkeypatch):
  """Calibrated in a child, then reused. Under MPS (a running daemon's pipe directory, faked: no GPU
  here, so the shares change only the learner processes' environment) the child also starts a
  learner process at each share of SM_SHARES and times its updates and a generation call beside."""
  monkeypatch.setenv("EBRL_PROFILE_CACHE", str(tmp_path))
  cfg, inv, said = _tiny(), take_inventory(), []
  pipe = str(tmp_path / "mps-pipe")
  p = profiler.load_or_measure(translate(cfg), inv, log=said.append, seconds=0.05, mps_pipe_dir=pipe)
  assert p.fingerprint == inv.fingerprint() and p.shape == profiler.run_shape(translate(cfg))
  assert {q["batch"] for q in p.sim} >= {4} and all(q["env_steps_per_s"] > 0 for q in p.sim)
  assert {q["batch"] for q in p.gen} == {1, 2, 4} and all(q["wall_us"] > 0 for q in p.gen)
  assert p.train[0]["samples"] == 4 * 8 and p.train[0]["wall_s"] > 0
  assert p.sim_cpu_us(2) > 0 and p.train_rate() > 0
  assert [q["sm_percent"] for q in p.sm_shares] == list(profiler.SM_SHARES)
  assert all(q["update_s"] > 0 and q["gen_us"] > 0 for q in p.sm_shares)
  assert p.at_learner_share(p.sm_shares[0]).train_rate() > 0
  assert any("separate process" in s for s in said)
  again = profiler.load_or_measure(translate(cfg), inv, log=said.append, mps_pipe_dir=pipe)  # Same machine and shapes.
  assert again == p and said[-1].startswith("[profile] reusing")
  # Shares measured serve a run without MPS too.
  assert profiler.load_or_measure(translate(cfg), inv, log=said.append) == p


def test_a_failed_calibration_says_so(tmp_path, monkeypatch):
  monkeypatch.setenv("EBRL_PROFILE_CACHE", str(tmp_path))
  cfg = _tiny(env="MetaWorld/NoSuchTask-v3")
  with pytest.raises(RuntimeError, match="calibration process failed"):
    profiler.load_or_measure(translate(cfg), take_inventory(), log=lambda s: None, seconds=0.05)


@pytest.mark.egl
def test_render_stage_is_profiled_as_its_own_stage():
  """Draws are timed per call and grow with the frames; the simulator under a render stage is
  timed as the state pool it is, without the frames."""
  cfg = _tiny()
  cfg.env.from_pixels, cfg.env.render_stage, cfg.env.render_size = True, True, 32
  cores = tuple(sorted(os.sched_getaffinity(0)))
  draws = profiler.measure_render(translate(cfg), cores, [1, 4], seconds=0.2)
  one, four = draws
  assert (one["batch"], four["batch"]) == (1, 4)
  assert four["wall_us"] > 2 * one["wall_us"] > 0 and four["cpu_us"] > 2 * one["cpu_us"] > 0
  sim = profiler.measure_sim(translate(cfg), cores, len(cores), None, seconds=0.2)
  assert sim["cpu_us_per_step"] < one["cpu_us"] / 5  # Physics alone: far cheaper than a frame.


def test_a_failing_timed_update_is_an_error_not_zero_seconds():
  """The update thread beside generation must not swallow its error: 0 s per update would score a
  placement or an SM share as infinitely fast."""
  class Breaks:
    calls = 0

    def init(self, key):
      return 0

    def update_segments(self, state, batch):
      Breaks.calls += 1
      if Breaks.calls > 1:
        raise ValueError("out of memory")
      return state, {}

  with pytest.raises(RuntimeError, match="the timed updates failed: ValueError: out of memory"):
    profiler._beside(Breaks(), None, lambda: 1, 0.05)  # pylint: disable=protected-access


UNGUARDED = """
print("MAIN RAN", flush=True)
from ebrl.resources import profiler
from ebrl.spec import translate
from launch.configs import default
cfg = default.get_config()
cfg.env.name = "MetaWorld/NoSuchTask-v3"
try:
  profiler.measure_in_subprocess(translate(cfg), log=lambda s: None, seconds=0.05)
except RuntimeError as e:
  print("CALIBRATION", str(e).split(";")[0], flush=True)
"""


def test_an_unguarded_script_is_not_run_again_by_the_calibration(tmp_path):
  """A user's script without `if __name__ == "__main__"`: spawn would import it again in the
  calibration process, which would run it again (a second run, or an error blamed on calibration)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  script = tmp_path / "unguarded.py"
  script.write_text(UNGUARDED)
  proc = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": root},
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.count("MAIN RAN") == 1, proc.stdout + proc.stderr[-2000:]
  assert "CALIBRATION the stage calibration process failed (exit code 1)" in proc.stdout


@pytest.mark.slow  # A second calibration child; the MLP one above runs by default.
def test_a_flow_policy_with_chunks_is_profiled_with_its_own_action_width():
  """A flow policy's raw action carries its denoising chain beside the env's action (action_size >
  action_dim); the timed updates and the learner process's buffers are sized by it, so resources=auto
  can plan a flow run (the synthetic batch once had the env's width and the update refused it)."""
  cfg = _tiny()
  cfg.policy.name, cfg.policy.chunk_size, cfg.env.reward_type = "flow", 2, "action"
  p = profiler.measure(translate(cfg), take_inventory(), seconds=0.05, log=lambda m: None)
  assert p.train[0]["samples"] == 4 * 8 and p.train[0]["wall_s"] > 0
  assert p.placement is not None and p.placement["processes_us"] > 0


def test_a_cached_profile_is_reused_only_for_the_same_policy_settings():
  """The vla's decoding mode and size, and a reference policy, change what generation and updates
  cost: each is a shape of its own, and a shape survives the cache's JSON round trip."""
  base = _tiny()
  base.policy.name, base.policy.chunk_size = "vla", 4
  shape = profiler.run_shape(translate(base))
  assert json.loads(json.dumps(shape)) == shape
  for field, value in (("policy.decode", "autoregressive"), ("policy.width", 256), ("policy.depth", 4),
                       ("algorithm.ratio_level", "token"), ("algorithm.ref_kl_coef", 0.1)):
    cfg = _tiny()
    cfg.policy.name, cfg.policy.chunk_size = "vla", 4
    section, key = field.split(".")
    cfg[section][key] = value
    assert profiler.run_shape(translate(cfg)) != shape, field
