"""A full disk (ENOSPC, injected into the store's file writes) is said as "disk full", recorded in
the session, and ends the store cleanly: writer threads ended, files closed, lease released, every
frame stored before kept; `reconstudio run` exits non-zero and still writes its exports."""
import contextlib
import errno
import threading

import numpy as np
import pytest

from engine.api import FrameResult, SessionConfig
from engine.io import store as store_mod
from engine.io.atomic import OutputError
from engine.io.lease import session_in_use
from engine.io.store import RUNNING_FILE, DiskFullError, SessionStore, StoreError, is_disk_full, load_session


def _result(i):
    rng = np.random.default_rng(i)
    return FrameResult(index=i, timestamp=i / 30, is_keyframe=True, c2w=np.eye(4), K=np.eye(3),
                       image=rng.integers(0, 256, (24, 32, 3), dtype=np.uint8),
                       depth=np.full((24, 32), 1.0 + i, np.float32), conf=np.ones((24, 32), np.float32))


class _Disk:
    """Fault injection: the first `room` frame files fit, then every frame write fails with
    ENOSPC; with `config_too` config.json cannot be rewritten either."""

    def __init__(self, monkeypatch, room, config_too=False):
        self.room, self.calls, self.full = room, 0, False
        self._lock = threading.Lock()
        real_save, real_open = store_mod._save_npz, store_mod.atomic_open

        def save(f, arrays, compress):
            with self._lock:
                self.calls += 1
                if self.calls > self.room:
                    self.full = True
                    raise OSError(errno.ENOSPC, "No space left on device")
            real_save(f, arrays, compress)

        @contextlib.contextmanager
        def atomic(path, *a, **k):
            if config_too and self.full:       # what atomic_open raises for an OSError
                try:
                    raise OSError(errno.ENOSPC, "No space left on device")
                except OSError:
                    raise OutputError(f"Cannot write {path}: No space left on device") from None
            with real_open(path, *a, **k) as f:
                yield f
        monkeypatch.setattr(store_mod, "_save_npz", save)
        monkeypatch.setattr(store_mod, "atomic_open", atomic)


def _assert_released(store, folder, before_threads):
    assert not [t for t in threading.enumerate() if t not in before_threads and t.is_alive()
                and t.name.startswith("session-store-writer")]
    assert store._events.closed
    assert not session_in_use(folder) and not (folder / RUNNING_FILE).exists()


@pytest.mark.parametrize("writers", [0, 1, 2])
def test_disk_full_ends_the_store_and_marks_the_session(tmp_path, monkeypatch, writers):
    _Disk(monkeypatch, room=5)
    before = set(threading.enumerate())
    folder = tmp_path / "s"
    store = SessionStore(folder, SessionConfig(), "clip", background=writers > 0, writers=writers or None)
    with pytest.raises(DiskFullError, match="disk full") as info:
        for i in range(40):
            store.write(_result(i))
        store.close()
    assert is_disk_full(info.value) and isinstance(info.value, StoreError)
    assert store.disk_full
    _assert_released(store, folder, before)
    with pytest.raises(DiskFullError):
        store.write(_result(99))
    store.mark_cut_short("error: whatever the driver says")       # keeps "disk full"
    store.close()                                                  # closed already: no error
    s = load_session(folder)
    assert s.complete and s.cut_short == "disk full" and s.info["frames"] == 5
    stored = [r.index for r in s.results]
    assert stored == [0, 1, 2, 3, 4] if writers < 2 else len(stored) == 5   # two writers: any 5 of the first


def test_disk_full_while_closing_and_when_config_cannot_be_marked(tmp_path, monkeypatch):
    """The disk fills while the writers drain at close(): DiskFullError from close, resources
    released. And when even config.json cannot be rewritten the store still ends cleanly (the
    session then reads as not finished)."""
    _Disk(monkeypatch, room=3)
    before = set(threading.enumerate())
    store = SessionStore(tmp_path / "a", SessionConfig(), "clip", background=True, writers=1, queue_size=8)
    for i in range(5):                  # fits the queue: the failure surfaces only at close
        store.write(_result(i))
    with pytest.raises(DiskFullError, match="disk full"):
        store.close()
    _assert_released(store, tmp_path / "a", before)
    assert load_session(tmp_path / "a").cut_short == "disk full"

    monkeypatch.undo()
    _Disk(monkeypatch, room=2, config_too=True)
    store = SessionStore(tmp_path / "b", SessionConfig(), "clip")
    with pytest.raises(DiskFullError):
        for i in range(5):
            store.write(_result(i))
    _assert_released(store, tmp_path / "b", before)
    s = load_session(tmp_path / "b")
    assert len(s.results) == 2 and "did not finish" in s.cut_short


