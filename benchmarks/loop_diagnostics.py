"""Why do loops (not) close on a sequence, and are the loops found real? Runs the geometric engine
over SEQ (the sequence layout of ../shared/data: rgb/*, intrinsics.txt, groundtruth.txt) and
counts, for every place-recognition query, the candidates and the verifications that passed (by
map-point descriptors or by optical flow), then scores them against the ground truth:

- two keyframes *overlap* when at least `--overlap` of a grid of the query's pixels, put at
  `--scene-depth` metres and moved by the ground-truth poses, land inside the other keyframe's
  image, and their optical axes are within `--overlap-deg` degrees;
- a query is a *revisit* when some keyframe at least `min_gap` keyframes older overlaps it;
- candidate recall: revisits with an overlapping keyframe among the candidates proposed;
- loop recall: revisits with a verified match that overlaps; precision: verified matches that
  overlap (a verified match that does not is a false loop);
- far revisits: the same for queries whose overlapping keyframes are `--far` frames older or more
  (the camera came back after a long way round), and whether any verified match reaches the first
  keyframes (`--first` frames), with every verification tried against them;
- the verified loop transforms against the ground truth: rotation error, translation error (in
  metres of the candidate's local map scale) and scale against the ratio of the two keyframes'
  local map scales (produced poses over ground truth 5-25 frames around each; a rough reference
  where scale drifts within that span), per verification kind.

Usage: python benchmarks/loop_diagnostics.py SEQ [--frames N] [--no-flow] [--set KEY=VALUE ...]
(docs/benchmarks_geometric.md, "Place recognition that finds real revisits")
"""
import argparse
import collections
import glob
import json
import os
import sys

import cv2
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import SessionConfig, open_session  # noqa: E402
from engine.geometric import loop as loop_mod  # noqa: E402
from engine.io.export import read_tum  # noqa: E402


