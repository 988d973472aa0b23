"""What the window says when a run does not go as asked (issue #24): every input warning reaches
the banner; a full disk says "disk full", stops the run, and closes the store (no lock, writer
thread or file handle left behind)."""
import errno
import os
import threading

import cv2
import numpy as np
import pytest

from tests.ui.conftest import wait_finished


def _truncated_avi(tmp_path):
    """A 30-frame MJPG AVI cut in half: it opens, announces 30 frames and decodes 14."""
    rng = np.random.default_rng(0)
    p = tmp_path / "whole.avi"
    w = cv2.VideoWriter(str(p), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    for _ in range(30):
        w.write(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    w.release()
    data = p.read_bytes()
    cut = tmp_path / "cut.avi"
    cut.write_bytes(data[: len(data) // 2])
    return cut


def _folder_with_a_bad_image(tmp_path):
    d = tmp_path / "images"
    d.mkdir()
    rng = np.random.default_rng(1)
    for i in range(5):
        cv2.imwrite(str(d / f"{i:03d}.png"), rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    (d / "002.png").write_bytes(b"not a png")
    return d


@pytest.mark.parametrize("make, words", [(_truncated_avi, "stream ended after"),
                                         (_folder_with_a_bad_image, "skipped unreadable image 002.png")])
def test_input_warnings_reach_the_banner(qtbot, make_window, tmp_path, make, words):
    w = make_window()
    w.set_input(str(make(tmp_path)))
    assert w.start_run()
    s = wait_finished(qtbot, w)
    assert s["error"] is None and s["results"] > 0
    assert w.banner.isVisible() and w.banner.level == "warning"
    assert words in w.banner.label.text().lower()
    assert any(level == "warning" and words in t.lower() for level, t in w.messages)


def test_many_input_warnings_show_their_count(qtbot, make_window, tmp_path):
    d = _folder_with_a_bad_image(tmp_path)
    (d / "003.png").write_bytes(b"")
    w = make_window()
    w.set_input(str(d))
    w.start_run()
    wait_finished(qtbot, w)
    assert "003.png" in w.banner.label.text() and "2 input warnings" in w.banner.label.text()


def _open_files_under(folder):
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            out.append(target)
    return out


@pytest.mark.parametrize("info_fails_too", [False, True])
def test_disk_full_stops_the_run_and_closes_the_store(qtbot, make_window, tmp_path, monkeypatch,
                                                      shared_data, info_fails_too):
    """Fault injection: the store's frame writes fail with ENOSPC after 5 frames (and, in the
    second case, so do its config.json writes, as on a really full disk)."""
    from engine.io import store as store_mod

    real_store, real_info = store_mod.SessionStore._store, store_mod.SessionStore._write_info
    full = threading.Event()
    calls = {"n": 0}

    def store(self, small):
        calls["n"] += 1
        if calls["n"] > 5:
            full.set()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_store(self, small)

    def write_info(self):
        if info_fails_too and full.is_set():
            raise store_mod.StoreError(f"Cannot write {self.folder / 'config.json'}: {os.strerror(errno.ENOSPC)}")
        return real_info(self)

    monkeypatch.setattr(store_mod.SessionStore, "_store", store)
    monkeypatch.setattr(store_mod.SessionStore, "_write_info", write_info)
    w = make_window()
    w.set_input(str(shared_data / "icl_livingroom_kt3" / "rgb"))
    w.max_frames.setValue(200)
    assert w.start_run()
    s = wait_finished(qtbot, w)
    assert s["error"] and s.get("disk_full")
    assert s["frames"] < 200                             # the run stopped at the failure
    assert "disk full" in w.banner.label.text().lower() and w.banner.level == "error"
    assert not w.running and w.last_handle.thread.isFinished()
    folder = s["session"] or w.last_handle.worker.session_folder
    assert folder and os.path.isdir(folder)
    # the window still shows the session (its review holds the folder); once it lets go, nothing
    # holds it: the store released its lease, threads and files
    w.review.reset()
    assert not os.path.exists(os.path.join(folder, "running.lock"))      # the lock is released
    assert 1 <= len(os.listdir(os.path.join(folder, "frames"))) <= 5     # what was stored is kept
    assert not [t for t in threading.enumerate() if t.name.startswith("session-store-writer")]
    assert _open_files_under(folder) == []                                # events.jsonl closed too


def test_second_view_input_warnings_reach_the_banner(qtbot, make_window, tmp_path):
    w = make_window()
    v = w.open_second_source(str(_folder_with_a_bad_image(tmp_path)))
    with qtbot.waitSignal(v.runFinished, timeout=30_000) as done:
        pass
    assert done.args[0]["error"] is None
    assert w.banner.level == "warning" and "Second view" in w.banner.label.text()
    assert "skipped unreadable image 002.png" in w.banner.label.text().lower()
