"""Frame sources: real clip decoding, timestamps, seeking, folders, and every bad input a user
can give (missing / truncated / corrupt video, empty folder, non-images, absent webcam)."""
import shutil

import numpy as np
import pytest

from engine.api import EngineError
from engine.io.sources import Frame, SourceError, list_webcams, open_source

ICL = "icl_livingroom_kt3"


@pytest.fixture
def video(shared_data):
    return shared_data / ICL / "video.mp4"


@pytest.fixture
def rgb_dir(shared_data):
    return shared_data / ICL / "rgb"


def _moov_offset(data: bytes) -> int:
    i = data.find(b"moov")
    assert i > 4, "test clip has no moov atom"
    return i - 4


def test_video_frames_fps_and_timestamps(video):
    src = open_source(str(video))
    assert (src.kind, src.name, src.fps, len(src)) == ("video", "video.mp4", 30.0, 200)
    frames = list(src)
    src.close()
    assert len(frames) == 200
    f0 = frames[0]
    assert isinstance(f0, Frame) and f0.image.dtype == np.uint8 and f0.image.shape == (480, 640, 3)
    assert [f.index for f in frames] == list(range(200))
    ts = np.array([f.timestamp for f in frames])
    np.testing.assert_allclose(ts, np.arange(200) / 30.0, atol=1e-6)


def test_video_is_rgb_not_bgr(video, rgb_dir):
    # The JPEG of frame 0 and the decoded video frame agree channel by channel only in RGB order.
    from PIL import Image
    ref = np.asarray(Image.open(rgb_dir / "000000.jpg").convert("RGB")).astype(float)
    src = open_source(video)
    img = src.read().image.astype(float)
    src.close()
    err_rgb = np.abs(img - ref).mean()
    err_bgr = np.abs(img[..., ::-1] - ref).mean()
    assert err_rgb < 8 and err_rgb < err_bgr / 2


def test_video_seek_matches_sequential(video):
    src = open_source(video)
    seq = [src.read().image for _ in range(60)]
    for k in (57, 3, 0, 31):
        src.seek(k)
        f = src.read()
        assert f.index == k
        assert f.timestamp == pytest.approx(k / 30.0)
        assert np.array_equal(f.image, seq[k])
    with pytest.raises(SourceError, match="cannot seek"):
        src.seek(200)
    src.close()


def test_video_resize_max_side(video):
    src = open_source(video, size=320)
    f = src.read()
    src.close()
    assert f.image.shape == (240, 320, 3)


def test_video_loop_keeps_timestamps_increasing(video):
    src = open_source(video, loop=True)
    frames = [src.read() for _ in range(205)]
    src.close()
    assert all(f is not None for f in frames)
    assert frames[200].index == 0 and frames[204].index == 4
    ts = np.array([f.timestamp for f in frames])
    assert np.all(np.diff(ts) > 0)
    assert frames[200].timestamp == pytest.approx(200 / 30.0)


def test_missing_video(tmp_path):
    with pytest.raises(SourceError, match="not found"):
        open_source(tmp_path / "nope.mp4")


def test_truncated_video_is_a_clear_error(video, tmp_path):
    # Cutting bytes off the end of this mp4 removes its index (moov atom, at the end):
    # nothing can be decoded, which must be a SourceError at open, never a crash later.
    data = video.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceError, match="truncated, corrupt"):
        open_source(cut)
    assert issubclass(SourceError, EngineError)


def test_damaged_video_plays_what_it_has_then_ends(video, tmp_path):
    # Index intact but the second half of the media data gone (zeroed): the source plays the
    # frames that decode and then ends quietly with a warning, never raising mid-stream.
    data = bytearray(video.read_bytes())
    moov = _moov_offset(bytes(data))
    start = len(data) // 2
    data[start:moov] = bytes(moov - start)
    bad = tmp_path / "damaged.mp4"
    bad.write_bytes(bytes(data))
    src = open_source(bad)
    assert len(src) == 200          # the container still claims 200 frames
    frames = list(src)
    assert 10 < len(frames) < 200
    assert src.read() is None       # stays ended
    assert any("ended after" in w for w in src.warnings)
    src.close()


