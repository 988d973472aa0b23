"""Session leases: which session folders some ReconStudio process has open, provable across processes.

Invariant: every process that opens a session folder -- a store writing it (`SessionStore`), a
timeline showing it (`engine.review.SessionTimeline`), a reader exporting it (`load_session`,
`reconstudio run SESSION --ply ...`) -- holds a SHARED `flock` on `<folder>/running.lock` for as
long as it has the folder open (`hold_session`). The kernel drops that lock when the process ends,
however it ends (crash, SIGKILL, a container stopped and restarted under another hostname), so
"in use" needs neither a clean shutdown nor a hostname: retention proves a folder free by taking
the EXCLUSIVE lock without waiting (`claim_for_removal`). While it holds that lock nobody can
open the folder, and it renames the folder away before letting go, so an opener that waited
finds the folder gone (a clear error) instead of a half-deleted one.

Each holder also appends a line `<pid> <host> <process start time> <role>` to the file (pid and
start time from psutil): for people, and for what the lock cannot prove --
- a file an older ReconStudio wrote (`<pid> <host>`, that version took no flock): in use only
  while that pid lives AND its process is older than the file (a pid reused by a later process
  cannot have written it), whatever host the file names;
- a filesystem without flock (the lock call fails with ENOLCK / EOPNOTSUPP): a line counts while
  its pid runs with the recorded start time; such a folder stays protected until its holders'
  processes end (release cannot prove it was the last holder there).
The last holder to release removes the file (`flock` upgrade without waiting: it succeeds only
when no other holder is left); an opener that raced with that removal sees the file's inode
change under its name and opens the new one.
"""
from __future__ import annotations

import contextlib
import errno
import os
import socket
import time
from pathlib import Path
from typing import Optional, Union

from .errors import StoreError

try:
    import fcntl
except ImportError:                       # not POSIX: the recorded pid / start time only
    fcntl = None

LOCK_FILE = "running.lock"
OPEN_WAIT_S = 10.0                        # longest an opener waits on a removal in progress
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_O_FLAGS = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _gone(folder: Path):
    return StoreError(f"Session folder {folder} no longer exists (removed by the sessions limits or by hand)")


def process_start_time(pid: int) -> Optional[float]:
    """Start time (seconds since the epoch) of a running process; None if there is none (a zombie
    counts as none). Raises psutil.Error when the system will not tell."""
    import psutil
    try:
        p = psutil.Process(int(pid))
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(p.create_time())
    except (psutil.NoSuchProcess, ValueError, OverflowError):   # ZombieProcess is a NoSuchProcess
        return None


