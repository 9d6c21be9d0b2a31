"""Writing outputs so that nothing half-written is ever left behind: a file is written beside its target
and renamed over it; a folder is built beside its target and swapped in."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Mapping

from autotune.errors import UserError

KIT_MARKER = ".autotune-kit"


def write_text_atomic(path: str | Path, text: str, mode: int = 0o644) -> Path:
    out = Path(path)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"cannot write {out}: folder {parent} does not exist")
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{out.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def write_folder_atomic(path: str | Path, files: Mapping[str, tuple[str, int]], keep: tuple[str, ...] = ()) -> Path:
    """Write `files` (name -> (text, mode)) as the folder `path`. An existing folder is replaced only
    when an earlier export wrote it (it holds the marker file); any other non-empty folder is refused.
    Entries named in `keep` (a running server's PID and log folder) move into the new folder."""
    out = Path(path)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"cannot write {out}: folder {parent} does not exist")
    if out.exists():
        if not out.is_dir():
            raise UserError(f"cannot write {out}: it is a file, not a folder")
        if any(out.iterdir()) and not (out / KIT_MARKER).is_file():
            raise UserError(f"cannot write {out}: the folder holds other files (give a new or empty folder)")
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}."))
    try:
        for name, (text, mode) in {**files, KIT_MARKER: ("written by autotune export\n", 0o644)}.items():
            (tmp / name).write_text(text)
            os.chmod(tmp / name, mode)
        os.chmod(tmp, 0o755)
        if out.exists():
            for name in keep:
                if (out / name).exists() and not (tmp / name).exists():
                    os.replace(out / name, tmp / name)
            old = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.old."))
            os.replace(out, old / "kit")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
