"""Errors a person can fix by changing what they typed. The CLI prints them as one line and exits 2;
anything else is a bug and keeps its traceback."""

from __future__ import annotations

import sys
from typing import Any, Callable


class UserError(Exception):
    """Bad input: a spec, a flag, a path. The message is the whole one-line explanation."""


def one_line_errors(prog: str, run: Callable[[Any], int], args: Any) -> int:
    """Run a subcommand that has its own parser (bench, convert): a UserError is its one line and exit 2."""
    try:
        return run(args)
    except UserError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        return 2
