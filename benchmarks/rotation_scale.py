"""Scale through a rotation-dominated stretch (issue #27 item 1), on a synthetic scene with
known geometry, through the geometric tracker alone (no images, deterministic).

The camera walks sideways, then turns on the spot (a pan at `pan_deg_s` with only `slow_m_s` of
translation), then walks again. Feature tracks behave like KLT tracks: they live 8-30 frames,
die when they leave the view, and new corners are detected when the tracker asks for them. The
figure is the scale ratio of the walk after the turn against the walk before it (each stretch
aligned to the ground truth by its own Sim(3)): 1.0 = the turn kept the scale.

    python -m benchmarks.rotation_scale [--seeds 0 1 2 3] [--pan 30] [--slow 0.04] [--set reuse_points=false] [--json]

The same scenario backs tests/engine/test_geometric_rotation_scale.py.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
from scipy.spatial.transform import Rotation

from engine.geometric.tracker import MonoTracker, TrackerParams
from engine.metrics import ate

K = np.array([[480.0, 0, 320], [0, 480.0, 240], [0, 0, 1]])
W, H = 640, 480


def room(seed: int, n: int = 6000) -> np.ndarray:
    """Points on the walls, floor and ceiling of a 7 × 7 × 3 m room around the origin (y down)."""
    rng = np.random.default_rng(seed)
    u = rng.uniform(-3.5, 3.5, n)
    v = rng.uniform(-1.5, 1.5, n)
    side = rng.integers(0, 6, n)
    X = np.empty((n, 3))
    for s, (a, b, c) in enumerate([(u, v, 3.5), (u, v, -3.5), (3.5, v, u), (-3.5, v, u)]):
        m = side == s
        X[m] = np.c_[np.broadcast_to(a, n)[m], np.broadcast_to(b, n)[m], np.broadcast_to(c, n)[m]]
    m = side >= 4
    X[m] = np.c_[u[m], np.where(side[m] == 4, 1.5, -1.5), rng.uniform(-3.5, 3.5, m.sum())]
    return X


def path(walk: int = 60, turn: int = 60, fps: float = 30.0, walk_m_s: float = 0.3,
         slow_m_s: float = 0.04, pan_deg_s: float = 30.0) -> tuple[np.ndarray, slice, slice, slice]:
    """Camera-to-world poses: a sideways walk, a pan (yaw at `pan_deg_s`, drifting at `slow_m_s`),
    a second sideways walk at the new heading. Returns (poses, walk 1, turn, walk 2 slices)."""
    n = 2 * walk + turn
    yaw = np.zeros(n)
    pos = np.zeros((n, 3))
    for f in range(1, n):
        turning = walk <= f < walk + turn
        yaw[f] = yaw[f - 1] + (pan_deg_s / fps if turning else 0.0)
        speed = slow_m_s if turning else walk_m_s
        # sideways in the camera's own frame (x right), a little forward
        d = Rotation.from_euler("y", yaw[f], degrees=True).apply([1.0, 0.0, 0.25])
        pos[f] = pos[f - 1] + speed / fps * d / np.linalg.norm(d)
    T = np.tile(np.eye(4), (n, 1, 1))
    pos[:, 1] = 0.03 * np.sin(np.arange(n) / 9.0)          # hand-held bob
    T[:, :3, 3] = pos + [-1.0, 0.0, -1.0]
    pitch = 3.0 * np.sin(np.arange(n) / 17.0)
    T[:, :3, :3] = Rotation.from_euler("yx", np.c_[yaw, pitch], degrees=True).as_matrix()
    return T, slice(0, walk), slice(walk, walk + turn), slice(walk + turn, n)


def simulate(params: TrackerParams | None = None, seed: int = 0, noise: float = 0.7,
             life=(8, 30), max_tracks: int = 300, **path_kw) -> dict:
    """Run the tracker over the scenario; returns figures (scale ratio, ATE, segments, CPU)."""
    rng = np.random.default_rng(seed)
    X = room(seed)
    gt, w1, _turn, w2 = path(**path_kw)
    tr = MonoTracker(K, params or TrackerParams(reuse_points=True))   # the session's default
    live: dict[int, tuple[int, int]] = {}       # physical point → (track id, frame it breaks)
    phys_of: dict[int, int] = {}
    next_id = 0
    posed = {}
    cpu = 0.0
    seen = np.zeros(len(X), bool)
    noisy = np.zeros((len(X), 2))

    def matcher(fid, R, t, ids, Xw, src_fid, src_uv, pred_uv):
        # the session's matcher finds old points again by optical flow from the keyframe image
        # that last saw them, from the 3 source keyframes with the most candidates; here: every
        # such point that is in view and not tracked already
        src, n = np.unique(src_fid, return_counts=True)
        top = set(src[np.argsort(-n, kind="stable")[:3]].tolist())
        hit = [i for i, f in zip(ids.tolist(), src_fid.tolist())
               if f in top and seen[phys_of[i]] and phys_of[i] not in live]
        return np.array(hit, np.int64), noisy[[phys_of[i] for i in hit]].reshape(-1, 2)
    tr.matcher = matcher
    for f in range(len(gt)):
        R, t = gt[f][:3, :3].T, -gt[f][:3, :3].T @ gt[f][:3, 3]
        Xc = X @ R.T + t
        uv = Xc[:, :2] / np.maximum(Xc[:, 2], 1e-9)[:, None] * [K[0, 0], K[1, 1]] + K[:2, 2]
        seen = vis = (Xc[:, 2] > 0.2) & (uv[:, 0] >= 4) & (uv[:, 0] < W - 4) & (uv[:, 1] >= 4) & (uv[:, 1] < H - 4)
        noisy = uv + rng.normal(0, noise, uv.shape)
        for ph in [ph for ph, (_, end) in live.items() if not vis[ph] or end <= f]:
            del live[ph]
        order = sorted(live)
        t0 = time.thread_time()
        step = tr.process(f, np.array([live[ph][0] for ph in order], np.int64),
                          noisy[order].reshape(-1, 2))
        cpu += time.thread_time() - t0
        if step.reset_tracks:
            live.clear()
        for i in step.drop_ids:
            ph = phys_of.get(i)
            if ph in live and live[ph][0] == i:
                del live[ph]
        if step.need_features:
            cand = np.flatnonzero(vis)
            cand = cand[~np.isin(cand, list(live))]
            new = rng.permutation(cand)[:max(max_tracks - len(live), 0)]
            ids = np.arange(next_id, next_id + len(new), dtype=np.int64)
            next_id += len(new)
            for i, ph in zip(ids.tolist(), new.tolist()):
                phys_of[i] = ph
                live[ph] = (i, f + int(rng.integers(*life)))
            t0 = time.thread_time()
            tr.add_tracks(f, ids, noisy[new].reshape(-1, 2))
            cpu += time.thread_time() - t0
        for i in step.revived_ids:      # the caller tracks a reused point on under its old id
            live[phys_of[i]] = (i, f + int(rng.integers(*life)))
        for p in step.posed:
            posed[p.fid] = p
    fids = np.array(sorted(posed))
    est = np.array([posed[f].c2w for f in fids])
    segs = {p.segment for p in posed.values()}
    out = {"seed": seed, "frames": len(gt), "posed": len(fids), "segments": len(segs),
           "keyframes_total": sum(p.is_keyframe for p in posed.values()),
           "cpu_ms_per_frame": 1000.0 * cpu / len(gt), "scale_ratio": None, "ate": None}
    if len(segs) == 1 and len(fids) == len(gt):
        s1 = ate(est[w1], gt[w1])["scale"]
        s2 = ate(est[w2], gt[w2])["scale"]
        out["scale_ratio"] = float(s2 / s1)
        out["ate"] = float(ate(est, gt)["rmse"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--pan", type=float, default=30.0, help="pan rate, degrees per second")
    ap.add_argument("--turn", type=int, default=60, help="frames of the turn")
    ap.add_argument("--slow", type=float, default=0.04, help="translation during the turn, m/s")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a TrackerParams field (e.g. reuse_points=false)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    kw = {}
    for s in a.set:
        k, v = s.split("=", 1)
        cur = getattr(TrackerParams(), k)
        kw[k] = (v.lower() in ("1", "true", "yes")) if isinstance(cur, bool) else type(cur)(v)
    rows = [simulate(TrackerParams(**{"reuse_points": True, **kw}), seed=s, pan_deg_s=a.pan, turn=a.turn, slow_m_s=a.slow) for s in a.seeds]
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            sr = "lost" if r["scale_ratio"] is None else f"{r['scale_ratio']:.3f}"
            at = "-" if r["ate"] is None else f"{100 * r['ate']:.2f} cm"
            print(f"seed {r['seed']}: scale after/before {sr}  ATE {at}  segments {r['segments']}  "
                  f"posed {r['posed']}/{r['frames']}  keyframes {r['keyframes_total']}  "
                  f"CPU {r['cpu_ms_per_frame']:.1f} ms/frame")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
