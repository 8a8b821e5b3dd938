"""Learning that actually improves, and holds: the default task is solved by the sync trainer
and stays solved; a MetaWorld task whose success collapsed late under earlier defaults keeps it,
and one that the fixed reward scale never solved is solved."""

from __future__ import annotations

import json

import pytest

from launch.configs import default
from tiny_configs import run_to_end


def test_sync_ppo_solves_reach(tmp_path):
  cfg = default.get_config()
  cfg.total_env_steps = 300_000
  cfg.checkpoint_every_s = 1e9
  _, summary = run_to_end(cfg, tmp_path)
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  returns = [r["episode_return"] for r in rows if r["episode_return"] is not None]
  assert returns[-1] > 2.0 * returns[0]
  assert summary["final_success_rate"] >= 0.9
  assert summary["time_to_success_s"] is not None
  # Success over a full window of 100 episodes needs at least 100 finished episodes' steps.
  assert 100 * 500 <= summary["env_steps_to_success"] <= summary["env_steps"]
  # Every env's 500-step episodes end together (each followed by EnvPool's one auto-reset step):
  # the window can only reach the target at the step an episode ends, and it is dated there, not
  # at the end of the 128-step rollout that held it.
  per_env, rest = divmod(summary["env_steps_to_success"], cfg.num_envs)
  assert rest == 0 and (per_env + 1) % 501 == 0, summary["env_steps_to_success"]
  assert summary["nan_resets"] == 0 and summary["skipped_updates"] == 0
  # Reached and held: the last window is not far below the best one.
  assert summary["final_success_rate"] >= summary["best_success_rate"] - 0.1


@pytest.mark.slow
def test_default_ppo_holds_success_on_drawer_close(tmp_path):
  """DrawerClose-v3 reached 1.00 by 200k env steps and fell to 0.00 by 600k under the earlier
  defaults (BENCHMARKS.md): the final window must stay near the best one and at the target."""
  cfg = default.get_config()
  cfg.env.name = "MetaWorld/DrawerClose-v3"
  cfg.checkpoint_every_s = 1e9
  _, summary = run_to_end(cfg, tmp_path)
  assert summary["best_success_rate"] >= 0.9
  assert summary["final_success_rate"] >= 0.9
  assert summary["final_success_rate"] >= summary["best_success_rate"] - 0.1


@pytest.mark.slow
def test_default_ppo_solves_faucet_close(tmp_path):
  """FaucetClose-v3 never reached 0.9 in 600k env steps under the fixed reward_scale of 0.1 (best
  and final 0.75, seed 0), while SB3's PPO reached it at 416k; with rewards normalised by the
  running std of the discounted return the default reaches it (449k / 513k in seeds 0 / 1,
  BENCHMARKS.md) and must end at the target."""
  cfg = default.get_config()
  cfg.env.name = "MetaWorld/FaucetClose-v3"
  cfg.total_env_steps = 600_000
  cfg.checkpoint_every_s = 1e9
  _, summary = run_to_end(cfg, tmp_path)
  assert summary["final_success_rate"] >= 0.9, summary
  assert summary["env_steps_to_success"] is not None
