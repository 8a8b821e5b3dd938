"""A vla sized so that generating actions is a stage of its own on a CPU (`--config=launch/configs/vla_large.py`).

VLA-style policies in the field are transformers whose forward pass costs more than a simulator
step; the default vla (width 64, depth 2) costs a fraction of one, so on it the scheduler's
overlap of generation with simulation has little to hide. This preset keeps the default's
structure (instruction words, state token, parallel action-token decoding of 256 bins over a
chunk of 4 actions) and widens it to width 256, depth 4, 8 heads on MetaWorld/MT10 with 40 envs
(4 per task). BENCHMARKS.md ("The vla preset: where generation is a real stage") measures the
generation, simulation and training cost per env step of both sizes on MT10 and says where the
split falls; the default stays small so that tests and the quick start compile in seconds.

Fine-tuning it from demonstrations: README.md ("RL fine-tuning from a pre-trained policy"); pass
the same --config to launch.sft so that the pre-trained params have this shape.
"""

from ebrl import defaults


def get_config():
  c = defaults.get_config()
  c.env.name = "MetaWorld/MT10"
  c.num_envs = 40
  c.policy.name = "vla"
  c.policy.width = 256
  c.policy.depth = 4
  c.policy.heads = 8
  c.policy.chunk_size = 4
  return c
