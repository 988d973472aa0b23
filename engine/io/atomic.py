"""Atomic file writes: write a temp file in the destination folder, then `os.replace` it.

A reader (or a crash) never sees a half-written file under the final name: either the old file,
the new one, or nothing. The temp file is `.NAME.PID-XXXXXXXX.tmp` beside the destination: a
killed writer's leftover names its process, so `clean_temp_files` removes it as soon as that
process is gone (the next export into the folder), never one a live writer is still filling.
"""
from __future__ import annotations

import contextlib
import glob
import os
import re
import tempfile
import time
from pathlib import Path
from typing import IO, Iterator, Optional, Union

from ..api import EngineError


class OutputError(EngineError):
    """A result file could not be written (bad folder, no permission, disk full)."""


TMP_SUFFIX = ".tmp"
STALE_UNNAMED_TMP_S = 60.0      # a temp file without a writer PID (older versions): stale after this
_TMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)-[^.]*" + re.escape(TMP_SUFFIX) + "$")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                 # exists, owned by someone else
        return True
    return True


def clean_temp_files(folder: Union[str, Path], name: Optional[str] = None) -> int:
    """Remove the temp files of `atomic_open` writers that are gone (killed mid-write) from
    `folder` (only those for the destination `name`, if given); returns how many. A temp file
    whose writer is still running is kept; one without a PID only once it is a minute old."""
    removed = 0
    pattern = f".{glob.escape(name)}.*{TMP_SUFFIX}" if name else f".*{TMP_SUFFIX}"
    try:
        candidates = list(Path(folder).glob(pattern))
    except OSError:
        return 0
    for p in candidates:
        m = _TMP_RE.match(p.name)
        with contextlib.suppress(OSError):
            if m and (name is None or m["name"] == name):
                if _pid_alive(int(m["pid"])):
                    continue
            elif m or (name and "." in p.name[len(name) + 2:-len(TMP_SUFFIX)]):
                continue            # another destination's temp file
            elif time.time() - p.stat().st_mtime < STALE_UNNAMED_TMP_S:
                continue
            if p.is_file():
                p.unlink()
                removed += 1
    return removed


@contextlib.contextmanager
def atomic_open(path: Union[str, Path], mode: str = "wb", *, fsync: bool = False,
                make_parents: bool = True) -> Iterator[IO]:
    """`with atomic_open(p) as f: f.write(...)` — `p` appears complete, or not at all."""
    path = Path(path)
    try:
        if make_parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}-", suffix=TMP_SUFFIX, dir=path.parent)
    except OSError as exc:
        raise OutputError(f"Cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644)   # mkstemp makes 0600 files; results are ordinary files
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(f"Cannot write {path}: {exc.strerror or exc}") from None
        raise
