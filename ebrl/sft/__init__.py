"""Supervised pre-training (SFT) of any policy on recorded demonstrations, before RL fine-tuning.

  losses.py  one loss per policy family on expert action chunks: Gaussian negative log-likelihood
             (mlp, cnn), cross-entropy on the discretised action tokens (vla, either decoding mode),
             conditional flow matching (flow)
  data.py    demo steps as (observation, chunk of expert actions, mask) in streamed, shuffled,
             fixed-size batches; observation statistics from the demos
  train.py   the loop: Adam, held-out evaluation, TensorBoard rows, a progress bar
  run.py     one run as `python -m launch.sft` drives it: checks first, outputs that
             `--config.warm_start` loads
"""

from ebrl.sft.losses import LOSSES, loss_for
from ebrl.sft.run import SFTRun, pretrain
from ebrl.sft.train import SFTConfig, train

__all__ = ["LOSSES", "SFTConfig", "SFTRun", "loss_for", "pretrain", "train"]
