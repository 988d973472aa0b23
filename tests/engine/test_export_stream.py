"""Exports stream from the session folder (engine.io.session_reader): the trajectory never decodes a
frame's arrays, every format equals the all-in-memory export of the same session, small exports
are written first, a stopped export leaves nothing half-written, leftovers of a killed one are
cleaned, and an export with no point (no pose) is an error."""
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from engine.api import EngineEvent, FrameResult, SessionConfig
from engine.geometry import apply_realignments, collect_points
from engine.io import store as store_mod
from engine.io.export import (EmptyExportError, export_npz, export_results, export_tum)
from engine.io.store import SessionStore, load_session
from tests.engine.factories import TEST_K, random_results

K = TEST_K


def _results(n=7, h=48, w=64, seed=3, depth=True):
    return random_results(n=n, h=h, w=w, seed=seed, depth=depth)


def _realign():
    T = np.eye(4)
    T[:3, :3] = 1.5 * Rotation.from_rotvec([0.0, 0.3, 0.1]).as_matrix()
    T[:3, 3] = [1.0, -0.5, 2.0]
    return EngineEvent("realign", 1, T)


@pytest.fixture
def session(tmp_path):
    folder = tmp_path / "s"
    with SessionStore(folder, SessionConfig(engine="synthetic"), "test") as st:
        for r in _results():
            st.write(r)
        st.write_event(_realign())
    return folder


def _old_points(folder, conf_threshold, stride):
    loaded = load_session(folder)
    return collect_points(apply_realignments(loaded.results, loaded.events), conf_threshold, stride)


def test_trajectory_reads_poses_only(session, tmp_path, monkeypatch):
    loaded = load_session(session)
    export_tum(tmp_path / "old.txt", apply_realignments(loaded.results, loaded.events))

    def no_decoding(z):
        raise AssertionError("the trajectory decoded a frame")
    monkeypatch.setattr(store_mod, "_result_from_npz", no_decoding)
    # and the arrays themselves unreadable: a trajectory must not need them
    for p in (session / "frames").glob("*.npz"):
        with np.load(p) as z:
            small = {k: z[k] for k in ("index", "timestamp", "c2w", "K", "is_keyframe", "segment")}
        np.savez(p, **small, image_jpeg=np.frombuffer(b"not a jpeg", np.uint8), depth=np.zeros(3, np.uint8))
    out = export_results(session, {"tum": tmp_path / "new.txt"})
    assert out["frames"] == 7 and out["files"] == [str(tmp_path / "new.txt")]
    assert (tmp_path / "new.txt").read_bytes() == (tmp_path / "old.txt").read_bytes()   # realign applied


def test_ply_equals_the_in_memory_export_point_for_point(session, tmp_path):
    from plyfile import PlyData

    out = export_results(session, {"ply": tmp_path / "a.ply"}, conf_threshold=4.0, stride=2)
    pts, cols, conf = _old_points(session, 4.0, 2)
    v = PlyData.read(str(tmp_path / "a.ply"))["vertex"].data
    assert out["points"] == len(v) == len(pts) > 0
    np.testing.assert_array_equal(np.stack([v["x"], v["y"], v["z"]], 1), pts)
    np.testing.assert_array_equal(np.stack([v["red"], v["green"], v["blue"]], 1), cols)
    np.testing.assert_array_equal(v["confidence"], conf)
    trimesh = pytest.importorskip("trimesh")                 # another reader takes the header too
    np.testing.assert_array_equal(trimesh.load(tmp_path / "a.ply").vertices, pts)


def test_npz_equals_the_in_memory_export_member_for_member(session, tmp_path):
    export_results(session, {"npz": tmp_path / "new.npz"}, conf_threshold=4.0, stride=2)
    loaded = load_session(session)
    aligned = apply_realignments(loaded.results, loaded.events)
    export_npz(tmp_path / "old.npz", aligned, *_old_points(session, 4.0, 2))
    with np.load(tmp_path / "new.npz") as new, np.load(tmp_path / "old.npz") as old:
        assert sorted(new.files) == sorted(old.files)
        assert "images" in new.files and "depth" in new.files
        for k in old.files:
            np.testing.assert_array_equal(new[k], old[k], err_msg=k)
            assert new[k].dtype == old[k].dtype, k


