"""Run a sequence with ground truth through any engine and score it.

Sequence layout (../shared/data/README.md): `rgb/*.jpg|png` frames in capture order,
`groundtruth.txt` (TUM, camera-to-world, line i = frame i), `intrinsics.txt`, optional
`depth/*.png` (16-bit millimetres, 0 = none). The depth camera's intrinsics come from
`depth_intrinsics.txt` if present, else from a comment like "the depth camera is fx fy cx cy" in
intrinsics.txt, else the colour intrinsics (depth registered to colour).

Re-alignment events ("realign", whole segments or frame ranges) are applied first. Metrics: ATE
RMSE after Sim(3) alignment over all posed frames (and per segment, each aligned on its own; and
before the engine's corrections when it sent any), RPE per second, scale drift per 100 frames
(`metrics.scale_drift`, in the largest segment), loops closed / segments relocalised (from the
engine's stats), coverage, and for keyframes with depth AbsRel / δ<1.25 after one median scale
for the sequence.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np

from .api import EngineError, SessionConfig, open_session
from .intrinsics import Intrinsics, read_intrinsics
from .io.export import TrajectoryError, export_tum, read_tum
from .metrics import ate, coverage, depth_metrics, rpe, scale_drift
from .run_driver import CallbackSink, CollectSink, RunDriver, SequenceSource

__all__ = ["SequenceError", "Sequence", "load_sequence", "evaluate_sequence", "format_report"]

IMAGE_EXT = (".jpg", ".jpeg", ".png")


class SequenceError(EngineError):
    """A sequence folder that cannot be evaluated (message is user-facing)."""


@dataclass
class Sequence:
    root: Path
    frames: list
    timestamps: np.ndarray
    gt_c2w: np.ndarray
    intrinsics: Optional[Intrinsics]
    depth_files: dict = field(default_factory=dict)   # frame index → depth png
    depth_intrinsics: Optional[Intrinsics] = None

    def __len__(self):
        return len(self.frames)


def _depth_intrinsics(root: Path) -> Optional[Intrinsics]:
    f = root / "depth_intrinsics.txt"
    if f.is_file():
        return read_intrinsics(f)
    f = root / "intrinsics.txt"
    if f.is_file():
        m = re.search(r"depth camera is\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", f.read_text())
        if m:
            fx, fy, cx, cy = (float(v) for v in m.groups())
            return Intrinsics(fx, fy, cx, cy, int(round(2 * cx)), int(round(2 * cy)))
    return None


def load_sequence(path: Union[str, Path]) -> Sequence:
    root = Path(path)
    if not root.is_dir():
        raise SequenceError(f"sequence folder not found: {root}")
    img_dir = root / "rgb" if (root / "rgb").is_dir() else root
    frames = sorted(p for p in img_dir.iterdir() if p.suffix.lower() in IMAGE_EXT)
    if not frames:
        raise SequenceError(f"no images (jpg/png) in {img_dir}")
    gt_file = root / "groundtruth.txt"
    if not gt_file.is_file():
        raise SequenceError(f"{root} has no groundtruth.txt (TUM format, one line per frame)")
    try:
        ts, gt = read_tum(gt_file)
    except TrajectoryError as exc:
        raise SequenceError(str(exc)) from None
    if len(gt) < len(frames):
        raise SequenceError(f"groundtruth.txt has {len(gt)} poses for {len(frames)} frames; "
                            "line i must belong to frame i")
    intr = read_intrinsics(root / "intrinsics.txt") if (root / "intrinsics.txt").is_file() else None
    depth = {}
    if (root / "depth").is_dir():
        by_stem = {p.stem: p for p in (root / "depth").glob("*.png")}
        depth = {i: by_stem[f.stem] for i, f in enumerate(frames) if f.stem in by_stem}
    return Sequence(root, frames, ts[:len(frames)], gt[:len(frames)], intr, depth,
                    _depth_intrinsics(root) if depth else None)


def _gt_depth_on_grid(gt_mm: np.ndarray, K_gt: np.ndarray, K_res: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Ground-truth depth (metres) sampled on the result grid, assuming both cameras share
    their centre and axes (depth registered to colour up to the intrinsics)."""
    import cv2
    w, h = size
    uu, vv = np.meshgrid(np.arange(w, dtype=np.float64), np.arange(h, dtype=np.float64))
    rays = np.stack([uu, vv, np.ones_like(uu)], -1) @ np.linalg.inv(K_res).T
    pix = rays @ K_gt.T
    mx = (pix[..., 0] / pix[..., 2]).astype(np.float32)
    my = (pix[..., 1] / pix[..., 2]).astype(np.float32)
    d = gt_mm.astype(np.float32) / 1000.0
    return cv2.remap(d, mx, my, cv2.INTER_NEAREST, borderMode=cv2.BORDER_CONSTANT, borderValue=0)


