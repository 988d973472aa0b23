"""Retention deletes only sessions, and never one that a ReconStudio process has open (any process,
any hostname in the lock file): the repros of issue #24 and the edges of the lease protocol."""
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from engine.api import FrameResult, SessionConfig
from engine.io.retention import apply_retention, list_sessions
from engine.io.store import RUNNING_FILE, SessionStore
from tests.conftest import REPO

DAY = 86400.0


def _session(folder, n=2, close=True):
    s = SessionStore(folder, SessionConfig(), "clip")
    for i in range(n):
        s.write(FrameResult(index=i, timestamp=i / 30, is_keyframe=True, c2w=np.eye(4), K=np.eye(3),
                            image=np.full((8, 8, 3), i, np.uint8), depth=np.ones((8, 8), np.float32)))
    if close:
        s.close()
    return s


def _backdate(folder, days):
    t = time.time() - days * DAY
    for dirpath, dirs, files in os.walk(folder):
        for name in files + dirs:
            os.utime(os.path.join(dirpath, name), (t, t), follow_symlinks=False)
    os.utime(folder, (t, t))


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_folder_without_the_session_marker_is_never_deleted(tmp_path):
    """The issue's repro: `proj/frames` + config.json {"project": 1}, 40 days old."""
    proj = tmp_path / "proj"
    (proj / "frames").mkdir(parents=True)
    (proj / "config.json").write_text(json.dumps({"project": 1}))
    (proj / "frames" / "mine.txt").write_text("a user's file")
    _session(tmp_path / "old")
    for p in (proj, tmp_path / "old"):
        _backdate(p, 40)
    assert [e.folder.name for e in list_sessions(tmp_path)] == ["old"]
    deleted = apply_retention(tmp_path, max_gb=None, max_age_days=30)
    assert [p.name for p in deleted] == ["old"]
    assert (proj / "frames" / "mine.txt").read_text() == "a user's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj"]     # no leftovers of the removal


def test_symlinks_are_never_followed(tmp_path):
    """A symlinked entry is not a session; a link inside a session is removed, never its target,
    and its target's size is not counted."""
    root, outside = tmp_path / "sessions", tmp_path / "outside"
    root.mkdir()
    _session(outside / "elsewhere")
    _backdate(outside / "elsewhere", 40)
    (root / "link").symlink_to(outside / "elsewhere", target_is_directory=True)
    big = outside / "big.bin"
    big.write_bytes(b"x" * 1_000_000)
    _session(root / "s")
    (root / "s" / "frames" / "big-link").symlink_to(big)
    _backdate(root / "s", 40)
    entries = list_sessions(root)
    assert [e.folder.name for e in entries] == ["s"] and entries[0].bytes < 100_000
    assert [p.name for p in apply_retention(root, max_gb=None, max_age_days=30)] == ["s"]
    assert big.stat().st_size == 1_000_000 and (outside / "elsewhere" / "config.json").is_file()
    assert (root / "link").is_symlink()


HOLDER = textwrap.dedent("""
    import sys, time
    from engine.review import SessionTimeline
    tl = SessionTimeline(sys.argv[1])
    print("holding", len(tl.indices), flush=True)
    time.sleep(120)
""")


def test_a_session_open_in_another_process_is_kept_until_that_process_dies(tmp_path):
    """A session reviewed in another window (its SessionTimeline) survives retention in this
    process; once that process is killed (no clean shutdown) the session can be removed."""
    _session(tmp_path / "shown")
    _backdate(tmp_path / "shown", 40)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "shown")], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().split() == ["holding", "2"]
        assert list_sessions(tmp_path)[0].in_use
        assert apply_retention(tmp_path, max_gb=None, max_age_days=30) == []
        assert (tmp_path / "shown" / "frames").is_dir()
    finally:
        p.kill()
        p.wait()
    assert not list_sessions(tmp_path)[0].in_use
    assert [d.name for d in apply_retention(tmp_path, max_gb=None, max_age_days=30)] == ["shown"]


def test_a_lock_naming_another_host_and_a_dead_pid_is_stale(tmp_path):
    """The older "<pid> <host>" lock file: a dead pid is stale whatever host it names; a live pid
    counts only if that process is older than the file (else the pid was reused)."""
    for name in ("dead", "live", "reused"):
        _session(tmp_path / name)
    (tmp_path / "dead" / RUNNING_FILE).write_text(f"{_dead_pid()} container-before-restart\n")
    (tmp_path / "live" / RUNNING_FILE).write_text(f"{os.getpid()} another-host\n")
    (tmp_path / "reused" / RUNNING_FILE).write_text(f"{os.getpid()} another-host\n")
    for name in ("dead", "live", "reused"):
        _backdate(tmp_path / name, 40)
    t = time.time()                       # "live": written after this process started
    os.utime(tmp_path / "live" / RUNNING_FILE, (t, t))
    assert {e.folder.name: e.in_use for e in list_sessions(tmp_path)} == {"dead": False, "live": True,
                                                                          "reused": False}
    deleted = apply_retention(tmp_path, max_gb=None, max_age_days=30)
    assert sorted(p.name for p in deleted) == ["dead", "reused"]
    assert (tmp_path / "live" / "frames").is_dir()


def test_open_stores_and_timelines_in_this_process_are_kept(tmp_path):
    from engine.review import SessionTimeline
    busy = _session(tmp_path / "busy", close=False)
    _session(tmp_path / "shown")
    for name in ("busy", "shown"):
        _backdate(tmp_path / name, 40)
    tl = SessionTimeline(tmp_path / "shown")
    assert apply_retention(tmp_path, max_gb=None, max_age_days=30) == []
    busy.close()
    tl.close()
    assert sorted(p.name for p in apply_retention(tmp_path, max_gb=None, max_age_days=30, now=time.time() + 31 * DAY)) \
        == ["busy", "shown"]


