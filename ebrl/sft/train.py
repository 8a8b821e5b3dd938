"""The supervised pre-training loop: Adam on the policy family's loss, held-out evaluation in fresh
episodes, TensorBoard curves, a progress bar, and params `--config.warm_start` loads.

Why evaluate in episodes: a falling loss says the expert's actions are imitated on the demos'
states, not that the policy succeeds from states it has not seen; the held-out envs are seeded
apart from the recording, so their initial states are not the demos'.
Why `log_std` stays frozen during the gradient steps by default: on near-deterministic demos the
Gaussian likelihood is maximised by a std shrinking towards 0 (and the loss unbounded below), and
the mean's gradient is scaled by 1 / std^2; the std is set afterwards, in closed form, from the
fitted mean's residuals (ebrl/sft/data.py fit_action_std, within policy.min_std / max_std).

Early stopping (`early_stop`): the params of the best held-out evaluation are kept (a tie keeps the
later one), and training stops once held-out success is 1.0 or has not improved for `patience`
evaluations in a row.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

from ebrl.algorithms.imitation import loss_for
from policies.base import key_name

Params = Any


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  steps: int = 10000
  batch_size: int = 256
  learning_rate: float = 3e-4
  lr_schedule: str = "constant"  # "constant", or "cosine": from learning_rate down to 0 over `steps`.
  max_grad_norm: float = 1.0
  eval_every: int = 0  # Steps between held-out evaluations; 0: only at the end.
  log_every: int = 50  # Steps between loss rows (metrics.jsonl, TensorBoard).
  frozen: tuple[str, ...] = ("log_std",)  # Leaves of params["net"] whose path names one of these stay as they are.
  early_stop: bool = False  # Keep the best held-out evaluation's params; stop at success 1.0 or after `patience`.
  patience: int = 5  # Evaluations in a row without improvement before an early stop.


def eval_score(result: dict) -> float:
  """What early stopping compares: held-out success (the return on envs without a success signal)."""
  sr = result.get("success_rate")
  return float(sr if sr is not None else result.get("episode_return", float("-inf")))


LR_SCHEDULES = ("constant", "cosine")


def learning_rate_at(cfg: SFTConfig) -> optax.Schedule:
  """step -> Adam's rate. Why a cosine: at a constant rate the minibatch noise sets a floor under the
  loss (a vla's token cross-entropy was still falling at 10k steps); decaying the rate to 0 settles
  into the basin the constant phase found. Continuing a constant-rate run (`launch.sft --init`) with
  a cosine is the usual warm-up-stable-decay schedule, split over two runs."""
  if cfg.lr_schedule == "cosine":
    return optax.cosine_decay_schedule(cfg.learning_rate, cfg.steps)
  if cfg.lr_schedule == "constant":
    return optax.constant_schedule(cfg.learning_rate)
  raise ValueError(f"lr_schedule='{cfg.lr_schedule}' must be one of: {', '.join(LR_SCHEDULES)}")


def optimizer_for(net: Params, cfg: SFTConfig, rate: optax.Schedule) -> optax.GradientTransformation:
  """Adam at `rate` with global-norm clipping; `cfg.frozen` leaves get zero updates."""
  inner = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(rate))
  labels = jax.tree_util.tree_map_with_path(
      lambda path, _: "frozen" if any(key_name(k) in cfg.frozen for k in path) else "train", net)
  return optax.multi_transform({"train": inner, "frozen": optax.set_to_zero()}, labels)


def make_step(policy, optimizer: optax.GradientTransformation) -> Callable:
  """The jitted step (net, opt_state, rest, obs, actions, mask, key) -> (net, opt_state, loss)."""
  loss_fn = loss_for(policy)

  def step(net, opt_state, rest, obs, actions, mask, key):
    loss, grads = jax.value_and_grad(lambda n: loss_fn({**rest, "net": n}, obs, actions, mask, key))(net)
    updates, opt_state = optimizer.update(grads, opt_state, net)
    return optax.apply_updates(net, updates), opt_state, loss

  return jax.jit(step, donate_argnums=(0, 1))


def to_device(batch: dict, keys: Sequence[str]) -> tuple[dict, jax.Array, jax.Array]:
  return ({k: jnp.asarray(batch["obs"][k]) for k in keys}, jnp.asarray(batch["actions"]),
          jnp.asarray(batch["mask"]))


def train(policy, params: Params, data: Iterator[dict], cfg: SFTConfig, key: jax.Array, *,
          evaluate: Callable[[Params], dict] | None = None, write: Callable[[dict], None] | None = None,
          progress: bool = True) -> tuple[Params, dict]:
  """Trains params["net"] on `data` for cfg.steps steps; returns (params, history).

  history: "loss" (every step's minibatch loss, of the steps run), "evals" ([{step, ...evaluate's
  result}]), "steps_run", "kept_step" (the step whose params are returned: the last, or with
  cfg.early_stop the best evaluation's). `write(row)` gets a row every cfg.log_every steps and after
  every evaluation.
  """
  rate = learning_rate_at(cfg)  # The rows log the rate each step used.
  optimizer = optimizer_for(params["net"], cfg, rate)
  step_fn = make_step(policy, optimizer)
  net, rest = params["net"], {k: v for k, v in params.items() if k != "net"}
  net = jax.tree.map(jnp.array, net)  # A copy: the step donates it, the caller keeps `params`.
  opt_state = optimizer.init(net)
  losses, evals, start = np.zeros(cfg.steps, np.float32), [], time.time()
  keys = None
  bar = tqdm.tqdm(total=cfg.steps, desc="sft", unit="step", disable=not progress, dynamic_ncols=True)
  best = {"score": float("-inf"), "net": None, "step": None, "stale": 0}

  def run_eval(step: int) -> bool:
    """Evaluates; with early stopping keeps the best params and says whether to stop."""
    result = evaluate({**rest, "net": net})
    evals.append({"step": step, **result})
    if write is not None:
      write({"step": step, "wall_s": time.time() - start,
             **{f"eval_{k}": v for k, v in result.items() if k != "episodes" and not isinstance(v, str)}})
    bar.set_postfix(loss=f"{losses[step - 1]:.4f}", held_out=_fmt(result.get("success_rate")))
    if not cfg.early_stop:
      return False
    score = eval_score(result)
    best["stale"] = 0 if score > best["score"] else best["stale"] + 1
    if score >= best["score"]:  # A tie keeps the later params.
      best.update(score=score, net=jax.tree.map(jnp.array, net), step=step)  # A copy: `net` is donated.
    return score >= 1.0 and result.get("success_rate") is not None or best["stale"] >= cfg.patience

  pending = []  # Losses still on the device: one sync per log interval (or evaluation).
  sync = {"synced": 0, "logged": 0}  # Steps whose losses are in `losses`; steps already in a row.

  def flush() -> None:
    nonlocal pending
    if pending:
      n = sync["synced"]
      losses[n:n + len(pending)] = np.asarray(jax.device_get(pending), np.float32)
      sync["synced"] += len(pending)
      pending = []

  step = 0
  try:
    for i in range(cfg.steps):
      if i % 256 == 0:
        key, sub = jax.random.split(key)
        keys = jax.random.split(sub, 256)
      batch = next(data)
      obs, actions, mask = to_device(batch, tuple(batch["obs"]))
      net, opt_state, loss = step_fn(net, opt_state, rest, obs, actions, mask, keys[i % 256])
      pending.append(loss)
      step = i + 1
      if step % cfg.log_every == 0 or step == cfg.steps:
        flush()
        row = {"step": step, "loss": float(np.mean(losses[sync["logged"]:step])),
               "learning_rate": float(rate(step - 1)), "wall_s": time.time() - start}
        sync["logged"] = step
        if write is not None:
          write(row)
        bar.set_postfix(loss=f"{row['loss']:.4f}",
                        held_out=_fmt(evals[-1].get("success_rate")) if evals else "-")
      bar.update(1)
      if evaluate is not None and (step == cfg.steps or (cfg.eval_every and step % cfg.eval_every == 0)):
        flush()
        if run_eval(step):
          break
  finally:
    bar.close()
  flush()
  history = {"loss": losses[:step], "evals": evals, "steps_run": step, "kept_step": step}
  if cfg.early_stop and best["net"] is not None:
    net, history["kept_step"] = best["net"], best["step"]
  return {**rest, "net": net}, history


def _fmt(x) -> str:
  return "-" if x is None else f"{x:.2f}"
