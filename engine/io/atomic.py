"""Atomic file writes: write a temp file in the destination folder, then `os.replace` it.

A reader (or a crash) never sees a half-written file under the final name: either the old file,
the new one, or nothing.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator, Union

from ..api import EngineError


class OutputError(EngineError):
    """A result file could not be written (bad folder, no permission, disk full)."""


TMP_SUFFIX = ".tmp"


@contextlib.contextmanager
def atomic_open(path: Union[str, Path], mode: str = "wb", *, fsync: bool = False,
                make_parents: bool = True) -> Iterator[IO]:
    """`with atomic_open(p) as f: f.write(...)` — `p` appears complete, or not at all."""
    path = Path(path)
    try:
        if make_parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
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
