"""Demonstrations on disk: the format `launch.demos` records and supervised pre-training reads.

A demo directory (format "ebrl-demos", version 1):

  DIR/manifest.json          written last: a directory without one is no demo set (or an unfinished one)
  DIR/shards/00000.npz ...   episodes, in the order they finished, `episodes_per_shard` per shard (by
                             default as many as fill 64 MiB of arrays: a reader holds one shard)

manifest.json holds
  format, version            "ebrl-demos", 1 (a reader refuses any other version)
  env, tasks, instructions   the env name as launch.train takes it (`MetaWorld/MT10`, `MetaWorld/Reach-v3`),
                             its task list and one instruction per task (a task's id is its index)
  observation                {key: {shape, dtype}} per env, exactly the adapter's observation spec
                             (`state`; `task`, a one-hot, on multi-task envs; `pixels` with --from_pixels)
  action                     {dim, dtype, low, high}
  expert                     {package, version, policies: {task: class name}}
  seed, envs_per_task, episodes_per_task, max_episode_steps, action_noise, kept ("successful" | "all"),
  from_pixels, render_size, render_camera, episodes_per_shard
                             what was asked: the same values record the same bytes
  by_task                    {task: {episodes, successes, expert_success, kept, steps}}: every episode
                             recorded counts in `episodes` and `expert_success` (success at any step),
                             whether or not it was kept; a task whose expert never succeeds is listed
                             with 0.0 and no kept episode
  episodes, steps            totals kept
  nan_resets                 episodes ended by non-finite physics (counted as failures, never kept)
  shards                     [{file, episodes, steps}] in order

A shard is an .npz (deflated entries, fixed timestamps: the same recording is the same bytes) of
E episodes with S steps in all, an episode's steps contiguous and in order:

  per step [S, ...]     obs/<key>        the observation the action was taken on
                        actions          the executed action (expert + noise, clipped to the bounds)
                        expert_actions   the expert's action on that observation, clipped
                        rewards, success the reward and success after the action (float32)
  per episode [E, ...]  final_obs/<key>  the observation after the episode's last action
                        episode_length, episode_task, episode_instruction, episode_success,
                        episode_return, episode_env (env id in the recording), episode_index
                        (the episode's number within its task, counting every episode recorded)

`open_demos(DIR)` reads the manifest (one-line DemoFormatError for a missing or empty directory,
a manifest of another format or version, or a missing shard) and streams shard by shard:
`episodes()` yields Episode records, `minibatches(batch_size)` fixed-size batches of steps in the
layout `ebrl.warm_start` uses ({"obs": {key: ...}, "actions": ...} plus per-step extras), holding
one shard (and a batch's remainder) in memory at a time.
"""

from ebrl.demos.format import FORMAT, FORMAT_VERSION, MANIFEST, DemoFormatError
from ebrl.demos.reader import DemoSet, Episode, open_demos

__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST", "DemoFormatError", "DemoSet", "Episode", "open_demos"]
