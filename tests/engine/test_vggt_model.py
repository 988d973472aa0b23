"""VGGT model plumbing on the tiny configuration: builder names, head outputs, checkpoints."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from engine import CheckpointError, EngineError, build_model, load_checkpoint
from engine.models.recipe import fill_recipe


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return fill_recipe(build_model("vggt-tiny"))


def test_builder_names_and_errors():
    from engine.vggt.model import VGGT
    with torch.device("meta"):
        assert isinstance(build_model("vggt-1b"), VGGT)
    with pytest.raises(EngineError, match="vggt-1b"):
        build_model("vggt-2b")
    with pytest.raises(EngineError, match="bad model option"):
        build_model("vggt-tiny", no_such_option=1)


def test_tiny_forward_all_heads(tiny):
    imgs = torch.rand(3, 3, 56, 70)
    q = torch.tensor([[10.0, 12.0], [40.0, 30.0]])
    out = tiny(imgs, query_points=q)
    assert out["pose_enc"].shape == (3, 9) and out["pose_enc_list"].shape == (3, 4, 9)
    assert out["depth"].shape == out["depth_conf"].shape == (3, 56, 70)
    assert out["world_points"].shape == (3, 56, 70, 3) and out["world_points_conf"].shape == (3, 56, 70)
    assert out["track"].shape == (3, 2, 2) and out["track_iters"].shape == (4, 3, 2, 2)
    assert (out["depth"] > 0).all() and (out["depth_conf"] > 1).all() and (out["world_points_conf"] > 1).all()
    assert torch.equal(out["track"][0], q)
    assert ((out["track_vis"] > 0) & (out["track_vis"] < 1)).all()
    # frame order matters only through the reference frame: the others are permutation-equivariant
    perm = torch.tensor([0, 2, 1])
    out2 = tiny(imgs[perm])
    assert torch.allclose(out2["depth"], out["depth"][perm], atol=1e-5)


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_checkpoint_round_trip(tiny, tmp_path, fmt):
    sd = tiny.state_dict()
    path = tmp_path / f"model.{fmt}"
    if fmt == "pt":
        torch.save({"model": sd}, path)                # the released wrapper form also loads
    else:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    fresh = build_model("vggt-tiny")
    report = load_checkpoint(fresh, path)
    assert report.loaded == len(sd)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, sd[k]), k


def test_lingbot_checkpoint_refused_by_vggt(tmp_path):
    """A LingBot-Map file has a scale token and no point/track heads: strict load says so."""
    lb = build_model("lingbot-map-tiny", embed_dim=64)
    path = tmp_path / "lingbot.pt"
    torch.save(lb.state_dict(), path)
    with pytest.raises(CheckpointError, match="scale_token|missing"):
        load_checkpoint(build_model("vggt-tiny"), path)


def test_model_inspect_cli_accepts_vggt(tiny, tmp_path):
    path = tmp_path / "model.pt"
    torch.save(tiny.state_dict(), path)
    res = subprocess.run([sys.executable, "-m", "app.cli", "model", "inspect", str(path), "--arch", "vggt-tiny"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "FITS" in res.stdout


def test_model_inspect_detects_a_vggt_file(tiny, tmp_path):
    """Without --arch a file with a track head and no scale token is compared with vggt-1b."""
    path = tmp_path / "model.pt"
    torch.save({"model": tiny.state_dict()}, path)
    res = subprocess.run([sys.executable, "-m", "app.cli", "model", "inspect", str(path)],
                         capture_output=True, text=True, timeout=300)
    assert "architecture: vggt-1b" in res.stdout, res.stdout + res.stderr
    assert res.returncode == 1            # tiny shapes do not fit the released architecture
