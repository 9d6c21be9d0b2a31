"""Storage URLs as a person may see them: the password masked, wherever a URL is printed, logged or
served. A password belongs in `PGPASSWORD` or `~/.pgpass` (libpq reads both), but one typed into a URL
must still never reach a terminal, a log, the status JSON or the database."""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]*)@")


def mask_url(text: str) -> str:
    """`postgresql+psycopg://me:secret@db/x` -> `postgresql+psycopg://me:***@db/x`; works on any text
    (an error message, a log line) so that a driver's exception quoting its URL cannot leak it."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
