"""User-facing errors: the launchers print these as one line and exit 2."""


class UserError(Exception):
  """A mistake in what the user asked for (config, names, paths)."""
