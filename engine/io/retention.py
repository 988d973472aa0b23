"""Session retention: the sessions folder must not fill the disk silently.

A webcam session stores ~75 KB per frame (~8 GB per hour at 30 frames/s), so when a new session
starts the oldest sessions are deleted until the folder is within the size limit and no session
is older than the age limit. Never deleted: the session being started, sessions in use (a store
holds them open: `running.lock` names a live process, or the caller says they are open, e.g. the
one shown in the GUI), and anything that is not a session folder.
"""
from __future__ import annotations

import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Union

from .store import RUNNING_FILE, default_session_root

DEFAULT_MAX_GB = 20.0          # ~2.5 hours of webcam sessions
DEFAULT_MAX_AGE_DAYS = 30.0

# Where an app's settings store keeps the limits (any object with `get(key, default)`, e.g. the
# GUI's QSettings wrapper): the CLI and the GUI share one sessions folder and one pair of limits.
RETENTION_KEYS = {"max_gb": "sessions/max_gb", "max_age_days": "sessions/max_age_days"}


def retention_limits(settings=None) -> tuple[float, float]:
    """(max_gb, max_age_days) of the sessions folder (0 = no limit) read from `settings` (the
    RETENTION_KEYS), each falling back to its default when absent or not a number; without a
    settings store, the defaults."""
    def num(key, default):
        v = settings.get(RETENTION_KEYS[key], default) if settings is not None else default
        try:
            return max(0.0, float(v))
        except (TypeError, ValueError):
            return default
    return num("max_gb", DEFAULT_MAX_GB), num("max_age_days", DEFAULT_MAX_AGE_DAYS)


@dataclass
class SessionEntry:
    folder: Path
    bytes: int
    mtime: float               # newest change (seconds since the epoch)
    in_use: bool


def is_session_folder(p: Path) -> bool:
    return p.is_dir() and (p / "config.json").is_file() and (p / "frames").is_dir()


def folder_bytes(p: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(p):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def _in_use(p: Path) -> bool:
    """A store has the folder open: its lock names a live process on this host."""
    try:
        pid_s, host = (p / RUNNING_FILE).read_text().split()[:2]
        pid = int(pid_s)
    except (OSError, ValueError):
        return False
    if host != socket.gethostname():
        return True                # another machine (shared disk): assume it is running
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False               # a killed run's leftover lock
    except PermissionError:
        return True
    return True


def list_sessions(root: Union[str, Path, None] = None) -> list[SessionEntry]:
    """The session folders under `root` (default: the sessions folder), oldest first."""
    root = Path(root).expanduser() if root else default_session_root()
    out = []
    if not root.is_dir():
        return out
    for p in root.iterdir():
        if not is_session_folder(p):
            continue
        try:
            mtime = max(p.stat().st_mtime, (p / "config.json").stat().st_mtime, (p / "frames").stat().st_mtime)
        except OSError:
            continue
        out.append(SessionEntry(p, folder_bytes(p), mtime, _in_use(p)))
    out.sort(key=lambda e: e.mtime)
    return out


def sessions_usage(root: Union[str, Path, None] = None) -> tuple[int, int]:
    """(number of sessions, total bytes) under the sessions folder."""
    entries = list_sessions(root)
    return len(entries), sum(e.bytes for e in entries)


def apply_retention(root: Union[str, Path, None] = None, *, max_gb: Optional[float] = DEFAULT_MAX_GB,
                    max_age_days: Optional[float] = DEFAULT_MAX_AGE_DAYS,
                    keep: Iterable[Union[str, Path]] = (), now: Optional[float] = None) -> list[Path]:
    """Delete the oldest sessions until the folder holds at most `max_gb` and none is older than
    `max_age_days` (None or 0 = no limit). Sessions in `keep` and sessions in use are never
    deleted. Returns the deleted folders."""
    now = time.time() if now is None else now
    keep_set = {Path(k).expanduser().resolve() for k in keep if k}
    entries = list_sessions(root)
    total = sum(e.bytes for e in entries)
    limit = int(max_gb * 1e9) if max_gb else None
    deleted = []
    for e in entries:                        # oldest first
        too_old = bool(max_age_days) and now - e.mtime > max_age_days * 86400.0
        too_big = limit is not None and total > limit
        if not (too_old or too_big):
            continue
        if e.in_use or e.folder.resolve() in keep_set:
            continue
        shutil.rmtree(e.folder, ignore_errors=True)
        if not e.folder.exists():
            deleted.append(e.folder)
            total -= e.bytes
    return deleted


def format_bytes(n: int) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"
