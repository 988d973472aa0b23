"""Keyframe depth on rendered views of a textured slanted plane with known geometry."""
import cv2
import numpy as np
import pytest

from engine.geometric.depth import (DepthView, choose_neighbours, choose_sweep_neighbours, keyframe_depth,
                                    pair_depth, sweep_depth)
from tests.engine.accuracy import check

W, H = 320, 240
K = np.array([[260.0, 0, 159.5], [0, 260.0, 119.5], [0, 0, 1]])
N = np.array([0.25, -0.1, 1.0]) / np.linalg.norm([0.25, -0.1, 1.0])   # plane n·X = D (world)
D = 4.0


def _texture(seed=0, size=1024):
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, 255, (size // 8, size // 8)).astype(np.float32)
    t = cv2.resize(t, (size, size), interpolation=cv2.INTER_CUBIC)
    return np.clip(t + rng.normal(0, 12, (size, size)), 0, 255).astype(np.float32)


def _render(c2w, tex):
    """Image of the plane (texture coords = world x, y) seen by camera c2w; true depth too."""
    uu, vv = np.meshgrid(np.arange(W, dtype=np.float64), np.arange(H, dtype=np.float64))
    rays_c = np.stack([uu, vv, np.ones_like(uu)], -1) @ np.linalg.inv(K).T
    rays_w = rays_c @ c2w[:3, :3].T
    C = c2w[:3, 3]
    lam = (D - N @ C) / (rays_w @ N)
    P = C + lam[..., None] * rays_w
    s = tex.shape[0] / 8.0                     # 8 m of plane across the texture
    mx = ((P[..., 0] + 4) * s).astype(np.float32)
    my = ((P[..., 1] + 4) * s).astype(np.float32)
    img = cv2.remap(tex, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    return np.clip(img, 0, 255).astype(np.uint8), (lam * rays_c[..., 2]).astype(np.float32)


def _pose(t, yaw_deg=0.0):
    T = np.eye(4)
    a = np.radians(yaw_deg)
    T[:3, :3] = [[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]]
    T[:3, 3] = t
    return T


def _sparse(depth, n=80, seed=1):
    rng = np.random.default_rng(seed)
    uv = np.c_[rng.uniform(20, W - 20, n), rng.uniform(20, H - 20, n)]
    return uv, depth[uv[:, 1].astype(int), uv[:, 0].astype(int)].astype(np.float64)


def _check(name, est, true, min_density, max_err):
    m = est > 0
    check((f"{name} density", m.mean(), ">", min_density))
    rel = np.abs(est[m] - true[m]) / true[m]
    check((f"{name} median rel. error", np.median(rel), "<", max_err), (f"{name} share within 5 %", np.mean(rel < 0.05), ">", 0.85))


def test_rectified_stereo_recovers_a_slanted_plane():
    tex = _texture()
    ref_img, ref_depth = _render(np.eye(4), tex)
    nbr_pose = _pose([0.35, 0.02, 0.0], yaw_deg=-2.0)
    nbr_img, _ = _render(nbr_pose, tex)
    ref = DepthView(0, ref_img, np.eye(4))
    nbr = DepthView(1, nbr_img, nbr_pose)
    uv, z = _sparse(ref_depth)
    assert choose_neighbours(ref, [nbr], float(np.median(z))) == [nbr]
    depth, disp = pair_depth(ref, nbr, K, uv, z)
    _check("right", depth, ref_depth, 0.6, 0.01)
    # the neighbour on the other side (ref is the right image) goes through the flipped path
    left_pose = _pose([-0.35, 0.0, 0.0])
    left = DepthView(2, _render(left_pose, tex)[0], left_pose)
    _check("left", pair_depth(ref, left, K, uv, z)[0], ref_depth, 0.6, 0.01)
    # and a mostly vertical baseline through the transposed path
    up_pose = _pose([0.02, -0.35, 0.0])
    up = DepthView(3, _render(up_pose, tex)[0], up_pose)
    _check("vertical", pair_depth(ref, up, K, uv, z)[0], ref_depth, 0.5, 0.01)
    # two neighbours: cross-checked result at the output size, confidence where depth is
    d2, conf = keyframe_depth(ref, [nbr, left], K, uv, z, (640, 480))
    assert d2.shape == (480, 640) and ((conf > 0) == (d2 > 0)).all()
    _check("two neighbours", d2[::2, ::2], ref_depth, 0.5, 0.01)


def test_plane_sweep_handles_forward_motion():
    tex = _texture(3)
    ref_img, ref_depth = _render(np.eye(4), tex)
    fwd_pose = _pose([0.08, 0.0, 0.45])           # mostly forward: no usable rectification
    back_pose = _pose([-0.05, 0.03, -0.4])
    ref = DepthView(0, ref_img, np.eye(4))
    nbrs = [DepthView(1, _render(fwd_pose, tex)[0], fwd_pose), DepthView(2, _render(back_pose, tex)[0], back_pose)]
    uv, z = _sparse(ref_depth)
    md = float(np.median(z))
    assert choose_neighbours(ref, nbrs, md) == []
    assert len(choose_sweep_neighbours(ref, nbrs, md)) == 2
    depth, score = sweep_depth(ref, nbrs, K, z)
    _check("sweep", depth, ref_depth, 0.5, 0.02)
    assert (score[depth > 0] > 0.8).all()          # the sweep's own acceptance threshold (min_score)


def test_untextured_views_give_no_depth():
    flat = np.full((H, W), 128, np.uint8)
    ref = DepthView(0, flat, np.eye(4))
    nbr = DepthView(1, flat, _pose([0.3, 0, 0]))
    uv, z = _sparse(np.full((H, W), 4.0, np.float32))
    assert (pair_depth(ref, nbr, K, uv, z)[0] == 0).all()
    assert (sweep_depth(ref, [nbr], K, z)[0] == 0).all()
    assert keyframe_depth(ref, [], K, uv, z, (W, H)) is None


def test_subpixel_refinement_reduces_the_error_of_small_disparities():
    # a short baseline (≈ 5 px of disparity): block matching alone locks onto whole pixels
    tex = _texture()
    ref_img, ref_depth = _render(np.eye(4), tex)
    pose = _pose([0.08, 0.02, 0.0], yaw_deg=-2.0)
    ref, nbr = DepthView(0, ref_img, np.eye(4)), DepthView(1, _render(pose, tex)[0], pose)
    uv, z = _sparse(ref_depth)
    errs = []
    for sub in (False, True):
        d, _ = pair_depth(ref, nbr, K, uv, z, subpixel=sub)
        m = d > 0
        errs.append(np.median(np.abs(d[m] - ref_depth[m]) / ref_depth[m]))
    check(("median rel. error refined / block matching", errs[1] / errs[0], "<", 0.6))


def test_fusion_weighs_pairs_by_their_uncertainty():
    from engine.geometric.depth import fuse_pairs
    # pixel 0: a long-baseline pair (disparity 20) and a short one (5) that agree loosely: the
    # fused inverse depth weighs them by (disparity / inverse depth)², ≈ 15:1; pixel 1: they disagree by 30 %: dropped; pixel 2:
    # one pair only: dropped; pixel 3: neither
    d_long = np.array([[1.0, 1.0, 2.0, 0.0]], np.float32)
    d_short = np.array([[1.03, 1.3, 0.0, 0.0]], np.float32)
    disp_long = np.array([[20.0, 20.0, 10.0, 0.0]], np.float32)
    disp_short = np.array([[5.0, 5.0, 0.0, 0.0]], np.float32)
    depth, deff = fuse_pairs([(d_long, disp_long), (d_short, disp_short)])
    r = np.array([1.0, 1 / 1.03])
    w = (np.array([20.0, 5.0]) / r) ** 2          # 1 / sigma_rho², sigma_rho = sigma_px · rho / disparity
    assert depth[0, 0] == pytest.approx(1 / ((w * r).sum() / w.sum()), rel=1e-5)
    assert deff[0, 0] == pytest.approx(np.hypot(20, 5), rel=1e-6)
    assert depth[0, 1] == 0 and deff[0, 1] == 0
    assert depth[0, 2] == 0 and deff[0, 2] == 0
    assert depth[0, 3] == 0
    # the short pair alone would not pass the agreement test with a tighter uncertainty
    depth2, _ = fuse_pairs([(d_long, disp_long), (d_short, disp_short)], sigma_px=0.01, agree=0.01)
    assert depth2[0, 0] == 0
