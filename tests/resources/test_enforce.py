"""CPU quotas are really applied: every pin is read back from the kernel."""

import ctypes
import os
import threading

import pytest

from ebrl.resources import enforce
from ebrl.resources.plan import Plan

USABLE = tuple(sorted(os.sched_getaffinity(0)))


def _plan(sim, gen, train) -> Plan:
  return Plan(mode="manual", cpu_sets={"sim": sim, "gen": gen, "train": train, "assemble": gen}, sim_threads=1,
              thread_affinity_offset=-1, num_groups=1, recv_batch=1, max_gen_batch=1, max_wait_ms=1.0,
              num_minibatches=1, stage_cost_us={}, predicted_rates={}, predicted_env_steps_per_s=0.0,
              bottleneck="sim")


def test_parse_and_format_cores():
  assert enforce.parse_cores("0", USABLE) == (0,)
  assert enforce.format_cores((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
  with pytest.raises(ValueError, match=r"'0-999' names cores .* usable: "):
    enforce.parse_cores("0-999", USABLE)
  with pytest.raises(ValueError, match="is not a core list"):
    enforce.parse_cores("zero", USABLE)
  with pytest.raises(ValueError, match="empty range"):
    enforce.parse_cores("3-1", USABLE)


def _run_in_thread(fn):
  out = {}

  def body():
    out["tid"] = threading.get_native_id()
    out["value"] = fn()
    out["mask"] = tuple(sorted(os.sched_getaffinity(0)))
    # A thread created now inherits the mask (MT10's receivers rely on it).
    child = {}
    th = threading.Thread(target=lambda: child.update(mask=tuple(sorted(os.sched_getaffinity(0)))))
    th.start()
    th.join()
    out["child"] = child["mask"]

  th = threading.Thread(target=body)
  th.start()
  th.join()
  return out


def test_pin_stage_applies_to_the_calling_thread_only():
  first = (USABLE[0],)
  e = enforce.Enforcer(_plan(first, USABLE, USABLE))
  out = _run_in_thread(lambda: e.pin_stage("sim"))
  assert out["value"] == first and out["mask"] == first and out["child"] == first
  assert tuple(sorted(os.sched_getaffinity(0))) == USABLE  # The main thread is untouched.


def test_adopt_pins_threads_created_inside_and_apply_moves_them():
  first, last = (USABLE[0],), (USABLE[-1],)
  e = enforce.Enforcer(_plan(first, last, last))
  stop = threading.Event()
  with e.adopt("sim"):
    worker = threading.Thread(target=stop.wait)
    worker.start()
  try:
    masks = e.readback()["sim"]
    assert worker.native_id in masks and masks[worker.native_id] == first
    e.apply(_plan(last, first, first))  # A re-plan moves the recorded thread at once.
    assert e.readback()["sim"][worker.native_id] == last
    assert "1 threads on cores" in e.summary()["sim"]
  finally:
    stop.set()
    worker.join()


def test_pin_xla_finds_xla_compute_threads_and_pins_them_to_gen_and_train():
  import jax
  import jax.numpy as jnp

  jax.jit(lambda x: x @ x)(jnp.ones((128, 128))).block_until_ready()
  first = (USABLE[0],)
  e = enforce.Enforcer(_plan(USABLE, first, first))
  found = e.pin_xla()
  for tid, mask in e.readback().get("xla", {}).items():
    assert mask == first, tid
  assert found == len(e.readback().get("xla", {}))


def test_assign_moves_a_thread_to_another_stage_and_pin_named_finds_threads_by_name():
  if len(USABLE) < 2:
    pytest.skip("needs two usable cores")
  first, last = (USABLE[0],), (USABLE[-1],)
  plan = _plan(first, last, last)
  plan = plan.replace(cpu_sets={**plan.cpu_sets, "render": last})
  e = enforce.Enforcer(plan)
  stop = threading.Event()
  started = threading.Event()
  box = {}

  def body():
    box["tid"] = threading.get_native_id()
    ctypes.CDLL(None).prctl(15, b"ebrl-test-draw", 0, 0, 0)  # PR_SET_NAME, as Mesa names its threads.
    started.set()
    stop.wait()

  with e.adopt("sim"):
    th = threading.Thread(target=body)
    th.start()
    started.wait()
  try:
    assert e.readback()["sim"][box["tid"]] == first
    e.assign("render", [box["tid"]])
    back = e.readback()
    assert back["render"] == {box["tid"]: last} and box["tid"] not in back.get("sim", {})
    e.apply(plan.replace(cpu_sets={**plan.cpu_sets, "render": first}))  # A re-plan moves it.
    assert e.readback()["render"][box["tid"]] == first
    e.assign("sim", [box["tid"]])
    assert e.pin_named("render", "ebrl-test-draw") == 1 and e.readback()["render"] == {box["tid"]: first}
  finally:
    stop.set()
    th.join()