def evaluate_sequence(seq_dir, config: Optional[SessionConfig] = None, *, engine: Optional[str] = None,
                      max_frames: Optional[int] = None, trajectory: Optional[Union[str, Path]] = None,
                      model=None, progress: Optional[Callable[[int, int], None]] = None,
                      keep_results: bool = False, session_dir: Optional[Union[str, Path]] = None,
                      use_intrinsics: bool = True) -> dict:
    """Push every frame of `seq_dir` through a session and compute the metrics. The session uses
    the sequence's intrinsics unless `config.intrinsics` is set; `use_intrinsics=False` ignores
    them (and any intrinsics file) so the engine self-calibrates, and the report compares its focal
    length with the sequence's. `session_dir`: also store the run there (a session the viewer
    reopens, its ground truth named in config.json so the review shows it beside the run:
    engine/ground_truth.py). Returns a JSON-friendly dict."""
    import cv2
    seq = load_sequence(seq_dir)
    cfg = SessionConfig(**{**(config.to_dict() if config else {})})
    if engine:
        cfg.engine = engine
    if not use_intrinsics:
        cfg.intrinsics, cfg.intrinsics_file = None, None
    elif cfg.intrinsics is None and seq.intrinsics is not None:
        cfg.intrinsics = seq.intrinsics.as_tuple()
    n = len(seq) if not max_frames else min(len(seq), int(max_frames))
    if n < 3:
        raise SequenceError(f"need at least 3 frames to evaluate, got {n}")
    session = open_session(cfg, model=model)

    def load(path):
        bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if bgr is None:
            raise SequenceError(f"cannot read image {path}")
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)

    # the one run loop (engine.run_driver): frames decoded as the engine takes them, never dropped
    collect = CollectSink()
    sinks = [collect] + ([CallbackSink(stats=lambda st: progress(st["frames_in"], n))] if progress else [])
    if session_dir:
        from .io.store import SessionStore
        from .run_driver import StoreSink
        try:
            store = SessionStore(session_dir, cfg, str(seq.root), background=True,
                                 meta={"kind": "sequence", "frames": n,
                                       "ground_truth": str((seq.root / "groundtruth.txt").resolve())})
        except BaseException:
            session.close()
            raise
        sinks.append(StoreSink(store))
    driver = RunDriver(SequenceSource(seq.frames[:n], seq.timestamps[:n], load=load, name=seq.root.name),
                       session, sinks, stats_hz=10.0 if progress else 0.0)
    try:
        summary = driver.run()
    finally:
        session.close()
    results, events = collect.results, collect.events
    wall, stats = summary.wall_s, summary.stats
    results.sort(key=lambda r: r.index)
    raw_results = None
    if any(e.kind == "realign" for e in events):
        # windowed / loop-closing engines move segments (or stretches of frames) after the fact
        from .geometry import apply_realignments
        raw_results = results
        results = sorted(apply_realignments(results, events), key=lambda r: r.index)
    report = {
        "sequence": seq.root.name, "engine": cfg.engine, "frames": n, "posed": len(results),
        "coverage": coverage(len(results), n), "keyframes": sum(1 for r in results if r.is_keyframe),
        "segments": len({r.segment for r in results}), "wall_s": wall, "fps_wall": n / wall if wall > 0 else None,
        "segment_events": [e.message for e in events if e.kind == "segment"],
        "stats": {k: v for k, v in stats.items() if isinstance(v, (int, float, str, type(None)))},
        # loop closure / relocalisation (engines that report them in stats, e.g. geometric)
        "loops_closed": stats.get("loops_closed"), "loops_consistent": stats.get("loops_consistent"),
        "segments_relocalised": stats.get("segments_relocalised"),
        "realign_events": sum(1 for e in events if e.kind == "realign"),
        "intrinsics_used": use_intrinsics,
    }
    # focal length in use (engines that report it), against the sequence's at the same resolution
    if stats.get("focal_px") is not None:
        report["focal_px"] = stats["focal_px"]
        report["focal_sigma_px"] = stats.get("focal_sigma_px")
        report["focal_source"] = stats.get("focal_source")
        if seq.intrinsics is not None and results:
            h, w = results[0].image.shape[:2]
            si = seq.intrinsics.scaled_to(w, h)
            report["focal_true_px"] = 0.5 * (si.fx + si.fy)
            report["focal_error"] = stats["focal_px"] / report["focal_true_px"] - 1.0
    if trajectory:
        export_tum(trajectory, results)
        report["trajectory"] = str(trajectory)
    if len(results) >= 3:
        idx = np.array([r.index for r in results])
        est = np.array([r.c2w for r in results])
        gt = seq.gt_c2w[idx]
        a = ate(est, gt)
        report["ate_rmse_m"] = a["rmse"]
        report["ate_max_m"] = a["max"]
        report["sim3_scale"] = a["scale"]
        # per segment (each aligned on its own), frame-weighted RMS
        segs = np.array([r.segment for r in results])
        sq, cnt = 0.0, 0
        for s in np.unique(segs):
            m = segs == s
            if m.sum() >= 3:
                sq += ate(est[m], gt[m])["rmse"] ** 2 * m.sum()
                cnt += int(m.sum())
        report["ate_rmse_segments_m"] = float(np.sqrt(sq / cnt)) if cnt else None
        # RPE within the largest segment (relative motion across a break is meaningless)
        big = np.bincount(segs - segs.min()).argmax() + segs.min()
        m = segs == big
        if m.sum() >= 3:
            sc = ate(est[m], gt[m])["scale"]
            r = rpe(est[m], gt[m], seq.timestamps[idx[m]], delta_s=1.0, scale=sc)
            report["rpe_trans_m_per_s"] = r["trans_rmse_per_s"]
            report["rpe_rot_deg_per_s"] = r["rot_rmse_deg_per_s"]
            # scale drift: Sim(3) scale of each 100-frame window of that segment, on its own
            sd = scale_drift(est[m], gt[m], window=100)
            report["scale_drift_rms_per_100"] = sd["drift_rms"]
            report["scale_drift_max_per_100"] = sd["drift_max"]
            report["scale_range"] = sd["range"]
            report["scale_windows"] = sd["windows"]
        if raw_results is not None and len(raw_results) >= 3:
            # the trajectory as the engine first produced it, before its corrections
            ridx = np.array([r.index for r in raw_results])
            report["ate_raw_rmse_m"] = ate(np.array([r.c2w for r in raw_results]), seq.gt_c2w[ridx])["rmse"]
    else:
        report["ate_rmse_m"] = None
    # keyframe depth against ground truth
    if seq.depth_files:
        preds, gts = [], []
        K_gt = (seq.depth_intrinsics or seq.intrinsics)
        for r in results:
            if r.depth is None or r.index not in seq.depth_files:
                continue
            g = cv2.imread(str(seq.depth_files[r.index]), cv2.IMREAD_UNCHANGED)
            if g is None:
                continue
            Kg = K_gt.scaled_to(g.shape[1], g.shape[0]).matrix() if K_gt else r.K
            gts.append(_gt_depth_on_grid(g, Kg, r.K, (r.depth.shape[1], r.depth.shape[0])))
            preds.append(r.depth)
        if preds:
            d = depth_metrics(preds, gts)
            report["depth_abs_rel"] = d["abs_rel"]
            report["depth_delta1"] = d["delta1"]
            report["depth_frames"] = len(preds)
            report["depth_pixels"] = d["pixels"]
            report["depth_density"] = float(np.mean([np.mean(p > 0) for p in preds]))
    if keep_results:
        report["_results"] = results
    return report