def test_garbage_and_empty_files(tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_text("not a video at all\n" * 50)
    with pytest.raises(SourceError, match="Cannot open video.*(text file|truncated)"):
        open_source(junk)
    noise = tmp_path / "noise.mp4"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8).tobytes())
    with pytest.raises(SourceError, match="Cannot (open|decode)"):
        open_source(noise)
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    with pytest.raises(SourceError, match="empty"):
        open_source(empty)


def test_folder_sorted_by_name_with_non_images_ignored(rgb_dir, tmp_path):
    # copy 3 frames under names whose creation order differs from name order, plus clutter
    names = ["b_002.png", "a_001.jpg", "c_003.JPEG"]
    import cv2
    for name, src_idx in zip(names, (2, 1, 3)):
        img = cv2.imread(str(rgb_dir / f"{src_idx:06d}.jpg"))
        cv2.imwrite(str(tmp_path / name), img)
    (tmp_path / "readme.txt").write_text("hello")
    (tmp_path / "depth.tiff").write_bytes(b"II*\0")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.jpg").write_bytes(b"")
    src = open_source(tmp_path, fps=10)
    assert (src.kind, len(src), src.fps) == ("folder", 3, 10.0)
    assert [p.name for p in src.files] == ["a_001.jpg", "b_002.png", "c_003.JPEG"]
    frames = list(src)
    assert [f.index for f in frames] == [0, 1, 2]
    assert [f.timestamp for f in frames] == pytest.approx([0.0, 0.1, 0.2])
    assert all(f.image.shape == (480, 640, 3) and f.image.dtype == np.uint8 for f in frames)


def test_folder_default_fps_and_seek(rgb_dir):
    src = open_source(rgb_dir)
    assert (len(src), src.fps) == (200, 30.0)
    src.seek(150)
    f = src.read()
    assert (f.index, f.timestamp) == (150, pytest.approx(5.0))


def test_folder_skips_unreadable_image_with_warning(rgb_dir, tmp_path):
    for i in range(3):
        shutil.copy(rgb_dir / f"{i:06d}.jpg", tmp_path / f"{i:06d}.jpg")
    (tmp_path / "000001.jpg").write_bytes(b"this is not a jpeg")
    src = open_source(tmp_path)
    frames = list(src)
    assert [f.index for f in frames] == [0, 2]
    assert len(src.warnings) == 1 and "000001.jpg" in src.warnings[0]


def test_empty_folder_and_folder_without_images(tmp_path):
    with pytest.raises(SourceError, match="No images"):
        open_source(tmp_path)
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "b.mp3").write_bytes(b"x")
    with pytest.raises(SourceError, match="No images"):
        open_source(tmp_path)


def test_folder_of_only_broken_images_ends_even_when_looping(tmp_path):
    (tmp_path / "0.jpg").write_bytes(b"broken")
    src = open_source(tmp_path, loop=True)
    assert src.read() is None


def test_absent_webcam(monkeypatch):
    present = list_webcams()
    absent = max(present, default=-1) + 7
    for spec in (absent, f"webcam:{absent}"):
        with pytest.raises(SourceError, match=f"Webcam {absent} is not available"):
            open_source(spec)
    with pytest.raises(SourceError, match="expected webcam:N"):
        open_source("webcam:front")


def test_no_input():
    with pytest.raises(SourceError, match="No input"):
        open_source("")


def test_probing_and_bad_files_print_nothing(video, tmp_path, capfd):
    # OpenCV/FFmpeg would print "moov atom not found", V4L2 probe errors, ... on the terminal.
    data = video.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[:100_000])
    list_webcams(4)
    for spec in (cut, "webcam:9"):
        with pytest.raises(SourceError):
            open_source(spec)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
