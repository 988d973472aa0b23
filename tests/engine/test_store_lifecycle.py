"""Session store lifecycle: cut-short marking, stale temp files, no empty folder after a failed
start, the running lock, and retention (size / age limits, never a session in use)."""
import os
import time

import numpy as np
import pytest

from engine.api import FrameResult, SessionConfig
from engine.io.retention import apply_retention, list_sessions, sessions_usage
from engine.io.store import RUNNING_FILE, SessionStore, StoreError, load_session


def _result(i):
    return FrameResult(index=i, timestamp=i / 30, is_keyframe=True, c2w=np.eye(4), K=np.eye(3),
                       image=np.full((8, 8, 3), i, np.uint8), depth=np.ones((8, 8), np.float32))


def _session(folder, n=3, close=True):
    s = SessionStore(folder, SessionConfig(), "clip")
    for i in range(n):
        s.write(_result(i))
    if close:
        s.close()
    return s


def test_cut_short_is_recorded_and_reported(tmp_path):
    s = _session(tmp_path / "a", close=False)
    s.mark_cut_short("interrupted (SIGTERM) after 3 input frames", frames_in=3)
    s.close()
    loaded = load_session(tmp_path / "a")
    assert loaded.complete and "SIGTERM" in loaded.cut_short and loaded.info["frames_in"] == 3
    assert load_session(tmp_path / "a").cut_short                     # stays marked
    _session(tmp_path / "b")
    assert load_session(tmp_path / "b").cut_short == ""
    _session(tmp_path / "c", close=False)                              # a killed run never closes
    assert "did not finish" in load_session(tmp_path / "c").cut_short


def test_running_lock_and_stale_temp_files(tmp_path):
    s = _session(tmp_path / "a", close=False)
    assert (tmp_path / "a" / RUNNING_FILE).read_text().split()[0] == str(os.getpid())
    s.close()
    assert not (tmp_path / "a" / RUNNING_FILE).exists()
    stale = tmp_path / "a" / "frames" / ".000009.npz.abc.tmp"
    fresh = tmp_path / "a" / "frames" / ".000010.npz.def.tmp"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    load_session(tmp_path / "a")
    assert not stale.exists() and fresh.exists()                      # a live writer's file is kept


def test_failed_start_leaves_no_folder(tmp_path):
    s = SessionStore(tmp_path / "empty", SessionConfig(), "clip")
    s.close(discard_empty=True)
    assert not (tmp_path / "empty").exists()
    _session(tmp_path / "full")
    with pytest.raises(StoreError):                                     # taken folder: untouched
        SessionStore(tmp_path / "full", SessionConfig(), "clip")
    assert len(load_session(tmp_path / "full").results) == 3
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError):
        SessionStore(blocker / "sub", SessionConfig(), "clip")


def test_retention_deletes_oldest_never_in_use(tmp_path):
    now = time.time()
    for k, age_days in enumerate((40, 10, 5, 1)):
        _session(tmp_path / f"s{k}")
        t = now - age_days * 86400
        for p in (tmp_path / f"s{k}", tmp_path / f"s{k}" / "config.json", tmp_path / f"s{k}" / "frames"):
            os.utime(p, (t, t))
    (tmp_path / "not-a-session").mkdir()
    busy = _session(tmp_path / "busy", close=False)                   # a running store
    n, total = sessions_usage(tmp_path)
    assert n == 5 and total > 0
    one = list_sessions(tmp_path)[0].bytes
    # age: only s0 is over 30 days
    assert [p.name for p in apply_retention(tmp_path, max_gb=None, max_age_days=30, now=now)] == ["s0"]
    # size: keep ~3 sessions' worth; s1 is kept by the caller (shown in the GUI), busy is in use
    deleted = apply_retention(tmp_path, max_gb=3.5 * one / 1e9, max_age_days=None, keep=[tmp_path / "s1"], now=now)
    assert [p.name for p in deleted] == ["s2"]
    left = {e.folder.name for e in list_sessions(tmp_path)}
    assert left == {"s1", "s3", "busy"} and (tmp_path / "not-a-session").exists()
    busy.close()
