"""Bundled resources: the sample clip plays with the right intrinsics found beside it, its licence
note is there, the icons load, the default settings are valid settings."""
import filecmp
import json

import numpy as np

import resources
from engine.api import SessionConfig
from engine.io.sources import open_source


def test_sample_clip_plays_and_finds_its_intrinsics(shared_data):
    from engine.intrinsics import find_intrinsics, read_intrinsics
    clip = resources.sample_clip_path()
    src = open_source(clip)
    assert (src.kind, len(src), src.fps) == ("video", 200, 30.0)
    f = src.read()
    src.close()
    assert f.image.shape == (480, 640, 3)
    found = find_intrinsics(clip)
    assert found == clip.parent / "intrinsics.txt"
    assert filecmp.cmp(found, shared_data / "icl_livingroom_kt3" / "intrinsics.txt", shallow=False)
    assert read_intrinsics(found).as_tuple() == (481.2, 480.0, 319.5, 239.5, 640, 480)


def test_sample_licence_note():
    text = (resources.sample_clip_path().parent / "LICENSE.md").read_text()
    for needle in ("ICL-NUIM", "Handa", "ICRA", "CC BY 3.0", "fy = −480"):
        assert needle in text
    # only the ICL-NUIM clip may be bundled
    assert [p.suffix for p in resources.sample_clip_path().parent.iterdir() if p.suffix not in (".md", ".txt")] == [".mp4"]


def test_icons_are_real_images():
    from PIL import Image
    for size in (32, 64, 128, 256):
        with Image.open(resources.icon_path(size)) as im:
            assert im.size == (size, size)
            assert np.asarray(im.convert("RGBA"))[..., 3].max() == 255
    assert resources.icon_path(48).name == "reconstudio-64.png"
    assert resources.icon_path(svg=True).read_text().lstrip().startswith("<svg")


def test_default_settings_are_valid():
    d = resources.default_settings()
    cfg = SessionConfig(**d["session"])           # every key is a SessionConfig field
    assert cfg.engine == d["engine"] == "geometric"
    assert d["export"]["stride"] >= 1 and d["store"]["max_side"] == 256
    d["engine"] = "changed"                         # callers get a copy
    assert resources.default_settings()["engine"] == "geometric"
    json.loads(resources.resource_path("default_settings.json").read_text())


def test_io_package_names_resolve_lazily():
    import engine.io as io
    from engine.io import export, sources, store
    assert io.open_source is sources.open_source and io.SessionStore is store.SessionStore
    assert io.export_session is export.export_session and io.load_session is store.load_session
    import pytest
    with pytest.raises(AttributeError):
        io.no_such_name
