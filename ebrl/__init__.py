"""EBRL: asynchronous embodied reinforcement learning in JAX.

The Python API (ebrl/api.py): `ebrl.train`, `ebrl.evaluate`, `ebrl.bench`, `ebrl.profile`,
`ebrl.default_config`, `ebrl.make_config`; bad input raises `ebrl.UserError`. Loaded on first use, so `import ebrl.<module>` stays light.
"""

__version__ = "0.1.0"

_API = ("train", "evaluate", "bench", "profile", "default_config", "make_config", "Summary")


def __getattr__(name: str):
  if name in _API:
    from ebrl import api  # pylint: disable=g-import-not-at-top
    return getattr(api, name)
  if name == "UserError":
    from ebrl.errors import UserError  # pylint: disable=g-import-not-at-top
    return UserError
  raise AttributeError(f"module 'ebrl' has no attribute '{name}'")


def __dir__() -> list[str]:
  return sorted([*globals(), *_API, "UserError"])
