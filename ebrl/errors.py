"""User-facing errors: the launchers print these as one line and exit 2; the Python API raises them."""


class UserError(Exception):
  """A mistake in what the user asked for (config, names, paths)."""


def one_line(e: Exception) -> str:
  """An exception's message on one line, without the quotes a KeyError adds (ml_collections'
  unknown-key errors are KeyErrors whose text carries its own newlines)."""
  text = str(e)
  while len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
    text = text[1:-1]
  return " ".join(text.replace("\\n", "\n").replace("\\'", "'").split())


class StageProcessError(RuntimeError):
  """A stage process (the learner process) died or failed; the message names it and how. Not the
  user's mistake: the launchers print it as one line and exit 1."""