def _parse_set(items):
    out = {}
    for it in items or []:
        k, _, v = it.partition("=")
        out[k] = v
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("seq")
    ap.add_argument("--frames", type=int, default=100000)
    ap.add_argument("--no-flow", action="store_true", help="descriptor verification only (loop_flow_verify off)")
    ap.add_argument("--overlap", type=float, default=0.5, help="ground-truth overlap: share of the view seen by both")
    ap.add_argument("--scene-depth", type=float, default=2.0, help="... with the scene at this depth (m)")
    ap.add_argument("--overlap-deg", type=float, default=45.0, help="... and optical axes within this (deg)")
    ap.add_argument("--far", type=int, default=300, help="a far revisit: overlapping keyframes this many frames older")
    ap.add_argument("--first", type=int, default=100, help="the first keyframes: frames before this")
    ap.add_argument("--set", action="append", help="SessionConfig.extra KEY=VALUE (e.g. loop_min_gap=10)")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    stats = collections.Counter()
    pairs_checked = []          # (query fid, candidate fid, kind, passed)
    matches = {}                # query fid -> (matched fid, inliers, S, same segment) of _best_match
    best_match, verify, verify_flow, verify_kp = (loop_mod.LoopCloser._best_match, loop_mod.LoopCloser._verify,
                                                  loop_mod.LoopCloser._verify_flow, loop_mod.LoopCloser._verify_keypoints)
    kind_of = {}                # (query fid, candidate fid) -> the verification that passed last

    def counted_best_match(self, node, fids, ref, **kw):
        res = best_match(self, node, fids, ref, **kw)
        if fids:
            stats["queries"] += 1
            stats["queries verified"] += res is not None
            if res is not None:
                matches[node.fid] = (res[0].fid, res[1], res[2], kw.get("near", False))
        return res

    def counted_verify(self, q, c):
        res = verify(self, q, c)
        pairs_checked.append((q.fid, c.fid, "descriptors", res is not None))
        if res is not None:
            kind_of[(q.fid, c.fid)] = "descriptors"
        if q.a_desc is not None and c.a_desc is not None and len(q.a_desc) >= 2 and len(c.a_desc) >= 2:
            knn = cv2.BFMatcher(cv2.NORM_HAMMING).knnMatch(q.a_desc, c.a_desc, k=2)
            n = sum(1 for m in knn if len(m) == 2 and m[0].distance < 0.8 * m[1].distance and m[0].distance < 64)
            stats["descriptor pairs (sum)"] += n
        return res

    def counted_verify_flow(self, q, c):
        res = verify_flow(self, q, c)
        pairs_checked.append((q.fid, c.fid, "flow", res is not None))
        if res is not None:
            kind_of[(q.fid, c.fid)] = "flow"
        return res

    def counted_verify_kp(self, q, c):
        res = verify_kp(self, q, c)
        pairs_checked.append((q.fid, c.fid, "keypoints", res is not None))
        if res is not None:
            kind_of[(q.fid, c.fid)] = "keypoints"
        return res

    loop_mod.LoopCloser._verify_keypoints = counted_verify_kp
    loop_mod.LoopCloser._best_match = counted_best_match
    loop_mod.LoopCloser._verify = counted_verify
    loop_mod.LoopCloser._verify_flow = counted_verify_flow
    lines = [ln for ln in open(f"{a.seq}/intrinsics.txt").read().splitlines() if ln.strip() and not ln.startswith("#")]
    cfg = SessionConfig(engine="geometric", depth=False, loop_flow_verify=not a.no_flow,
                        intrinsics=[float(x) for x in lines[0].split()], extra=_parse_set(a.set))
    s = open_session(cfg)
    files = sorted(f for f in glob.glob(f"{a.seq}/rgb/*") if f.lower().endswith((".jpg", ".jpeg", ".png")))[:a.frames]
    keyframes = []
    produced = {}               # frame -> c2w as first produced (the loop transforms' local scale)
    for f in files:
        img = cv2.cvtColor(cv2.imread(f, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        for r in s.push(img):
            produced.setdefault(r.index, r.c2w)
            if r.is_keyframe:
                keyframes.append(r.index)
    for r in s.flush():
        produced.setdefault(r.index, r.c2w)
        if r.is_keyframe:
            keyframes.append(r.index)
    lc = s._loop
    st = s.stats()
    closed = [(sol.query_fid, sol.match_fid, sol.inliers, round(float(sol.scale), 3)) for sol in lc.loops]
    out = {k: int(v) for k, v in stats.items()}
    out.update({"keyframes": len(keyframes), "verified by descriptors": lc.verified_descriptors,
                "verified by optical flow": lc.verified_flow,
                "verified by keypoints": lc.verified_keypoints, "flow verifications tried": lc.flow_attempts})
    for k in ("loops_closed", "loops_consistent", "loops_rejected", "loop_cpu_ms", "segments"):
        out[k] = st.get(k) or 0
    s.close()

    # --- against the ground truth ------------------------------------------------------------
    _, gt = read_tum(f"{a.seq}/groundtruth.txt")
    kf = sorted(set(keyframes))
    order = {f: i for i, f in enumerate(kf)}
    T = np.array([gt[f] for f in kf])
    min_gap = loop_mod.LoopParams().min_gap
    cos_lim = np.cos(np.radians(a.overlap_deg))
    fx, fy, cx, cy, w, h = [float(x) for x in lines[0].split()[:6]]
    gu, gv = np.meshgrid(np.linspace(0.05, 0.95, 8) * w, np.linspace(0.05, 0.95, 6) * h)
    ray = np.stack([(gu.ravel() - cx) / fx, (gv.ravel() - cy) / fy, np.ones(gu.size)], 1) * a.scene_depth

    def overlaps(i, j):
        if float(T[i][:3, 2] @ T[j][:3, 2]) <= cos_lim:
            return False
        X = (ray @ T[i][:3, :3].T + T[i][:3, 3] - T[j][:3, 3]) @ T[j][:3, :3]
        z = np.maximum(X[:, 2], 1e-6)
        u, v = fx * X[:, 0] / z + cx, fy * X[:, 1] / z + cy
        return float(np.mean((X[:, 2] > 0.05) & (u >= 0) & (u < w) & (v >= 0) & (v < h))) >= a.overlap

    revisit, far = {}, {}
    for q in kf:
        i = order[q]
        ov = [kf[j] for j in range(max(0, i - min_gap)) if overlaps(i, j)]
        if ov:
            revisit[q] = ov
            fo = [f for f in ov if q - f >= a.far]
            if fo:
                far[q] = fo
    cands = collections.defaultdict(set)
    for qf, cf, _kind, _ok in pairs_checked:
        cands[qf].add(cf)

    def is_true(q, c):
        return q in order and c in order and overlaps(order[q], order[c])

    def rate(sel):
        n = len(sel)
        cand = sum(1 for q in sel if any(is_true(q, c) for c in cands.get(q, ())))
        found = sum(1 for q in sel if q in matches and is_true(q, matches[q][0]))
        return n, cand, found

    n, cand, found = rate(revisit)
    nf, candf, foundf = rate(far)
    verified = [(q, m[0]) for q, m in matches.items()]
    true_v = sum(1 for q, c in verified if is_true(q, c))
    first = [(q, c) for q, c in verified if c < a.first and q - c >= a.far]
    out.update({
        "revisit queries (ground truth)": n, "revisits with a true candidate": cand,
        "revisits with a verified true match": found,
        "far revisits (ground truth)": nf, "far revisits with a true candidate": candf,
        "far revisits with a verified true match": foundf,
        "verified matches": len(verified), "verified matches that overlap": true_v,
        "precision": round(true_v / len(verified), 3) if verified else None,
        "recall": round(found / n, 3) if n else None,
        "far recall": round(foundf / nf, 3) if nf else None,
        "matches to the first keyframes": sorted(first)[:20],
        "checks against the first keyframes (query, candidate, verification, passed)": sorted(
            (q, c, k, ok) for q, c, k, ok in pairs_checked if c < a.first and q - c >= a.far)[:40],
        "false matches": sorted((q, c) for q, c in verified if not is_true(q, c))[:20],
        "loops closed (query, match, inliers, scale; latest 20)": closed,
    })
    detail, med = _transform_errors(matches, kind_of, produced, gt, is_true)
    out["loop transform error (kind: median rot deg, trans cm, |log scale|, n)"] = med
    out["loop transforms (query, match, kind, rot err deg, trans err cm, scale, local scale ratio, baseline cm)"] = detail
    for k, v in out.items():
        print(f"{k}: {v}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


def _local_scale(produced, gt, f, span=(5, 25)):
    """Map units per metre around frame f: the produced poses' distances to frames 5-25 away
    over the ground truth's (median; None where the camera hardly moved; within the loop answers'
    lag, so mostly in one world)."""
    r = []
    for g in list(range(f - span[1], f - span[0] + 1)) + list(range(f + span[0], f + span[1] + 1)):
        if g in produced and f in produced and 0 <= g < len(gt) and 0 <= f < len(gt):
            dg = np.linalg.norm(gt[g][:3, 3] - gt[f][:3, 3])
            if dg > 0.05:
                r.append(np.linalg.norm(produced[g][:3, 3] - produced[f][:3, 3]) / dg)
    return float(np.median(r)) if len(r) >= 5 else None


def _transform_errors(matches, kind_of, produced, gt, is_true):
    """Error of the verified loop transforms (query camera -> candidate camera, map units) against
    the ground truth, with the map's local scale at both keyframes: rotation (deg), translation
    (cm, in metres of the candidate's scale) and |log scale| (the loop's scale against the ratio of
    the local scales), medians per verification kind and same-segment (near) or not, true matches only."""
    from engine.align import sim3_split
    rows = collections.defaultdict(list)
    detail = []
    for q, (c, _n, S, near) in sorted(matches.items()):
        if not is_true(q, c):
            continue
        lq, lc = _local_scale(produced, gt, q), _local_scale(produced, gt, c)
        if lq is None or lc is None:
            continue
        s, R, t = sim3_split(S)
        Rg = gt[c][:3, :3].T @ gt[q][:3, :3]
        tg = gt[c][:3, :3].T @ (gt[q][:3, 3] - gt[c][:3, 3])
        rot = float(np.degrees(np.arccos(np.clip((np.trace(R.T @ Rg) - 1) / 2, -1, 1))))
        trans = 100 * float(np.linalg.norm(t / lc - tg))
        kind = kind_of.get((q, c), "?")
        rows[(kind, bool(near))].append((rot, trans, abs(np.log(s / (lc / lq)))))
        detail.append((q, c, kind, round(rot, 2), round(trans, 1), round(float(s), 3), round(lc / lq, 3),
                       round(100 * float(np.linalg.norm(tg)), 1)))
    return detail, {f"{k} {'loop' if nr else 'other segment'}": [round(float(x), 3) for x in np.median(v, 0)] + [len(v)]
            for (k, nr), v in sorted(rows.items())}


if __name__ == "__main__":
    main()