def test_small_exports_are_written_first(session, tmp_path, monkeypatch):
    import engine.io.atomic as atomic
    done = []
    real = os.replace
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (done.append(os.path.basename(b)), real(a, b)))
    export_results(session, {"npz": tmp_path / "a.npz", "glb": tmp_path / "a.glb", "ply": tmp_path / "a.ply",
                             "colmap": tmp_path / "m", "tum": tmp_path / "t.txt"}, stride=2)
    order = [n for n in done if n in ("t.txt", "points3D.bin", "a.ply", "a.glb", "a.npz")]
    assert order == ["t.txt", "points3D.bin", "a.ply", "a.glb", "a.npz"]
    assert done.index("points3D.bin") > max(i for i, n in enumerate(done) if n.endswith(".jpg"))


@pytest.mark.parametrize("stop_at", [5, 11])       # frames decoded: 1 to check for points, 7 COLMAP, 7 PLY
def test_a_stopped_export_leaves_no_temp_and_no_partial_file(session, tmp_path, monkeypatch, stop_at):
    from engine.io import session_reader
    real = session_reader.FrameReader.frame
    calls = []

    def frame(self, pose):
        calls.append(pose.index)
        if len(calls) == stop_at:            # Ctrl-C / SIGTERM in the middle of the COLMAP model / the PLY
            raise KeyboardInterrupt
        return real(self, pose)
    monkeypatch.setattr(session_reader.FrameReader, "frame", frame)
    with pytest.raises(KeyboardInterrupt):
        export_results(session, {"tum": tmp_path / "t.txt", "ply": tmp_path / "a.ply",
                                 "colmap": tmp_path / "m"}, stride=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "s", "t.txt"]    # trajectory whole, no PLY
    model = sorted(p.name for p in (tmp_path / "m").rglob("*.*"))
    if stop_at < 9:
        assert model == []                                                     # no image, no model
    else:
        assert len(model) == 7 + 6 and not any(n.endswith(".tmp") for n in model)  # whole


def test_leftovers_of_a_killed_export_are_removed_on_the_next(session, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()                                    # a PID that no longer runs
    stale = tmp_path / f".a.ply.{dead.pid}-abcd1234.tmp"
    mine = tmp_path / f".a.ply.{os.getpid()}-efgh5678.tmp"         # a writer still running
    other = tmp_path / f".b.ply.{dead.pid}-abcd1234.tmp"           # another output's
    for p in (stale, mine, other):
        p.write_bytes(b"half")
    export_results(session, {"ply": tmp_path / "a.ply"})
    assert not stale.exists() and mine.exists() and other.exists()
    export_results(session, {"ply": tmp_path / "b.ply"})
    assert not other.exists()


def test_empty_exports_are_errors(tmp_path):
    folder = tmp_path / "nodepth"
    with SessionStore(folder, SessionConfig(engine="geometric"), "test") as st:
        for r in _results(depth=False):
            st.write(r)
    with pytest.raises(EmptyExportError, match="no frame has depth yet") as exc:
        export_results(folder, {"tum": tmp_path / "t.txt", "ply": tmp_path / "a.ply"})
    assert exc.value.files == [str(tmp_path / "t.txt")] and not (tmp_path / "a.ply").exists()
    assert export_results(folder, {"tum": tmp_path / "t2.txt"})["frames"] == 7     # poses still export
    with pytest.raises(EmptyExportError, match="no frames up to frame -1"):
        export_results(folder, {"tum": tmp_path / "t3.txt"}, until=-1)


def test_cli_exit_code_and_message_for_an_empty_export(session, tmp_path, capsys):
    from app.cli import main

    rc = main(["run", str(session), "--ply", str(tmp_path / "a.ply"), "--conf-threshold", "1000"])
    err = capsys.readouterr().err
    assert rc != 0 and "0 points" in err and "confidence threshold 1000 keeps none" in err
    assert not (tmp_path / "a.ply").exists()
    assert main(["run", str(session), "--trajectory", str(tmp_path / "t.txt"), "--conf-threshold", "1000"]) == 0
