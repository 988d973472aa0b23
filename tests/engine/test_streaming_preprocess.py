"""Frame preprocessing for the neural engines (engine/preprocess.py)."""
import numpy as np
import pytest
import torch
from PIL import Image

from engine.api import EngineError
from engine.preprocess import preprocess, target_size


@pytest.mark.parametrize("wh, out", [((640, 480), (518, 392)), ((1920, 1080), (518, 294)),
                                     ((518, 378), (518, 378)), ((480, 640), (518, 518)),
                                     ((100, 2000), (518, 518)), ((4000, 30), (518, 14))])
def test_sizes(wh, out):
    W, H = wh
    p = preprocess(np.zeros((H, W, 3), np.uint8))
    assert tuple(p.tensor.shape) == (3, out[1], out[0]) and p.image.shape == (out[1], out[0], 3)
    assert p.tensor.dtype == torch.float32
    assert out[1] % 14 == 0


def test_portrait_is_centre_cropped():
    img = np.zeros((640, 480, 3), np.uint8)
    img[:160] = 255                                   # white top quarter: cropped away (686 -> 518)
    p = preprocess(img)
    assert target_size(480, 640) == (518, 686, 518)
    rows = p.image.mean(axis=(1, 2))
    assert rows[0] > 100 and rows[-1] < 1           # 84 rows cut at the top, 84 at the bottom


def test_matches_upstream_fixture_inputs(shared_data, fixtures_dir):
    fx = np.load(fixtures_dir / "lingbot_map_stream_it1.npz")
    for i, name in enumerate(fx["frame_names"][:3]):
        rgb = np.asarray(Image.open(shared_data / "icl_livingroom_kt3" / "rgb" / str(name)).convert("RGB"))
        p = preprocess(rgb, image_width=int(fx["image_size"]))
        assert p.tensor.shape == fx["images"][i].shape
        assert np.abs(p.tensor.numpy() - fx["images"][i]).max() <= 2 / 255


def test_channels_and_passthrough():
    g = preprocess(np.full((28, 28), 7, np.uint8))
    assert g.image.shape == (518, 518, 3) and (g.image == 7).all()
    rgba = np.zeros((28, 28, 4), np.uint8)                    # fully transparent -> white
    assert (preprocess(rgba).image == 255).all()
    t = torch.rand(3, 28, 42)
    p = preprocess(t)
    assert p.tensor is not t and torch.equal(p.tensor, t) and p.image.shape == (28, 42, 3)


@pytest.mark.parametrize("bad", [np.zeros((10, 10, 3), np.float32), np.zeros((10, 10, 2), np.uint8),
                                 np.zeros((2, 10, 10, 3), np.uint8), torch.rand(3, 20, 28),
                                 torch.full((3, 14, 14), float("nan")), "frame.png", np.zeros((0, 5, 3), np.uint8)])
def test_bad_frames_raise_clear_errors(bad):
    with pytest.raises(EngineError):
        preprocess(bad)
