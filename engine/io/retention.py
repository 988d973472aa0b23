"""Session retention: the sessions folder must not fill the disk silently.

When a new session starts, the oldest sessions are deleted until the folder is within the size
limit and no session is older than the age limit (docs/benchmarks_io.md has the measured size
per frame of each engine: an hour of dense neural capture is more than the default limit).

What may be deleted -- nothing else, ever:
- a session: a real folder directly inside the sessions folder (not a symlink) whose
  config.json (a regular file) carries the store's format marker and which has a frames/ folder;
- that nobody has open: no ReconStudio process (this one or another, on any host name) holds its
  lease (engine/io/lease.py: the store writing it, a GUI timeline showing it, an export reading
  it), and the caller did not list it in `keep`.
Deletion takes the session's exclusive lease, renames the folder to `.reconstudio-removing-NAME`
inside the sessions folder and only then deletes it, never following a symlink (sizes are counted
the same way); a removal killed half-way is finished by the next one.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Union

from .lease import claim_for_removal, session_in_use
from .store import SESSION_FORMAT, default_session_root

DEFAULT_MAX_GB = 20.0          # hours of geometric sessions, NOT an hour of neural capture (docs/benchmarks_io.md)
DEFAULT_MAX_AGE_DAYS = 30.0
REMOVING_PREFIX = ".reconstudio-removing-"
_CONFIG_MAX_BYTES = 1 << 20          # a session's config.json is a few KB; a bigger file is not ours

# Where an app's settings store keeps the limits (any object with `get(key, default)`, e.g. the
# GUI's QSettings wrapper): the CLI and the GUI share one sessions folder and one pair of limits.
RETENTION_KEYS = {"max_gb": "sessions/max_gb", "max_age_days": "sessions/max_age_days"}


def retention_limits(settings=None) -> tuple[float, float]:
    """(max_gb, max_age_days) of the sessions folder (0 = no limit) read from `settings` (the
    RETENTION_KEYS). A settings store with a checking `value(key)` (the app's AppSettings: it warns
    once per bad key) reads through it; otherwise a value that is not a finite number >= 0 falls
    back to its default -- never to "no limit". Without a settings store, the defaults."""
    defaults = {"max_gb": DEFAULT_MAX_GB, "max_age_days": DEFAULT_MAX_AGE_DAYS}
    if settings is not None and callable(getattr(settings, "value", None)):
        return tuple(float(settings.value(RETENTION_KEYS[k])) for k in ("max_gb", "max_age_days"))

    def num(key):
        v = settings.get(RETENTION_KEYS[key], defaults[key]) if settings is not None else defaults[key]
        try:
            f = float(v)
        except (TypeError, ValueError):
            return defaults[key]
        return f if math.isfinite(f) and f >= 0 else defaults[key]
    return num("max_gb"), num("max_age_days")


@dataclass
class SessionEntry:
    folder: Path
    bytes: int
    mtime: float               # newest change of config.json or frames/ (seconds since the epoch)
    in_use: bool


def _real_dir(p: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(p).st_mode)
    except OSError:
        return False


def is_session_folder(p: Path) -> bool:
    """A real folder (no symlink) with frames/ and a config.json carrying the store's marker."""
    p = Path(p)
    cfg = p / "config.json"
    try:
        st = os.lstat(cfg)
        if not (_real_dir(p) and _real_dir(p / "frames") and stat.S_ISREG(st.st_mode)) \
                or st.st_size > _CONFIG_MAX_BYTES:
            return False
        with open(cfg, encoding="utf-8", errors="strict") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("format") == SESSION_FORMAT


def folder_bytes(p: Path) -> int:
    """Bytes of the files under `p`; symlinks count as links, never as their targets."""
    total = 0
    for dirpath, _, files in os.walk(p):          # os.walk never descends into linked folders
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def list_sessions(root: Union[str, Path, None] = None) -> list[SessionEntry]:
    """The session folders under `root` (default: the sessions folder), oldest first."""
    root = Path(root).expanduser() if root else default_session_root()
    out = []
    if not root.is_dir():
        return out
    for p in root.iterdir():
        if p.name.startswith(REMOVING_PREFIX) or not is_session_folder(p):
            continue
        try:   # not the folder's own mtime: taking or dropping a lease touches it
            mtime = max(os.lstat(p / "config.json").st_mtime, os.lstat(p / "frames").st_mtime)
        except OSError:
            continue
        out.append(SessionEntry(p, folder_bytes(p), mtime, session_in_use(p)))
    out.sort(key=lambda e: e.mtime)
    return out


def sessions_usage(root: Union[str, Path, None] = None) -> tuple[int, int]:
    """(number of sessions, total bytes) under the sessions folder."""
    entries = list_sessions(root)
    return len(entries), sum(e.bytes for e in entries)


def _finish_removals(root: Path) -> None:
    for p in root.iterdir() if root.is_dir() else ():
        if p.name.startswith(REMOVING_PREFIX) and _real_dir(p):
            shutil.rmtree(p, ignore_errors=True)


def _remove(folder: Path) -> bool:
    """Take the session's exclusive lease, rename it away, delete it. False if it is in use (or
    cannot be renamed): then nothing was changed."""
    lease = claim_for_removal(folder)
    if lease is None:
        return False
    try:
        if not is_session_folder(folder):        # replaced meanwhile
            return False
        n, away = 1, folder.parent / f"{REMOVING_PREFIX}{folder.name}"
        while os.path.lexists(away):
            n += 1
            away = folder.parent / f"{REMOVING_PREFIX}{folder.name}.{n}"
        try:
            os.rename(folder, away)
        except OSError:
            return False
    finally:
        lease.release()
    shutil.rmtree(away, ignore_errors=True)      # unlinks symlinks, never follows them
    return True


def apply_retention(root: Union[str, Path, None] = None, *, max_gb: Optional[float] = DEFAULT_MAX_GB,
                    max_age_days: Optional[float] = DEFAULT_MAX_AGE_DAYS,
                    keep: Iterable[Union[str, Path]] = (), now: Optional[float] = None) -> list[Path]:
    """Delete the oldest sessions until the folder holds at most `max_gb` and none is older than
    `max_age_days` (None or 0 = no limit). Sessions in `keep` and sessions in use are never
    deleted, nor anything that is not a session. Returns the deleted folders."""
    now = time.time() if now is None else now
    root = Path(root).expanduser() if root else default_session_root()
    keep_set = {Path(k).expanduser().resolve() for k in keep if k}
    _finish_removals(root)
    entries = list_sessions(root)
    total = sum(e.bytes for e in entries)
    limit = int(max_gb * 1e9) if max_gb else None
    deleted = []
    for e in entries:                        # oldest first
        too_old = bool(max_age_days) and now - e.mtime > max_age_days * 86400.0
        too_big = limit is not None and total > limit
        if not (too_old or too_big) or e.in_use or e.folder.resolve() in keep_set:
            continue
        if _remove(e.folder):
            deleted.append(e.folder)
            total -= e.bytes
    return deleted


def format_bytes(n: int) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"
