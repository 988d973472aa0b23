"""Keyframe depth by two-view stereo: the keyframe and a well-baselined neighbour keyframe are
rectified with their tracked poses (cv2.stereoRectify), matched with semi-global block matching
(cv2.StereoSGBM, its left-right check and speckle filter on), and the disparity is mapped back to
the keyframe's own pixel grid. With a second neighbour the two depth maps are cross-checked and
only agreeing pixels are kept. The disparity search range comes from the sparse map points seen
in the keyframe, which keeps the search short and the scale consistent with the trajectory.

Keyframes whose neighbours moved mostly forward (the epipole inside the image, where rectification
degenerates) fall back to a plane sweep: fronto-parallel planes at uniform inverse depth, ZNCC
averaged over up to two neighbours, winner-take-all with parabolic refinement, and matches kept
only when strong (ZNCC > 0.8), unambiguous and textured.

Confidence (larger = better, 0 = no depth): stereo 1 + (disparity in result pixels) / 4, halved
where only one of two pairs saw the pixel; plane sweep 1 + 20·(ZNCC − 0.8), i.e. 1..5."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import cv2
import numpy as np


@dataclass
class DepthView:
    fid: int
    gray: np.ndarray      # at depth resolution
    c2w: np.ndarray
    segment: int = 0


def choose_neighbours(ref: DepthView, candidates: list, median_depth: float, k: int = 2,
                      target_ratio: float = 0.08, min_ratio: float = 0.02, max_ratio: float = 0.35) -> list:
    """Up to `k` candidate views with a mostly sideways baseline of a useful length relative to
    the scene depth (best first)."""
    Rr = ref.c2w[:3, :3].T
    scored = []
    for c in candidates:
        if c.fid == ref.fid:
            continue
        b = Rr @ (c.c2w[:3, 3] - ref.c2w[:3, 3])
        lateral, forward = np.hypot(b[0], b[1]), abs(b[2])
        ratio = lateral / max(median_depth, 1e-9)
        rel = Rr @ c.c2w[:3, :3]
        angle = np.degrees(np.arccos(np.clip((np.trace(rel) - 1) / 2, -1, 1)))
        if forward > 0.8 * lateral or not (min_ratio <= ratio <= max_ratio) or angle > 25:
            continue
        scored.append((abs(np.log(ratio / target_ratio)), c))
    scored.sort(key=lambda s: s[0])
    return [c for _, c in scored[:k]]


def _disparity_range(sgn_d: np.ndarray, range_lo: float = 0.6, range_hi: float = 1.5):
    if len(sgn_d) < 5:
        return 0, 64
    lo, hi = np.percentile(sgn_d, [2, 98])
    lo = int(np.floor(max(0.0, range_lo * lo)))
    hi = int(np.ceil(range_hi * hi)) + 2
    n = int(np.ceil(max(hi - lo, 16) / 16.0) * 16)
    return lo, min(n, 192)


def refine_disparity(a: np.ndarray, b: np.ndarray, disp: np.ndarray, iterations: int = 2, win: int = 5,
                     below: float = 8.0) -> np.ndarray:
    """Sub-pixel refinement of a rectified disparity map (a(x) ≈ b(x − d), 0 = none): Gauss-Newton
    steps of the windowed intensity difference along the scan line. Block matching interpolates
    its cost between whole disparities, which pulls sub-pixel values towards integers (pixel
    locking) -- at the small disparities of distant surfaces that shows as stepped depth layers.
    Only disparities below `below` px are refined: that is where a fraction of a pixel matters
    (at larger ones the noise of real images outweighs the gain)."""
    a = a.astype(np.float32)
    b = b.astype(np.float32)
    h, w = a.shape
    valid = (disp > 0).astype(np.float32)
    if not (disp[disp > 0] < below).any():
        return disp
    xs = np.broadcast_to(np.arange(w, dtype=np.float32), (h, w))
    ys = np.broadcast_to(np.arange(h, dtype=np.float32)[:, None], (h, w))
    gx = cv2.Sobel(b, cv2.CV_32F, 1, 0, ksize=3) / 8.0
    d = disp.astype(np.float32).copy()
    total = np.zeros_like(d)
    for _ in range(iterations):
        mx = np.ascontiguousarray(xs - d)
        bw = cv2.remap(b, mx, np.ascontiguousarray(ys), cv2.INTER_LINEAR)
        gw = cv2.remap(gx, mx, np.ascontiguousarray(ys), cv2.INTER_LINEAR)
        num = cv2.boxFilter(gw * (a - bw) * valid, -1, (win, win), normalize=False)
        den = cv2.boxFilter(gw * gw * valid, -1, (win, win), normalize=False)
        step = np.where(den > 1e-2, -num / np.maximum(den, 1e-2), 0.0).astype(np.float32)
        step = np.clip(step, -0.5 - total, 0.5 - total)     # at most half a pixel from the matcher's value
        total += step
        d = np.where(valid > 0, d + step, 0.0).astype(np.float32)
    return np.where(disp < below, d, disp).astype(np.float32)


def pair_depth(ref: DepthView, nbr: DepthView, K: np.ndarray, sparse_uv: np.ndarray, sparse_z: np.ndarray,
               block: int = 5, alpha: float = -1.0, upscale: float = 1.0,
               min_texture: float = 4.0, uniqueness: int = 10, range_lo: float = 0.4, range_hi: float = 2.5,
               min_angle_deg: float = 0.25, subpixel: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Depth (float32, 0 = none) and disparity (in depth-resolution pixels) on ref's grid.
    Pixels whose viewing rays meet at less than `min_angle_deg` are dropped: their depth is too
    uncertain (relative error ≈ disparity error / disparity)."""
    h, w = ref.gray.shape
    Rr, Rn = ref.c2w[:3, :3].T, nbr.c2w[:3, :3].T
    tr, tn = -Rr @ ref.c2w[:3, 3], -Rn @ nbr.c2w[:3, 3]
    R = Rn @ Rr.T
    t = tn - R @ tr
    dist = np.zeros(5)
    # alpha=1 keeps every source pixel in view; `upscale` enlarges the rectified images so the
    # zoom-out does not cost resolution
    rw, rh = int(round(w * upscale)), int(round(h * upscale))
    R1, R2, P1, P2, _, _, _ = cv2.stereoRectify(K, dist, K, dist, (w, h), R, t.reshape(3, 1),
                                                flags=cv2.CALIB_ZERO_DISPARITY, alpha=alpha,
                                                newImageSize=(rw, rh))
    vertical = abs(P2[1, 3]) > abs(P2[0, 3])
    ax = 1 if vertical else 0
    f = P1[ax, ax]
    B = abs(P2[ax, 3]) / P2[ax, ax]
    ref_is_left = P2[ax, 3] < 0
    m1 = cv2.initUndistortRectifyMap(K, dist, R1, P1, (rw, rh), cv2.CV_32FC1)
    m2 = cv2.initUndistortRectifyMap(K, dist, R2, P2, (rw, rh), cv2.CV_32FC1)
    r0 = cv2.remap(ref.gray, m1[0], m1[1], cv2.INTER_LINEAR)
    r1 = cv2.remap(nbr.gray, m2[0], m2[1], cv2.INTER_LINEAR)

    # expected disparities of the map points, for the search range
    Kinv = np.linalg.inv(K)
    rays = np.c_[sparse_uv, np.ones(len(sparse_uv))] @ Kinv.T * sparse_z[:, None]
    zr = (rays @ R1.T)[:, 2]
    d_exp = f * B / np.maximum(zr[zr > 0], 1e-9)
    lo, n = _disparity_range(d_exp, range_lo, range_hi)

    def orient(img):
        if vertical:
            img = img.T
        return img if ref_is_left else img[:, ::-1]
    a, b = np.ascontiguousarray(orient(r0)), np.ascontiguousarray(orient(r1))
    sgbm = cv2.StereoSGBM_create(minDisparity=lo, numDisparities=n, blockSize=block,
                                 P1=8 * block * block, P2=32 * block * block, disp12MaxDiff=1,
                                 uniquenessRatio=uniqueness, speckleWindowSize=80, speckleRange=2,
                                 mode=cv2.STEREO_SGBM_MODE_SGBM)
    raw = sgbm.compute(a, b).astype(np.float32) / 16.0
    raw[raw < lo] = 0
    if subpixel:
        raw = refine_disparity(a, b, raw)
    if not ref_is_left:
        raw = raw[:, ::-1]
    if vertical:
        raw = raw.T
    disp = np.ascontiguousarray(raw)
    # the rays of a pixel meet at ≈ disparity / focal (rectified): cull by that angle, whatever
    # the resolution or the baseline
    disp[(disp < max(lo, 1e-3)) | (disp < f * np.tan(np.radians(min_angle_deg)))] = 0

    # back to the keyframe's grid: pixel → rectified ray → sample disparity
    uu, vv = np.meshgrid(np.arange(w, dtype=np.float64), np.arange(h, dtype=np.float64))
    d = np.stack([uu, vv, np.ones_like(uu)], -1) @ Kinv.T
    r = d @ R1.T
    pr = r @ P1[:3, :3].T
    mx = (pr[..., 0] / pr[..., 2]).astype(np.float32)
    my = (pr[..., 1] / pr[..., 2]).astype(np.float32)
    ds = cv2.remap(disp, mx, my, cv2.INTER_NEAREST, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        depth = np.where(ds > 0, f * B / ds / r[..., 2], 0.0).astype(np.float32)
    depth[~np.isfinite(depth) | (depth < 0)] = 0
    if min_texture > 0:
        # stereo is unreliable where the keyframe has no texture: local grey-level std over 7×7
        g = ref.gray.astype(np.float32)
        mu = cv2.blur(g, (7, 7))
        sd = np.sqrt(np.maximum(cv2.blur(g * g, (7, 7)) - mu * mu, 0))
        depth[sd < min_texture] = 0
        ds = np.where(depth > 0, ds, 0)
    return depth, ds


def keyframe_depth(ref: DepthView, neighbours: list, K: np.ndarray, sparse_uv: np.ndarray,
                   sparse_z: np.ndarray, out_size: tuple[int, int], agree: float = 0.04,
                   sweep: bool = False, **kw):
    """Depth and confidence for `ref` at `out_size` (w, h) from one or two neighbours (stereo
    pairs, or plane-sweep neighbours with `sweep=True`); None if no neighbour is usable. K is for
    the depth resolution (ref.gray)."""
    if not neighbours:
        return None
    h, w = ref.gray.shape
    if sweep:
        res = sweep_depth(ref, neighbours, K, sparse_z)
        if res is None:
            return None
        d1, score = res
        conf = np.where(d1 > 0, 1.0 + 20.0 * (score - 0.8), 0.0).astype(np.float32)
        if (w, h) != tuple(out_size):
            d1 = cv2.resize(d1, out_size, interpolation=cv2.INTER_NEAREST)
            conf = cv2.resize(conf, out_size, interpolation=cv2.INTER_NEAREST)
        return d1, conf
    scale_out = out_size[0] / w
    d1, conf = fuse_pairs([pair_depth(ref, nb, K, sparse_uv, sparse_z, **kw) for nb in neighbours], agree)
    conf = np.where(d1 > 0, 1.0 + conf * scale_out / 4.0, 0.0).astype(np.float32)
    if (w, h) != tuple(out_size):
        d1 = cv2.resize(d1, out_size, interpolation=cv2.INTER_NEAREST)
        conf = cv2.resize(conf, out_size, interpolation=cv2.INTER_NEAREST)
    return d1, conf


def fuse_pairs(pairs: list, agree: float = 0.04, sigma_px: float = 0.25, k_sigma: float = 2.5):
    """Fuse the (depth, disparity) maps of several stereo pairs of one keyframe, per pixel, in
    inverse depth: each pair's inverse depth ρ has the uncertainty σ_ρ = sigma_px · ρ / disparity
    (a disparity error of sigma_px), so the fused value is the inverse-variance mean -- longer
    baselines weigh more. A pixel two or more pairs see is kept when every pair agrees with the
    fused value within `agree` (relative) or k_sigma of their combined uncertainty; a pixel only
    one of several pairs saw is dropped. Returns (depth, effective disparity √Σ disparity² -- the
    fused ρ / σ_ρ times sigma_px, the confidence's measure)."""
    if len(pairs) == 1:
        d, disp = pairs[0]
        return d.astype(np.float32), np.where(d > 0, disp, 0.0).astype(np.float32)
    ds = np.stack([p[0] for p in pairs]).astype(np.float64)
    disp = np.stack([p[1] for p in pairs]).astype(np.float64)
    ok = (ds > 0) & (disp > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(ok, 1.0 / ds, 0.0)
        sig = np.where(ok, sigma_px * rho / np.where(ok, disp, 1.0), np.inf)
        w = np.where(ok, 1.0 / sig ** 2, 0.0)
    wsum = w.sum(0)
    fused = np.where(wsum > 0, (w * rho).sum(0) / np.maximum(wsum, 1e-300), 0.0)
    sig_f = np.where(wsum > 0, 1.0 / np.sqrt(np.maximum(wsum, 1e-300)), np.inf)
    n = ok.sum(0)
    tol = np.maximum(agree * fused, k_sigma * np.sqrt(np.where(ok, sig, 0.0) ** 2 + np.where(wsum > 0, sig_f, 0.0) ** 2))
    agrees = (~ok | (np.abs(rho - fused) <= tol)).all(0)
    keep = (n >= 2) & agrees
    depth = np.where(keep, 1.0 / np.maximum(fused, 1e-300), 0.0)
    deff = np.where(keep, np.sqrt((np.where(ok, disp, 0.0) ** 2).sum(0)), 0.0)
    return depth.astype(np.float32), deff.astype(np.float32)


def choose_sweep_neighbours(ref: DepthView, candidates: list, median_depth: float, k: int = 2,
                            target_ratio: float = 0.1, min_ratio: float = 0.03, max_ratio: float = 0.4) -> list:
    """Neighbours for the plane sweep: any baseline direction (forward motion included)."""
    Rr = ref.c2w[:3, :3].T
    scored = []
    for c in candidates:
        if c.fid == ref.fid:
            continue
        ratio = np.linalg.norm(c.c2w[:3, 3] - ref.c2w[:3, 3]) / max(median_depth, 1e-9)
        rel = Rr @ c.c2w[:3, :3]
        angle = np.degrees(np.arccos(np.clip((np.trace(rel) - 1) / 2, -1, 1)))
        if not (min_ratio <= ratio <= max_ratio) or angle > 25:
            continue
        scored.append((abs(np.log(ratio / target_ratio)), c))
    scored.sort(key=lambda s: s[0])
    return [c for _, c in scored[:k]]


def sweep_depth(ref: DepthView, neighbours: list, K: np.ndarray, sparse_z: np.ndarray, planes: int = 32,
                win: int = 7, min_score: float = 0.8, min_texture: float = 4.0):
    """Plane-sweep depth for `ref` against any-direction neighbours: fronto-parallel planes at
    uniform inverse depth over the sparse map's range, ZNCC over win×win windows averaged over
    the neighbours, winner-take-all with a parabolic refinement. Returns (depth, score) with 0
    where the match is weak, ambiguous or untextured."""
    h, w = ref.gray.shape
    z = sparse_z[sparse_z > 0]
    if len(z) < 5 or not neighbours:
        return None
    zlo, zhi = np.percentile(z, [2, 98])
    inv = np.linspace(1.0 / (0.6 * zlo), 1.0 / (1.6 * zhi), planes)
    Kinv = np.linalg.inv(K)
    r = ref.gray.astype(np.float32)
    box = (win, win)
    mr = cv2.blur(r, box)
    vr = np.maximum(cv2.blur(r * r, box) - mr * mr, 0)
    Rr, tr = ref.c2w[:3, :3].T, -ref.c2w[:3, :3].T @ ref.c2w[:3, 3]
    rel = []
    for nb in neighbours:
        Rn, tn = nb.c2w[:3, :3].T, -nb.c2w[:3, :3].T @ nb.c2w[:3, 3]
        R = Rn @ Rr.T
        rel.append((R, tn - R @ tr, nb.gray.astype(np.float32)))
    ones = np.ones((h, w), np.float32)
    scores = np.empty((planes, h, w), np.float32)
    n_up = np.array([0.0, 0.0, 1.0])
    for p, q in enumerate(inv):
        acc = np.zeros((h, w), np.float32)
        cnt = np.zeros((h, w), np.float32)
        for R, t, g in rel:
            H = K @ (R + np.outer(t, n_up) * q) @ Kinv        # ref pixel → neighbour pixel on the plane z = 1/q
            flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
            wimg = cv2.warpPerspective(g, H, (w, h), flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
            valid = cv2.warpPerspective(ones, H, (w, h), flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
            mw = cv2.blur(wimg, box)
            vw = np.maximum(cv2.blur(wimg * wimg, box) - mw * mw, 0)
            cross = cv2.blur(r * wimg, box) - mr * mw
            zncc = cross / np.sqrt(vr * vw + 1e-3)
            ok = valid > 0.999
            acc += np.where(ok, zncc, 0)
            cnt += ok
        scores[p] = np.where(cnt > 0, acc / np.maximum(cnt, 1), -1)
    best = scores.argmax(0)
    ii, jj = np.indices((h, w))
    s0 = scores[best, ii, jj]
    sm = scores[np.clip(best - 1, 0, planes - 1), ii, jj]
    sp = scores[np.clip(best + 1, 0, planes - 1), ii, jj]
    denom = sm - 2 * s0 + sp
    off = np.where((best > 0) & (best < planes - 1) & (denom < -1e-6), 0.5 * (sm - sp) / np.where(denom < -1e-6, denom, -1), 0)
    q = np.interp(best + off, np.arange(planes), inv)
    # ambiguity: the best score must beat everything outside its own peak by a margin
    masked = scores.copy()
    for d in (-2, -1, 0, 1, 2):
        masked[np.clip(best + d, 0, planes - 1), ii, jj] = -1
    second = masked.max(0)
    sd = np.sqrt(vr)
    good = (s0 > min_score) & (s0 - second > 0.05) & (sd >= min_texture) & (best > 0) & (best < planes - 1)
    depth = np.where(good, 1.0 / np.maximum(q, 1e-9), 0).astype(np.float32)
    return depth, np.where(good, s0, 0).astype(np.float32)


def limit_depth(depth: np.ndarray, conf: np.ndarray, sparse_z: np.ndarray, max_ratio: float):
    """Depth sanity: drop depth beyond `max_ratio` × the median depth of the keyframe's map points
    (far, low-parallax depth such as sky or a distant background draws as long streaks). Returns
    (depth, conf, fraction dropped)."""
    z = np.asarray(sparse_z, np.float64)
    z = z[np.isfinite(z) & (z > 0)]
    if depth is None or len(z) < 5:
        return depth, conf, 0.0
    far = depth > max_ratio * float(np.median(z))
    n_valid = int((depth > 0).sum())
    if not far.any():
        return depth, conf, 0.0
    depth = np.where(far, 0.0, depth).astype(np.float32)
    conf = np.where(far, 0.0, conf).astype(np.float32)
    return depth, conf, float(far.sum()) / max(n_valid, 1)
