"""LingBot-Map architecture on small configurations (engine/models): key set, recipe, RoPE,
camera cache, dtypes and the timing hook."""
import hashlib

import numpy as np
import pytest
import torch

from engine.api import EngineError
from engine.model_zoo import build_model
from engine.models.recipe import fill_recipe, recipe_tensor
from engine.models import sections
from engine.models.rope import Rope2D, VideoRope3D


def _tsv(path):
    return [line.rstrip("\n").split("\t") for line in open(path)]


def test_full_size_state_dict_matches_released_keys(fixtures_dir):
    with torch.device("meta"):
        m = build_model("lingbot-map")
    ref = {k: tuple(int(x) for x in s.split(",")) for k, s, _ in _tsv(fixtures_dir / "lingbot_map_keys.tsv")}
    got = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert got == ref and len(got) == 1342
    assert sum(int(np.prod(s)) for s in got.values()) == 1_157_943_540
    assert all(v.dtype == torch.float32 for v in m.state_dict().values())


@pytest.mark.parametrize("key", ["aggregator.camera_token", "aggregator.scale_token",
                                 "aggregator.frame_blocks.0.attn.q_norm.weight", "aggregator.global_blocks.3.ls1.gamma",
                                 "camera_head.trunk.2.attn.qkv.bias", "depth_head.resize_layers.0.weight",
                                 "depth_head.scratch.output_conv2.2.weight", "aggregator.patch_embed.pos_embed"])
def test_recipe_matches_checksums(fixtures_dir, key):
    shapes = {k: tuple(int(x) for x in s.split(",")) for k, s, _ in _tsv(fixtures_dir / "lingbot_map_keys.tsv")}
    checks = {row[0]: row[1:] for row in _tsv(fixtures_dir / "lingbot_map_weight_checks.tsv")}
    t = recipe_tensor(key, shapes[key])
    sha, first, last, total = checks[key]
    assert hashlib.sha256(t.tobytes()).hexdigest() == sha
    assert float(t.reshape(-1)[0]) == float(first) and float(t.reshape(-1)[-1]) == float(last)
    assert t.astype(np.float64).sum() == pytest.approx(float(total), rel=1e-9, abs=1e-9)


def test_fill_recipe_goes_through_state_dict():
    m = fill_recipe(build_model("lingbot-map-tiny"))
    sd = m.state_dict()
    for k in ("aggregator.camera_token", "camera_head.pose_branch.fc2.bias", "depth_head.norm.weight"):
        assert torch.equal(sd[k], torch.from_numpy(recipe_tensor(k, tuple(sd[k].shape))))


def test_overrides_and_bad_options():
    m = build_model("lingbot-map-tiny", depth=6, intermediate_layers=(1, 2, 4, 5))
    assert len(m.aggregator.frame_blocks) == 6 == len(m.aggregator.global_blocks)
    with pytest.raises(EngineError):
        build_model("lingbot-map-tiny", no_such_option=1)
    with pytest.raises(EngineError):
        build_model("lingbot-map-tiny", intermediate_layers=(0, 1, 2, 9))
    with pytest.raises(EngineError):
        build_model("vggt-huge")


def test_rope3d_layout_and_formula_past_table():
    rope = VideoRope3D(64)
    assert rope.split == (20, 22, 22)
    rot = rope.rotation([3, 2000], grid_h=2, grid_w=3, num_special=6, device="cpu", dtype=torch.float64)
    cos = rot.cos[:, :, 0, 0::2]                                      # [F, N, 32] per pair
    inv_t = 1.0 / 1e4 ** (torch.arange(0, 20, 2, dtype=torch.float64) / 20)
    inv_h = 1.0 / 1e4 ** (torch.arange(0, 22, 2, dtype=torch.float64) / 22)
    assert torch.allclose(cos[1, 0, :10], torch.cos(2000 * inv_t))     # time past the 1024 table
    assert torch.allclose(cos[0, 4, 10:21], torch.cos(4 * inv_h))      # special token 4 at (f, 4, 4)
    assert torch.allclose(cos[0, 6 + 4, 10:21], torch.cos(7 * inv_h))  # patch (1, 1) at (f, 7, 7)


def _rope3d_reference(times, grid_h, grid_w, n_special, dtype):
    """The 3D RoPE tables written out from the formula, element by element: token j < n_special
    at (f, j, j), patch (y, x) at (f, n_special + y, n_special + x); angle = position x inverse
    frequency per pair; interleaved (cos, cos) and (-sin, sin) per pair, rounded once to dtype."""
    inv = [1.0 / 1e4 ** (torch.arange(0, s, 2, dtype=torch.float64) / s) for s in (20, 22, 22)]
    pos = [(j, j) for j in range(n_special)] + [(n_special + y, n_special + x)
                                               for y in range(grid_h) for x in range(grid_w)]
    cos = torch.empty(len(times), len(pos), 1, 64, dtype=torch.float64)
    sin = torch.empty_like(cos)
    for i, f in enumerate(times):
        for n, (r, c) in enumerate(pos):
            ang = torch.cat((torch.tensor([float(f)], dtype=torch.float64) * inv[0],
                             torch.tensor([float(r)], dtype=torch.float64) * inv[1],
                             torch.tensor([float(c)], dtype=torch.float64) * inv[2]))
            cos[i, n, 0, 0::2] = cos[i, n, 0, 1::2] = ang.cos()
            sin[i, n, 0, 0::2], sin[i, n, 0, 1::2] = -ang.sin(), ang.sin()
    return cos.to(dtype), sin.to(dtype)