def test_a_killed_removal_is_finished_by_the_next_one(tmp_path):
    """Retention renames a session out of the way before deleting it; a leftover of a removal
    killed half-way is removed next time, and nothing else that starts with a dot is touched."""
    left = tmp_path / ".reconstudio-removing-old"
    (left / "frames").mkdir(parents=True)
    (left / "frames" / "000001.npz").write_bytes(b"x" * 10)
    (tmp_path / ".hidden").mkdir()
    apply_retention(tmp_path, max_gb=None, max_age_days=30)
    assert not left.exists() and (tmp_path / ".hidden").is_dir()


def test_a_store_cannot_open_a_folder_being_removed(tmp_path):
    """A reader that opens a session after retention took it gets a clear error, not a
    half-deleted folder."""
    from engine.io.lease import claim_for_removal, hold_session
    from engine.io.store import StoreError
    _session(tmp_path / "s")
    claim = claim_for_removal(tmp_path / "s")
    assert claim is not None
    os.rename(tmp_path / "s", tmp_path / "gone")
    claim.release()
    with pytest.raises(StoreError, match="no longer exists|not found|gone"):
        hold_session(tmp_path / "s")
    with hold_session(tmp_path / "gone") as lease:
        assert lease.held and claim_for_removal(tmp_path / "gone") is None
    assert claim_for_removal(tmp_path / "gone") is not None


def test_a_symlinked_lock_file_is_never_followed(tmp_path):
    """A `running.lock` that is a symlink: readers still read, nothing is written through it, and
    retention (which cannot prove the folder free) keeps the folder."""
    from engine.io.store import load_session
    root = tmp_path / "sessions"
    _session(root / "s")
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    (root / "s" / RUNNING_FILE).symlink_to(target)
    _backdate(root / "s", 40)
    assert len(load_session(root / "s").results) == 2
    assert apply_retention(root, max_gb=None, max_age_days=30) == []
    assert target.read_text() == "keep me" and (root / "s" / RUNNING_FILE).is_symlink()


def test_a_forked_child_does_not_drop_its_parents_lease(tmp_path):
    from engine.io.lease import hold_session, session_in_use
    _session(tmp_path / "s")
    lease = hold_session(tmp_path / "s")
    pid = os.fork()
    if pid == 0:                                   # child: release, then leave without cleanup
        lease.release()
        os._exit(0)
    os.waitpid(pid, 0)
    assert session_in_use(tmp_path / "s") and (tmp_path / "s" / RUNNING_FILE).exists()
    lease.release()
    assert not session_in_use(tmp_path / "s") and not (tmp_path / "s" / RUNNING_FILE).exists()


def test_without_flock_the_recorded_pid_and_start_time_decide(tmp_path, monkeypatch):
    """Filesystems without flock: a holder's line (pid + process start time) keeps the folder
    while that process runs; a dead pid, or the same pid with another start time, does not."""
    from engine.io import lease as lease_mod
    monkeypatch.setattr(lease_mod, "fcntl", None)
    _session(tmp_path / "held")
    held = lease_mod.hold_session(tmp_path / "held", role="review")
    assert lease_mod.session_in_use(tmp_path / "held")
    me = lease_mod.process_start_time(os.getpid())
    for name, line in (("dead", f"{_dead_pid()} h {me:.3f} store"), ("reused", f"{os.getpid()} h {me - 500:.3f} store")):
        _session(tmp_path / name)
        (tmp_path / name / RUNNING_FILE).write_text(line + "\n")
        assert not lease_mod.session_in_use(tmp_path / name), name
    _backdate(tmp_path, 40)
    for name in ("held", "dead", "reused"):
        _backdate(tmp_path / name, 40)
    assert sorted(p.name for p in apply_retention(tmp_path, max_gb=None, max_age_days=30)) == ["dead", "reused"]
    held.release()


def test_load_session_holds_the_folder_while_it_reads(tmp_path, monkeypatch):
    """A re-export reads through load_session: retention in another process cannot take the
    folder from under it, and the lease is gone once it returns."""
    from engine.io import store as store_mod
    from engine.io.lease import session_in_use
    _session(tmp_path / "s", n=3)
    seen = []
    real = store_mod._result_from_npz

    def spy(z):
        seen.append(session_in_use(tmp_path / "s"))
        return real(z)
    monkeypatch.setattr(store_mod, "_result_from_npz", spy)
    assert len(store_mod.load_session(tmp_path / "s").results) == 3
    assert seen == [True, True, True]
    assert not session_in_use(tmp_path / "s") and not (tmp_path / "s" / RUNNING_FILE).exists()


def test_an_opener_waits_for_a_removal_in_progress(tmp_path, monkeypatch):
    """While retention holds a session's exclusive lease, opening it waits (a bounded time) and
    then says it is being removed; once retention lets go without removing it, it opens."""
    from engine.io import lease as lease_mod
    from engine.io.store import StoreError
    monkeypatch.setattr(lease_mod, "OPEN_WAIT_S", 0.2)
    _session(tmp_path / "s")
    claim = lease_mod.claim_for_removal(tmp_path / "s")
    with pytest.raises(StoreError, match="being removed"):
        lease_mod.hold_session(tmp_path / "s")
    claim.release()
    with lease_mod.hold_session(tmp_path / "s") as held:
        assert held.held and lease_mod.claim_for_removal(tmp_path / "s") is None
