"""Tokenizers for the VLA policy: continuous actions <-> bins, instructions -> word ids.

Why uniform per-dimension bins (as OpenVLA): a discrete categorical over bins
can express multi-modal action distributions that a Gaussian cannot, and an
exact bin <-> value round trip lets the learner recover the sampled tokens
from the float actions stored in the rollout. Both tokenizers work on numpy
arrays (host side) and on jax arrays (inside jit).
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import jax.numpy as jnp
import numpy as np

PAD, UNK = "<pad>", "<unk>"


def _xp(x):
  """numpy for numpy inputs (host side), jax.numpy otherwise (tracers, jax arrays)."""
  return np if isinstance(x, (np.ndarray, np.generic, float, int, list, tuple)) else jnp


class ActionTokenizer:
  """Uniform bins over [low, high] per action dimension; token t <-> bin centre.

  Values outside the bounds are clipped first, so every value maps to a valid
  token and any in-range value is within half a bin of its token's value.
  """

  def __init__(self, low: np.ndarray, high: np.ndarray, bins: int = 256):
    low = np.asarray(low, np.float32).reshape(-1)
    high = np.asarray(high, np.float32).reshape(-1)
    if low.shape != high.shape:
      raise ValueError(f"action bounds differ in shape: {low.shape} vs {high.shape}")
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high > low)):
      raise ValueError(f"action bounds must be finite with high > low, got low={low} high={high}")
    if bins < 2:
      raise ValueError(f"need at least 2 bins, got {bins}")
    self.low, self.high, self.bins = low, high, int(bins)
    self.width = ((high - low) / bins).astype(np.float32)

  @property
  def dims(self) -> int:
    return int(self.low.shape[0])

  def to_tokens(self, values):
    """values [..., dims] float -> int32 tokens in [0, bins)."""
    xp = _xp(values)
    v = xp.clip(xp.asarray(values, xp.float32), self.low, self.high)
    t = xp.floor((v - self.low) / self.width)
    return xp.clip(t, 0, self.bins - 1).astype(xp.int32)

  def to_values(self, tokens):
    """tokens [..., dims] int -> float32 bin centres."""
    xp = _xp(tokens)
    t = xp.asarray(tokens).astype(xp.float32)
    return (self.low + (t + 0.5) * self.width).astype(xp.float32)


def split_words(text: str) -> list[str]:
  """Lowercase, split on anything that is not a letter."""
  return [w for w in re.split(r"[^a-z]+", text.lower()) if w]


class InstructionTokenizer:
  """Word-level tokenizer over a fixed vocabulary; id 0 is <pad>, 1 is <unk>.

  Deterministic by construction (sorted vocabulary, no hashing), so the same
  instruction maps to the same ids on every host and in every checkpoint.
  """

  def __init__(self, vocab: Iterable[str]):
    words = sorted({w for w in vocab if w not in (PAD, UNK)})
    self.vocab: tuple[str, ...] = (PAD, UNK, *words)
    self._ids = {w: i for i, w in enumerate(self.vocab)}

  @classmethod
  def from_texts(cls, texts: Sequence[str]) -> "InstructionTokenizer":
    """The vocabulary of every word in `texts`."""
    return cls(w for t in texts for w in split_words(t))

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  @property
  def pad_id(self) -> int:
    return 0

  @property
  def unk_id(self) -> int:
    return 1

  def encode(self, text: str, length: int) -> np.ndarray:
    """int32 [length]: word ids, truncated to `length`, padded with <pad>."""
    ids = [self._ids.get(w, self.unk_id) for w in split_words(text)][:length]
    return np.array(ids + [self.pad_id] * (length - len(ids)), np.int32)

  def encode_batch(self, texts: Sequence[str], length: int) -> np.ndarray:
    """int32 [len(texts), length]."""
    return np.stack([self.encode(t, length) for t in texts]) if texts else np.zeros((0, length), np.int32)

  def word_counts(self, texts: Sequence[str]) -> np.ndarray:
    """float32 [len(texts), vocab_size]: how often each known word occurs in each text (a bag of words)."""
    out = np.zeros((len(texts), self.vocab_size), np.float32)
    for row, text in enumerate(texts):
      for w in split_words(text):
        if w in self._ids:
          out[row, self._ids[w]] += 1.0
    return out

  def decode(self, ids) -> str:
    return " ".join(self.vocab[int(i)] for i in np.asarray(ids).reshape(-1) if int(i) != self.pad_id)