def test_disk_full_ends_a_run_driver_run(tmp_path, monkeypatch):
    from engine.run_driver import CollectSink, RunDriver, SequenceSource, StoreSink

    class Echo:
        def __init__(self):
            self.n = 0

        def push(self, frame, timestamp=None):
            self.n += 1
            return [_result(self.n - 1)]

        def flush(self):
            return []

        def stats(self):
            return {}

        def poll_events(self):
            return []

    _Disk(monkeypatch, room=4)
    store = SessionStore(tmp_path / "s", SessionConfig(), "clip", background=True, writers=1)
    driver = RunDriver(SequenceSource([np.zeros((8, 8, 3), np.uint8)] * 30), Echo(),
                       [StoreSink(store), CollectSink()], prefetch=0)
    with pytest.raises(DiskFullError):
        driver.run()
    assert "disk full" in driver.summary.error and store.disk_full
    assert not session_in_use(tmp_path / "s")
    assert load_session(tmp_path / "s").cut_short == "disk full"


def test_run_cli_disk_full_exits_non_zero_and_exports_what_was_stored(tmp_path, monkeypatch, capsys, shared_data):
    from app.cli import main
    from engine.io.export import read_tum
    _Disk(monkeypatch, room=7)
    monkeypatch.setenv("RECONSTUDIO_STORE_WRITERS", "1")
    out = tmp_path / "out"
    rc = main(["run", str(shared_data / "icl_livingroom_kt3" / "video.mp4"), "--engine", "synthetic",
               "--max-frames", "30", "--ply", str(out / "a.ply"), "--trajectory", str(out / "t.txt"),
               "--session-dir", str(tmp_path / "sess")])
    err = capsys.readouterr().err
    assert rc == 74, err
    assert "disk full" in err and "Traceback" not in err
    assert len(read_tum(out / "t.txt")[0]) == 7
    from plyfile import PlyData
    assert len(PlyData.read(str(out / "a.ply"))["vertex"].data) > 1000
    s = load_session(tmp_path / "sess")
    assert s.cut_short == "disk full" and len(s.results) == 7
    assert not session_in_use(tmp_path / "sess")


def test_is_disk_full_sees_through_the_writers_wrapping(tmp_path):
    """atomic_open turns an OSError into OutputError (from None): the errno still tells."""
    from engine.io.atomic import atomic_open
    for code, full in ((errno.ENOSPC, True), (errno.EDQUOT, True), (errno.EACCES, False)):
        with pytest.raises(OutputError) as info:
            with atomic_open(tmp_path / "x.bin") as f:
                f.write(b"x")
                raise OSError(code, "injected")
        assert is_disk_full(info.value) is full
    assert not list(tmp_path.iterdir())                              # no temp file left


INJECT = """
import errno, sys
from engine.io import store
real, n = store._save_npz, [0]
def save(f, arrays, compress):
    n[0] += 1
    if n[0] > int(sys.argv[1]):
        raise OSError(errno.ENOSPC, "No space left on device")
    real(f, arrays, compress)
store._save_npz = save
from app.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_run_cli_disk_full_in_a_process_of_its_own(tmp_path, shared_data):
    """The real exit status of a `reconstudio run` whose disk fills (the process ends: no writer
    thread or handle keeps it alive) and the session left unlocked for the next process."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO
    sess = tmp_path / "sess"
    cmd = [sys.executable, "-c", INJECT, "5", "run", str(shared_data / "icl_livingroom_kt3" / "video.mp4"),
           "--engine", "synthetic", "--max-frames", "20", "-q", "--trajectory", str(tmp_path / "t.txt"),
           "--session-dir", str(sess)]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 74, out.stderr[-2000:]
    assert "disk full" in out.stderr and (tmp_path / "t.txt").stat().st_size > 0
    assert not session_in_use(sess) and load_session(sess).cut_short == "disk full"
