"""MetaWorld's 50 tasks, their instructions, and the multi-task env names built from them.

Why one module: a multi-task env is known only by its name, and every layer
reads that name (validation, the run layout, the resource planner, the
policies' instruction tokens, the trainer's per-task success). Three forms name
a task list:

  MetaWorld/MT10                   the ten MT10 tasks, in MT10's order;
  MetaWorld/MT50                   all 50 tasks, in EnvPool's (and MetaWorld's) order;
  MetaWorld/MT:Reach-v3,Push-v3    any list of distinct tasks, in the order given.

`multitask_tasks` is the one parser; whatever treats a multi-task env
differently asks it (or `is_multitask`). The module imports nothing from the
project, so the run layout, at the bottom of the import graph, can ask too.
"""

from __future__ import annotations

import difflib

PREFIX = "MetaWorld/"
LIST_PREFIX = "MetaWorld/MT:"  # A user's list: MetaWorld/MT:<task>,<task>,...

# Every MetaWorld v3 task EnvPool registers, in its registry's order, with a short instruction in
# the style of MetaWorld's own task descriptions (what the language-conditioned policies read).
METAWORLD_INSTRUCTIONS: dict[str, str] = {
    "Assembly-v3": "pick up the nut and place it onto the peg",
    "Basketball-v3": "dunk the basketball into the basket",
    "BinPicking-v3": "grasp the puck from one bin and place it into the other bin",
    "BoxClose-v3": "grasp the cover and close the box with it",
    "ButtonPressTopdown-v3": "press the button from the top",
    "ButtonPressTopdownWall-v3": "bypass the wall and press the button from the top",
    "ButtonPress-v3": "press the button",
    "ButtonPressWall-v3": "bypass the wall and press the button",
    "CoffeeButton-v3": "push the button on the coffee machine",
    "CoffeePull-v3": "pull the mug from the coffee machine",
    "CoffeePush-v3": "push the mug under the coffee machine",
    "DialTurn-v3": "turn the dial",
    "Disassemble-v3": "pick the nut off the peg",
    "DoorClose-v3": "close the door",
    "DoorLock-v3": "lock the door by turning the lock clockwise",
    "DoorOpen-v3": "open the door",
    "DoorUnlock-v3": "unlock the door by turning the lock counterclockwise",
    "HandInsert-v3": "insert the gripper into the hole",
    "DrawerClose-v3": "close the drawer",
    "DrawerOpen-v3": "open the drawer",
    "FaucetOpen-v3": "turn the faucet counterclockwise",
    "FaucetClose-v3": "turn the faucet clockwise",
    "Hammer-v3": "hammer the nail into the wall",
    "HandlePressSide-v3": "press the handle down from the side",
    "HandlePress-v3": "press the handle down",
    "HandlePullSide-v3": "pull the handle up from the side",
    "HandlePull-v3": "pull the handle up",
    "LeverPull-v3": "pull the lever up",
    "PickPlaceWall-v3": "pick up the puck, bypass the wall and place it at the goal",
    "PickOutOfHole-v3": "pick the puck up out of the hole",
    "PickPlace-v3": "pick up the puck and place it at the goal",
    "PlateSlide-v3": "slide the plate into the cabinet",
    "PlateSlideSide-v3": "slide the plate into the cabinet from the side",
    "PlateSlideBack-v3": "slide the plate back out of the cabinet",
    "PlateSlideBackSide-v3": "slide the plate back out of the cabinet from the side",
    "PegInsertSide-v3": "insert the peg into the hole from the side",
    "PegUnplugSide-v3": "unplug the peg from the side",
    "Soccer-v3": "kick the ball into the goal",
    "StickPush-v3": "grasp the stick and push the box with it",
    "StickPull-v3": "grasp the stick and pull the box with it",
    "Push-v3": "push the puck to the goal",
    "PushWall-v3": "bypass the wall and push the puck to the goal",
    "PushBack-v3": "pull the puck back to the goal",
    "Reach-v3": "reach the goal position",
    "ReachWall-v3": "bypass the wall and reach the goal position",
    "ShelfPlace-v3": "pick up the puck and place it onto the shelf",
    "SweepInto-v3": "sweep the puck into the hole",
    "Sweep-v3": "sweep the puck off the table",
    "WindowOpen-v3": "slide the window open",
    "WindowClose-v3": "slide the window closed",
}

MT10: tuple[str, ...] = ("Reach-v3", "Push-v3", "PickPlace-v3", "DoorOpen-v3", "DrawerOpen-v3", "DrawerClose-v3",
                         "ButtonPressTopdown-v3", "PegInsertSide-v3", "WindowOpen-v3", "WindowClose-v3")
MT50: tuple[str, ...] = tuple(METAWORLD_INSTRUCTIONS)
NAMED_LISTS: dict[str, tuple[str, ...]] = {"MetaWorld/MT10": MT10, "MetaWorld/MT50": MT50}


class TaskListError(ValueError):
  """A multi-task env name whose task list is empty, repeats a task or names an unknown one."""


def is_multitask(name: str) -> bool:
  """Whether `name` has the form of a multi-task MetaWorld env (its list is checked by `multitask_tasks`)."""
  return name in NAMED_LISTS or name.startswith(LIST_PREFIX)


def _valid() -> str:
  return f"valid tasks: {', '.join(MT50)}"


def multitask_tasks(name: str) -> tuple[str, ...] | None:
  """The task list `name` stands for, or None when it is not a multi-task env name.

  Raises TaskListError (one line naming the bad value and the valid choices) for a
  user's list that is empty, repeats a task or names a task MetaWorld does not have.
  """
  if name in NAMED_LISTS:
    return NAMED_LISTS[name]
  if not name.startswith(LIST_PREFIX):
    return None
  tasks = tuple(t.strip() for t in name[len(LIST_PREFIX):].split(","))
  if not any(tasks):
    raise TaskListError(f"env '{name}' names no task: give a comma-separated list such as "
                        f"{LIST_PREFIX}Reach-v3,Push-v3; {_valid()}")
  for task in tasks:
    if task not in METAWORLD_INSTRUCTIONS:
      shown = repr(task) if task else "an empty name"
      close = difflib.get_close_matches(task, MT50, n=3, cutoff=0.6)
      hint = f" (closest: {', '.join(close)})" if close else ""
      raise TaskListError(f"env '{name}' lists unknown MetaWorld task {shown}{hint}; {_valid()}")
  for task in tasks:
    if tasks.count(task) > 1:
      raise TaskListError(f"env '{name}' lists task '{task}' {tasks.count(task)} times; each task may appear once")
  return tasks


def task_instructions(name: str) -> list[str] | None:
  """One instruction per task id of multi-task env `name`; for a single MetaWorld task its own (one
  entry); None for any other env."""
  tasks = multitask_tasks(name)
  if tasks is not None:
    return [METAWORLD_INSTRUCTIONS[t] for t in tasks]
  task = name[len(PREFIX):] if name.startswith(PREFIX) else None
  return [METAWORLD_INSTRUCTIONS[task]] if task in METAWORLD_INSTRUCTIONS else None
