"""Supervised pre-training (SFT) of any policy on recorded demonstrations, before RL fine-tuning.

  The losses, one per policy family, are in ebrl/algorithms/imitation.py: the RL update's
  demonstration term uses the same ones.
  data.py    demo steps as (observation, chunk of expert actions, mask) in streamed, shuffled,
             fixed-size batches; observation statistics from the demos (std floored); a
             Gaussian's maximum-likelihood std given its trained mean, in closed form
  train.py   the loop: Adam, held-out evaluation, early stopping, TensorBoard rows, a progress bar
  run.py     one run as `python -m launch.sft` drives it: checks first, outputs that
             `--config.warm_start` loads
"""

from ebrl.algorithms.imitation import LOSSES, loss_for
from ebrl.sft.run import SFTRun, pretrain
from ebrl.sft.train import SFTConfig, train

__all__ = ["LOSSES", "SFTConfig", "SFTRun", "loss_for", "pretrain", "train"]