def format_report(rep: dict) -> str:
    def f(v, unit="", scale=1.0, fmt="{:.3f}"):
        return "n/a" if v is None else fmt.format(v * scale) + unit
    lines = [
        f"sequence   {rep['sequence']}  (engine {rep['engine']}, {rep['frames']} frames)",
        f"coverage   {rep['posed']}/{rep['frames']} frames posed ({100 * rep['coverage']:.1f}%), "
        f"{rep['keyframes']} keyframes, {rep['segments']} segment(s)",
        f"ATE RMSE   {f(rep.get('ate_rmse_m'), ' cm', 100, '{:.2f}')} after Sim(3) alignment"
        + (f"  (per segment {f(rep.get('ate_rmse_segments_m'), ' cm', 100, '{:.2f}')})" if rep['segments'] > 1 else ""),
        f"RPE        {f(rep.get('rpe_trans_m_per_s'), ' m/s')} translation, "
        f"{f(rep.get('rpe_rot_deg_per_s'), ' deg/s', fmt='{:.2f}')} rotation",
    ]
    if rep.get("scale_drift_rms_per_100") is not None:
        lines.append(f"scale      drift {f(rep['scale_drift_rms_per_100'], ' %', 100, '{:.1f}')} per 100 frames "
                     f"(RMS; max {f(rep['scale_drift_max_per_100'], ' %', 100, '{:.1f}')}), window scales "
                     f"within x{f(rep.get('scale_range'), fmt='{:.3f}')} over {rep['scale_windows']} windows")
    if rep.get("loops_closed") is not None or rep.get("ate_raw_rmse_m") is not None:
        parts = []
        if rep.get("loops_closed") is not None:
            parts.append(f"{rep['loops_closed']} closed" + (f" ({rep['loops_consistent']} more found that the map "
                                                            "already agreed with)" if rep.get("loops_consistent") else ""))
        if rep.get("segments_relocalised"):
            parts.append(f"{rep['segments_relocalised']} segment(s) relocalised")
        if rep.get("ate_raw_rmse_m") is not None:
            parts.append(f"ATE before corrections {f(rep['ate_raw_rmse_m'], ' cm', 100, '{:.2f}')}")
        lines.append("loops      " + ", ".join(parts))
    if rep.get("focal_px") is not None:
        line = f"focal      {rep['focal_px']:.1f} px ({rep.get('focal_source')})"
        if rep.get("focal_sigma_px") is not None:
            line += f" ± {rep['focal_sigma_px']:.1f}"
        if rep.get("focal_true_px") is not None:
            line += f"; sequence's intrinsics {rep['focal_true_px']:.1f} px ({100 * rep['focal_error']:+.1f} %)"
        lines.append(line)
    if "depth_abs_rel" in rep:
        lines.append(f"depth      AbsRel {f(rep['depth_abs_rel'])}, delta<1.25 {f(rep['depth_delta1'])} "
                     f"over {rep['depth_frames']} keyframes ({100 * rep['depth_density']:.0f}% of pixels have depth)")
    lines.append(f"speed      {f(rep.get('fps_wall'), ' FPS', fmt='{:.1f}')} wall clock (reading frames included)")
    for m in rep.get("segment_events", []):
        lines.append(f"segment    {m}")
    if rep.get("trajectory"):
        lines.append(f"trajectory {rep['trajectory']}")
    return "\n".join(lines)
