"""Where does a monocular run lose its scale? Runs the geometric engine over a sequence with ground
truth (the layout of ../shared/data) and records, frame by frame, what the tracker saw and decided:
live tracks, map points among them, PnP inliers, the keyframe decision (gap, baseline over the
median scene depth, points of the last keyframe still tracked), and at each keyframe the tracks
offered for triangulation (their median parallax, how many pass min_tri_angle_deg), the net map
points added, the map points matched again (reuse) and the map's size. Prints the run's metrics,
the Sim(3) scale of each `--window`-frame window against the ground truth (1 number per window:
ground truth over estimate; a monocular run that holds its scale keeps it constant), and a
summary of the frames `--range A B`.

    python benchmarks/tracking_trace.py SEQ [--start S --end E] [--range A B] [--window 50]
        [--no-intrinsics] [--set KEY=VALUE ...] [--json OUT]

`--start/--end` run frames S..E-1 only, as a sequence of their own (a fresh start at S: a short way
to replay one stretch; the images are linked, not copied, into a temporary folder). `--range`
is in the frame numbers of the run (0 = frame S). (docs/benchmarks_geometric.md, "The scale break
in kt0 frames 900-1100, measured")
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import SessionConfig  # noqa: E402
from engine.evaluate import evaluate_sequence, load_sequence  # noqa: E402
from engine.geometric import tracker as T  # noqa: E402
from engine.metrics import umeyama  # noqa: E402


def sub_sequence(seq_dir: str, start: int, end: int, dst: str) -> str:
    """Frames start..end-1 of `seq_dir` as a sequence folder in `dst` (images linked)."""
    seq = load_sequence(seq_dir)
    end = min(end, len(seq))
    os.makedirs(os.path.join(dst, "rgb"))
    with open(os.path.join(dst, "groundtruth.txt"), "w") as f:
        f.write("# timestamp tx ty tz qx qy qz qw (camera-to-world)\n")
        lines = [ln for ln in open(os.path.join(seq_dir, "groundtruth.txt")) if not ln.startswith("#") and ln.strip()]
        for k in range(start, end):
            parts = lines[k].split()
            f.write(" ".join([f"{(k - start) / 30.0:.6f}"] + parts[1:]) + "\n")
            name = f"{k - start:06d}{seq.frames[k].suffix}"
            os.symlink(os.path.abspath(seq.frames[k]), os.path.join(dst, "rgb", name))
    intr = os.path.join(seq_dir, "intrinsics.txt")
    if os.path.isfile(intr):
        with open(intr) as src, open(os.path.join(dst, "intrinsics.txt"), "w") as out:
            out.write(src.read())
    return dst


def trace_run(seq_dir: str, settings: dict, use_intrinsics: bool = True):
    """Run the sequence with the tracker instrumented; returns (report, results, log by frame)."""
    log, cur = {}, {}
    orig = {n: getattr(T.MonoTracker, n) for n in ("_pnp", "_track", "_make_keyframe")}
    orig_tri = T.triangulate

    def pnp(self, ids, uv, guess):
        r = orig["_pnp"](self, ids, uv, guess)
        cur["known"] = sum(1 for i in ids.tolist() if i in self.points)
        cur["inliers"] = None if r is None else len(r[2])
        cur["_inl"] = set() if r is None else set(r[2].tolist())
        return r

    def track(self, fid, ids, uv, out):
        cur.clear()
        cur["tracks"] = len(ids)
        kf = self.keyframes[-1]
        cur["kf_points"] = len(kf.obs)
        orig["_track"](self, fid, ids, uv, out)
        rec = {k: v for k, v in cur.items() if not k.startswith("_")}
        rec["kf_points_tracked"] = sum(1 for i in kf.obs if i in cur.get("_inl", ()))
        rec["gap"] = fid - kf.fid
        if fid in self.poses:
            R, t = self.poses[fid]
            rec["baseline"] = float(np.linalg.norm(T.camera_center(R, t) - T.camera_center(kf.R, kf.t))
                                    / max(self.median_depth, 1e-12))
        rec["keyframe"] = bool(out.keyframe)
        rec["map_points"] = len(self.points)
        rec["median_depth"] = float(self.median_depth)
        log[fid] = rec

    def make_keyframe(self, fid, R, t, ids, uv, inl_ids, out):
        n0, r0 = len(self.points), self.reused_total
        orig["_make_keyframe"](self, fid, R, t, ids, uv, inl_ids, out)
        cur["new_points"] = len(self.points) - n0
        cur["reused"] = self.reused_total - r0

    def triangulate(*args, **kw):
        X, ang = orig_tri(*args, **kw)
        if "tracks" in cur and len(ang):
            cur["tri_candidates"] = len(ang)
            cur["tri_parallax_deg"] = float(np.median(ang))
            cur["tri_above_min"] = int((ang > 1.0).sum())
        return X, ang

    known = set(SessionConfig().to_dict())

    def typed(v):
        return v.lower() == "true" if v.lower() in ("true", "false") else v
    cfg = SessionConfig(engine="geometric", **{k: typed(v) for k, v in settings.items() if k in known},
                        extra={k: v for k, v in settings.items() if k not in known})
    T.MonoTracker._pnp, T.MonoTracker._track, T.MonoTracker._make_keyframe = pnp, track, make_keyframe
    T.triangulate = triangulate
    try:
        rep = evaluate_sequence(seq_dir, cfg, keep_results=True, use_intrinsics=use_intrinsics)
    finally:
        for n, f in orig.items():
            setattr(T.MonoTracker, n, f)
        T.triangulate = orig_tri
    return rep, rep.pop("_results"), log


def window_scales(results, gt_c2w, window: int):
    """(first frame, Sim(3) scale ground truth / estimate) of each `window` consecutive results."""
    idx = np.array([r.index for r in results])
    est = np.array([r.c2w[:3, 3] for r in results])
    gt = gt_c2w[idx][:, :3, 3]
    out = []
    for a in range(0, len(idx) - window // 2, window):
        e, g = est[a:a + window], gt[a:a + window]
        ok = len(e) >= 10 and np.linalg.norm(g - g.mean(0), axis=1).mean() > 1e-3
        out.append((int(idx[a]), float(umeyama(e, g)[0]) if ok else None))
    return out


def summary(log: dict, a: int, b: int) -> dict:
    fr = {f: r for f, r in log.items() if a <= f < b}
    if not fr:
        return {}
    kf = sorted(f for f, r in fr.items() if r["keyframe"])
    med = (lambda xs: float(np.median(xs)) if len(xs) else None)
    return {
        "frames": len(fr), "keyframes": len(kf),
        "consecutive_keyframes": sum(1 for f in kf if f - 1 in fr and fr[f - 1]["keyframe"]),
        "tracks_median": med([r["tracks"] for r in fr.values()]),
        "map_points_tracked_median": med([r.get("known", 0) for r in fr.values()]),
        "map_points_tracked_min": min(r.get("known", 0) for r in fr.values()),
        "pnp_inliers_median": med([r.get("inliers") or 0 for r in fr.values()]),
        "kf_baseline_median": med([fr[f].get("baseline", 0.0) for f in kf]),
        "kf_tri_parallax_median_deg": med([fr[f]["tri_parallax_deg"] for f in kf if "tri_parallax_deg" in fr[f]]),
        "kf_tri_above_min_median": med([fr[f].get("tri_above_min", 0) for f in kf]),
        "net_new_points": int(sum(fr[f].get("new_points", 0) for f in kf)),
        "reused_points": int(sum(fr[f].get("reused", 0) for f in kf)),
        "map_points_first_min": (fr[min(fr)]["map_points"], min(r["map_points"] for r in fr.values())),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seq")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--end", type=int, default=0, help="0 = to the end")
    ap.add_argument("--range", type=int, nargs=2, action="append", default=[], metavar=("A", "B"))
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--no-intrinsics", action="store_true")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE: SessionConfig field or extra (tracker_...)")
    ap.add_argument("--json", help="write the report, the window scales and the per-frame log here")
    a = ap.parse_args()
    settings = dict(s.partition("=")[::2] for s in a.set)
    with tempfile.TemporaryDirectory() as tmp:
        seq_dir = a.seq
        if a.start or a.end:
            seq_dir = sub_sequence(a.seq, a.start, a.end or 10 ** 9, os.path.join(tmp, "seq"))
        t0 = time.time()
        rep, results, log = trace_run(seq_dir, settings, use_intrinsics=not a.no_intrinsics)
        wall = time.time() - t0
        gt = load_sequence(seq_dir).gt_c2w
    wins = window_scales(results, gt, a.window)
    keys = ("ate_rmse_m", "ate_raw_rmse_m", "keyframes", "segments", "loops_closed", "scale_range",
            "scale_drift_rms_per_100", "focal_px")
    print(json.dumps({k: rep.get(k) for k in keys}), f"wall {wall:.0f} s")
    print(f"scale of {a.window}-frame windows:", " ".join(f"{f}:{s:.2f}" if s else f"{f}:-" for f, s in wins))
    for lo, hi in a.range:
        print(f"frames {lo}-{hi}:", json.dumps(summary(log, lo, hi)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"report": {k: v for k, v in rep.items() if isinstance(v, (int, float, str, type(None)))},
                       "windows": wins, "log": {str(k): v for k, v in log.items()}}, f)


if __name__ == "__main__":
    main()