def _record(role: str) -> bytes:
    try:
        start = process_start_time(os.getpid()) or 0.0
    except Exception:                        # the line is advisory
        start = 0.0
    return f"{os.getpid()} {socket.gethostname()} {start:.3f} {role}\n".encode()


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _flock(fd: int, op: int) -> Optional[bool]:
    """True: locked; False: another holder conflicts; None: this filesystem has no flock."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in _NO_FLOCK:
            return None
        raise


class SessionLease:
    """A held session folder (`hold_session`, `claim_for_removal`): `release()` or a `with`
    block lets go; so does the garbage collector, and the kernel when the process ends."""

    def __init__(self, folder: Path, fd: Optional[int], flocked: bool, exclusive: bool = False):
        self.folder = folder
        self._fd = fd
        self._pid = os.getpid()            # a forked child shares the lock: it must not drop it
        self.flocked = flocked
        self.exclusive = exclusive

    @property
    def held(self) -> bool:
        """False once released, or if the folder could not be locked at all (read-only media)."""
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if os.getpid() != self._pid:
            os.close(fd)                   # the parent's lock stays (same open file description)
            return
        try:
            # the last holder removes the file: the upgrade succeeds only with no other holder
            if self.flocked and not self.exclusive and _flock(fd, fcntl.LOCK_EX) \
                    and _same_file(fd, self.folder / LOCK_FILE):
                with contextlib.suppress(OSError):
                    os.unlink(self.folder / LOCK_FILE)
        except OSError:
            pass
        finally:
            os.close(fd)

    def __enter__(self) -> "SessionLease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.release()


def hold_session(folder: Union[str, Path], role: str = "open", strict: bool = False) -> SessionLease:
    """Hold `folder` open (shared with every other holder) until `release()`. Raises StoreError if
    the folder no longer exists or is being removed. A lock file that cannot be made (read-only
    medium, no permission, a full disk, a symlink in its place) gives a reader a lease that holds
    nothing -- it can still read; with `strict` (a store about to write) the OSError is raised."""
    folder = Path(folder).expanduser()
    path = folder / LOCK_FILE
    deadline = time.monotonic() + OPEN_WAIT_S
    while True:
        try:
            fd = os.open(path, _O_FLAGS, 0o644)
        except FileNotFoundError:
            raise _gone(folder) from None
        except OSError:
            if strict:
                raise
            return SessionLease(folder, None, False)
        try:
            got = _flock(fd, fcntl.LOCK_SH) if fcntl is not None else None
            same = _same_file(fd, path)
        except OSError:
            os.close(fd)
            if strict:
                raise
            return SessionLease(folder, None, False)
        if got is not False and same:
            with contextlib.suppress(OSError):    # advisory (disk full must not stop a reader)
                os.write(fd, _record(role))
            return SessionLease(folder, fd, flocked=got is True)
        # retention holds it for a moment, or the file was removed / replaced while we opened it
        os.close(fd)
        if not folder.is_dir():
            raise _gone(folder)
        if time.monotonic() > deadline:
            raise StoreError(f"Session folder {folder} is being removed (sessions limits)")
        time.sleep(0.02)


def _records(text: str) -> list[tuple[int, Optional[float]]]:
    """(pid, start time or None for the older two-field lines) of each line of a lock file."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        try:
            pid = int(parts[0])
        except (IndexError, ValueError):
            continue
        start = None
        if len(parts) >= 3:
            try:
                start = float(parts[2])
            except ValueError:
                start = None
        out.append((pid, start))
    return out


def _record_live(pid: int, start: Optional[float], file_mtime: float, legacy_only: bool) -> bool:
    if start is not None and legacy_only:
        return False                         # a flock-era holder: its lock said it is gone
    import psutil
    try:
        began = process_start_time(pid)
    except psutil.Error:
        return True                          # cannot tell: keep the folder
    if began is None:
        return False
    if start is not None:
        return abs(began - start) < 1.0      # same pid AND same process
    return began <= file_mtime + 1.0         # older line: a process younger than the file did not write it


def _recorded_holders(fd: int, legacy_only: bool) -> bool:
    """Does a line of the lock file name a process that may still have the folder open?"""
    try:
        st = os.fstat(fd)
        with open(fd, "rb", closefd=False) as f:
            f.seek(0)
            text = f.read(1 << 16).decode("utf-8", "replace")
    except OSError:
        return True                          # cannot tell: keep the folder
    return any(_record_live(pid, start, st.st_mtime, legacy_only) for pid, start in _records(text))


def _probe(folder: Path, create: bool) -> Optional[SessionLease]:
    """An exclusive lease on `folder` if nobody holds it, else None."""
    path = folder / LOCK_FILE
    try:
        fd = os.open(path, _O_FLAGS if create else (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                                                   | getattr(os, "O_CLOEXEC", 0)), 0o644)
    except FileNotFoundError:
        return SessionLease(folder, None, False, exclusive=True) if not create else None
    except OSError:
        return None                          # a symlinked or unreadable lock file: cannot prove anything
    try:
        got = _flock(fd, fcntl.LOCK_EX) if fcntl is not None else None
        if got is False or not _same_file(fd, path) or _recorded_holders(fd, legacy_only=got is True):
            os.close(fd)
            return None
        return SessionLease(folder, fd, flocked=got is True, exclusive=True)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def session_in_use(folder: Union[str, Path]) -> bool:
    """Some process holds `folder` (changes nothing on disk)."""
    lease = _probe(Path(folder), create=False)
    if lease is None:
        return True
    lease.release()
    return False


def claim_for_removal(folder: Union[str, Path]) -> Optional[SessionLease]:
    """The exclusive lease retention needs before it removes `folder`; None while any process
    holds it. Rename the folder away before releasing the lease."""
    return _probe(Path(folder), create=True)
