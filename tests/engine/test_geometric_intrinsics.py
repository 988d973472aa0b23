"""Intrinsics: files, numbers, FOV default, scaling, discovery and clear errors."""
import math

import numpy as np
import pytest

from engine.api import EngineError, SessionConfig
from engine.intrinsics import (Intrinsics, IntrinsicsError, default_intrinsics, find_intrinsics,
                               read_intrinsics, resolve_intrinsics)


def test_reads_the_shared_data_format(shared_data):
    k = read_intrinsics(shared_data / "7scenes_redkitchen_150_199" / "intrinsics.txt")
    assert k.as_tuple() == (525.0, 525.0, 320.0, 240.0, 640, 480)
    assert np.allclose(k.matrix(), [[525, 0, 320], [0, 525, 240], [0, 0, 1]])


def test_find_beside_a_sequence(shared_data, tmp_path):
    seq = shared_data / "icl_livingroom_kt3"
    assert find_intrinsics(seq) == seq / "intrinsics.txt"              # the sequence folder
    assert find_intrinsics(seq / "rgb") == seq / "intrinsics.txt"      # its image folder
    assert find_intrinsics(seq / "video.mp4") == seq / "intrinsics.txt"  # a video beside it
    assert find_intrinsics(tmp_path) is None and find_intrinsics(None) is None


def test_scaling_follows_a_resize():
    k = Intrinsics(481.2, 480.0, 319.5, 239.5, 640, 480).scaled_to(320, 240)
    assert (k.fx, k.fy, k.width, k.height) == (240.6, 240.0, 320, 240)
    assert (k.cx, k.cy) == (159.5, 119.5)     # the image centre stays the centre
    with pytest.raises(IntrinsicsError, match="aspect ratio"):
        Intrinsics(500, 500, 320, 240, 640, 480).scaled_to(640, 360)


def test_default_from_fov():
    k = default_intrinsics(640, 480, 90.0)
    assert k.fx == pytest.approx(320.0) and k.fy == k.fx and (k.cx, k.cy) == (319.5, 239.5)
    k60 = default_intrinsics(640, 480)
    assert k60.fx == pytest.approx(320 / math.tan(math.radians(30)))
    with pytest.raises(IntrinsicsError, match="field of view"):
        default_intrinsics(640, 480, 200)


def test_resolve_precedence(tmp_path):
    f = tmp_path / "cam.txt"
    f.write_text("# fx fy cx cy width height\n500 500 320 240 640 480\n")
    k, note = resolve_intrinsics(SessionConfig(intrinsics=(400, 400, 160, 120, 320, 240)), 640, 480)
    assert k.fx == 800 and note == "given"
    k, note = resolve_intrinsics(SessionConfig(extra={"intrinsics_file": str(f)}), 1280, 960)
    assert k.fx == 1000 and "file" in note
    k, note = resolve_intrinsics(SessionConfig(fov_deg=90), 640, 480)
    assert k.fx == pytest.approx(320) and "FOV" in note


@pytest.mark.parametrize("text,match", [
    ("", "no 'fx fy cx cy width height' line"),
    ("500 500 320 240\n", "6 numbers"),
    ("500 abc 320 240 640 480\n", "numbers"),
    ("481.2 -480 319.5 239.5 640 480\n", "positive"),
    ("500 500 900 240 640 480\n", "outside"),
])
def test_bad_files_give_clear_messages(tmp_path, text, match):
    f = tmp_path / "intrinsics.txt"
    f.write_text(text)
    with pytest.raises(IntrinsicsError, match=match) as exc:
        read_intrinsics(f)
    assert isinstance(exc.value, EngineError)


def test_missing_file(tmp_path):
    with pytest.raises(IntrinsicsError, match="not found"):
        read_intrinsics(tmp_path / "nope.txt")


def test_attach_found_intrinsics_beside_input_only(tmp_path):
    from engine.api import SessionConfig
    from engine.intrinsics import attach_found_intrinsics

    video = tmp_path / "clip.mp4"
    video.write_bytes(b"x")
    cfg = SessionConfig()
    assert "self-calibrated" in attach_found_intrinsics(cfg, str(video))
    assert cfg.intrinsics_file is None
    assert "assumed 60°" in attach_found_intrinsics(SessionConfig(self_calibration=False), str(video))
    (tmp_path / "intrinsics.txt").write_text("500 500 320 240 640 480\n")
    assert attach_found_intrinsics(cfg, str(video)) == str(tmp_path / "intrinsics.txt")
    assert cfg.intrinsics_file == str(tmp_path / "intrinsics.txt")
    # a webcam spec is not a path: the current folder's intrinsics.txt must not be picked up
    cfg2 = SessionConfig()
    import os
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert "self-calibrated" in attach_found_intrinsics(cfg2, "webcam:0")
    finally:
        os.chdir(cwd)
    # numbers given by the user win over a file
    cfg3 = SessionConfig(intrinsics=(1, 1, 1, 1, 2, 2))
    assert attach_found_intrinsics(cfg3, str(video)) == "given"
    assert cfg3.intrinsics_file is None
