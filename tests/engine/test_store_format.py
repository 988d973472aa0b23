"""Store format 3 (byte-shuffled float16 depth / confidence planes, JPEG stored as is) and the
older layouts 1 and 2, written here as those versions wrote them, still read back the same."""
import io
import json
import zipfile

import numpy as np

from engine.api import FrameResult, SessionConfig
from engine.io.store import (FORMAT_VERSION, SessionStore, _decode_jpeg, _encode_jpeg, load_session, shuffle_f16,
                             unshuffle_f16)
from engine.review import SessionTimeline


def _depth(h=96, w=128, seed=0):
    """A tilted floor with mild noise, as a depth head gives."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    return (1.5 + 0.01 * xx + 0.02 * yy + rng.normal(0, 0.003, (h, w))).astype(np.float32)


def _result(i=0, h=96, w=128):
    rng = np.random.default_rng(i)
    d = _depth(h, w, i)
    d[0, :3] = [np.nan, 1e6, 0.0]
    return FrameResult(index=i, timestamp=i / 30, is_keyframe=True, c2w=np.eye(4),
                       K=np.array([[100.0, 0, w / 2 - 0.5], [0, 100.0, h / 2 - 0.5], [0, 0, 1]]),
                       image=rng.integers(0, 256, (h, w, 3), dtype=np.uint8), depth=d,
                       conf=(1.0 + rng.random((h, w)) * 9).astype(np.float32), segment=0)


def test_shuffled_planes_round_trip_float16_exactly():
    a = np.concatenate([_depth().ravel(), [np.nan, np.inf, -np.inf, 1e6, -1e6, 0.0, -0.0, 6e-8]])
    p = shuffle_f16(a)
    assert p.dtype == np.uint8 and p.shape == (2, a.size)
    f16 = np.clip(a, -65504, 65504).astype(np.float16)
    np.testing.assert_array_equal(p[0], f16.view(np.uint16) >> 8)                  # high bytes first
    np.testing.assert_array_equal(unshuffle_f16(p), f16.astype(np.float32))       # NaN == NaN here


def test_version_3_layout(tmp_path):
    with SessionStore(tmp_path / "s", SessionConfig(), "x") as st:
        st.write(_result())
    info = json.loads((tmp_path / "s" / "config.json").read_text())
    assert FORMAT_VERSION == 3 and info["version"] == 3 and info["format"] == "reconstudio-session"
    with zipfile.ZipFile(tmp_path / "s" / "frames" / "000000.npz") as z:
        kinds = {i.filename: i.compress_type for i in z.infolist()}
    assert kinds["image_jpeg.npy"] == zipfile.ZIP_STORED
    assert kinds["depth_f16_planes.npy"] == kinds["conf_f16_planes.npy"] == zipfile.ZIP_DEFLATED
    assert "depth.npy" not in kinds and "conf.npy" not in kinds
    got = load_session(tmp_path / "s").results[0]
    r = _result()
    want = np.clip(r.depth, -65504, 65504).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got.depth, want)
    assert got.depth.dtype == np.float32 and got.conf.dtype == np.float32


def _deflated(a) -> int:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("a.npy", "w") as f:
            np.lib.format.write_array(f, a)
    return len(buf.getvalue())


def test_shuffled_planes_deflate_smaller_than_interleaved_float16():
    d = _depth(392, 518)
    assert _deflated(shuffle_f16(d)) < 0.9 * _deflated(d.astype(np.float16))


def _write_old_session(folder, version, results):
    """A session folder as format 1 (256 px, float32, raw image) or 2 (float16, JPEG) wrote it."""
    (folder / "frames").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "format": "reconstudio-session", "version": version, "source": "old.mp4", "engine": "geometric",
        "started": "2026-11-01T10:00:00+00:00", "finished": "2026-11-01T10:01:00+00:00",
        "frames": len(results), "config": SessionConfig().to_dict(), "meta": {}}))
    for r in results:
        arrays = {"c2w": r.c2w, "K": r.K, "timestamp": np.float64(r.timestamp), "index": np.int64(r.index),
                  "is_keyframe": np.bool_(r.is_keyframe), "segment": np.int64(r.segment)}
        if version == 1:
            arrays.update(image=r.image, depth=r.depth.astype(np.float32), conf=r.conf.astype(np.float32))
        else:
            arrays.update(image_jpeg=_encode_jpeg(r.image), depth=r.depth.astype(np.float16),
                          conf=r.conf.astype(np.float16))
        np.savez_compressed(folder / "frames" / f"{r.index:06d}.npz", **arrays)


def test_versions_1_and_2_still_read(tmp_path):
    rs = [_result(i, 48, 64) for i in range(3)]
    for r in rs:
        r.depth[0, 1] = 3.0              # float16-exact values: the comparison is exact
    for version in (1, 2):
        folder = tmp_path / f"v{version}"
        _write_old_session(folder, version, rs)
        s = load_session(folder)
        assert s.complete and not s.problems and [r.index for r in s.results] == [0, 1, 2]
        tl = SessionTimeline(folder)
        for r, got in zip(rs, s.results):
            cast = np.float32 if version == 1 else np.float16
            np.testing.assert_array_equal(got.depth, r.depth.astype(cast).astype(np.float32))
            np.testing.assert_array_equal(got.conf, r.conf.astype(cast).astype(np.float32))
            assert got.depth.dtype == np.float32 and got.image.shape == (48, 64, 3)
            if version == 1:
                np.testing.assert_array_equal(got.image, r.image)
            else:                        # the JPEG it wrote
                np.testing.assert_array_equal(got.image, _decode_jpeg(_encode_jpeg(r.image)))
            np.testing.assert_array_equal(tl.result(r.index).depth, got.depth)
        tl.close()
