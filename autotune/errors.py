"""Errors a person can fix by changing what they typed. The CLI prints them as one line and exits 2;
anything else is a bug and keeps its traceback."""


class UserError(Exception):
    """Bad input: a spec, a flag, a path. The message is the whole one-line explanation."""