@pytest.mark.parametrize("times", [[7], [3, 4, 5], [3, 2000], []])
def test_rope3d_tables_equal_the_formula_element_by_element(times):
    """The tables `rotation` builds with tensor ops on its device (here the CPU; on a GPU
    tests/engine/test_rope_gpu.py compares with these) equal the formula written out entry by
    entry. Consecutive times take the arange branch, others the upload branch."""
    rope = VideoRope3D(64)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        got = rope.rotation(times, 4, 5, 6, "cpu", dtype)
        ref_cos, ref_sin = _rope3d_reference(times, 4, 5, 6, dtype)
        assert got.interleaved and got.cos.shape == ref_cos.shape == (len(times), 26, 1, 64)
        assert torch.equal(got.cos, ref_cos) and torch.equal(got.sin, ref_sin)


def test_rope3d_attention_depends_only_on_time_differences():
    rope = VideoRope3D(16)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 10, 4, 16, generator=g).unbind(0)        # [F=1, N, H, D]
    def scores(fq, fk):
        rq = rope.rotation([fq], 2, 2, 6, "cpu", torch.float64)
        rk = rope.rotation([fk], 2, 2, 6, "cpu", torch.float64)
        return torch.einsum("fnhd,fmhd->hnm", rq(q.double()), rk(k.double()))
    assert torch.allclose(scores(5, 2), scores(100_005, 100_002), atol=1e-8)
    assert not torch.allclose(scores(5, 2), scores(5, 3), atol=1e-3)


def test_rope2d_positions():
    pos = Rope2D(64).positions(2, 3, 6)
    assert pos[:6].abs().sum() == 0 and pos[6].tolist() == [1, 1] and pos[-1].tolist() == [2, 3]


def test_batch_forward_shapes_bf16_and_timer():
    m = fill_recipe(build_model("lingbot-map-tiny"))
    imgs = torch.rand(3, 3, 56, 70, generator=torch.Generator().manual_seed(1))
    seen = []

    class Timer:
        def __init__(self, name): self.name = name
        def __enter__(self): seen.append(self.name)
        def __exit__(self, *a): return False

    with sections.timing(Timer):
        out = m(imgs, iterations=2)
    assert out["pose_enc"].shape == (3, 9) and out["pose_enc_list"].shape == (3, 2, 9)
    assert out["depth"].shape == (3, 56, 70) == out["conf"].shape
    assert (out["depth"] > 0).all() and (out["conf"] > 1).all()
    assert seen.count("frame_blocks") == 4 == seen.count("global_blocks")
    assert {"patch_embed", "camera_head", "depth_head"} <= set(seen)
    n = len(seen)
    m(imgs, iterations=2)
    assert len(seen) == n                       # outside the block nothing is timed
    with torch.profiler.profile() as prof:      # while a profiler records: named ranges
        m(imgs, iterations=1)
    names = {e.name for e in prof.events()}
    assert {"patch_embed", "frame_blocks", "global_blocks", "camera_head", "depth_head"} <= names
    m.set_dtype(torch.bfloat16)
    assert m.aggregator.global_blocks[0].attn.qkv.weight.dtype == torch.bfloat16
    assert m.camera_head.trunk[0].attn.qkv.weight.dtype == torch.float32
    assert m.depth_head.norm.weight.dtype == torch.float32
    out16 = m(imgs, iterations=2)
    assert out16["depth"].dtype == torch.float32
    rel = ((out16["depth"] - out["depth"]).abs() / out["depth"]).max()
    assert rel < 0.1


def test_camera_cache_is_bounded_and_non_keyframes_commit_nothing():
    m = fill_recipe(build_model("lingbot-map-tiny"))
    head = m.camera_head
    cache = head.new_cache(iterations=2, scale_frames=2, cap=3, device="cpu")
    g = torch.Generator().manual_seed(2)
    tok = lambda n: torch.randn(n, head.dim, generator=g)

    def step(n, scale, key):
        cache.begin_step(n, scale, key)
        out = head(tok(n), 2, cache)
        cache.end_step()
        return out

    step(2, True, True)
    assert cache.visible == 2
    for i in range(6):
        before = cache.state()
        step(1, False, False)                                        # non-keyframe
        after = cache.state()
        assert {k: v for k, v in before.items() if k != "slots"} == {k: v for k, v in after.items() if k != "slots"}
        assert torch.equal(before["slots"], after["slots"])
        step(1, False, True)
        assert cache.visible == 2 + min(i + 1, 3)
    assert cache.kv.shape[3] == 2 + 3 + 1 and cache.committed == 8
