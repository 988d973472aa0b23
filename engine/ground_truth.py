"""Ground truth beside a session: a reference trajectory (TUM, camera-to-world) matched to the
session's frames, aligned to them by Sim(3) (engine.metrics.ate: Umeyama), with each frame's
error -- what the review viewer draws over the run.

Where the reference comes from (`find_ground_truth`): a session made by `reconstudio eval
--session-dir` records its sequence's groundtruth.txt in config.json ("meta": "ground_truth"); a
session of a sequence folder (the shared/data layout: `SEQ/rgb/` or `SEQ/video.mp4` beside
`SEQ/groundtruth.txt`) finds it there; any other TUM file can be given.

Matching (`associate`): by timestamp when the reference's times cover the session's (each frame
takes the nearest reference pose within `max_dt` seconds, as evo / the TUM tools associate);
otherwise line i belongs to frame i (the sequence layout's rule; a video or image folder's frame
times are index / fps, not the reference's clock).

The overlay is drawn in the session's world (the reference moved by the inverse of the Sim(3)
that takes the estimate onto it), and the errors are in the reference's units (metres).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from .api import EngineError
from .geometry import apply_to_points, sim3_inverse, sim3_matrix

GROUND_TRUTH_FILE = "groundtruth.txt"
MAX_DT_S = 0.02                  # timestamp association tolerance (evo's default)
MIN_MATCHED = 3                  # a Sim(3) needs at least three camera centres


class GroundTruthError(EngineError):
    """A reference trajectory that cannot be used for this session (message user-facing)."""


@dataclasses.dataclass
class GroundTruthOverlay:
    indices: np.ndarray          # [N] session frame indices with a reference pose
    reference: np.ndarray        # [N,3] reference camera centres in the session's world
    estimated: np.ndarray        # [N,3] the session's camera centres (as given)
    errors_m: np.ndarray         # [N] per-frame error after the Sim(3) alignment (reference units)
    rmse_m: float
    scale: float                 # reference units per session unit (the Sim(3) scale)
    association: str             # "timestamp" or "index"
    source: str                  # the reference file


def find_ground_truth(folder: Union[str, Path], info: Optional[dict] = None) -> Optional[Path]:
    """The reference trajectory a session names or sits beside (module docstring), or None."""
    info = info or {}
    meta = info.get("meta") or {}
    named = meta.get("ground_truth") if isinstance(meta, dict) else None
    if named and Path(named).expanduser().is_file():
        return Path(named).expanduser()
    src = info.get("source")
    if src:
        p = Path(str(src)).expanduser()
        for d in ((p, p.parent) if p.is_dir() else (p.parent,) if p.is_file() else ()):
            if (d / GROUND_TRUTH_FILE).is_file():
                return d / GROUND_TRUTH_FILE
    return None


def associate(est_ts: np.ndarray, est_idx: np.ndarray, gt_ts: np.ndarray,
              max_dt: float = MAX_DT_S) -> tuple[np.ndarray, np.ndarray, str]:
    """(positions in the estimate, lines of the reference, "timestamp" | "index") of the matched
    frames (module docstring)."""
    est_ts, est_idx, gt_ts = (np.asarray(a) for a in (est_ts, est_idx, gt_ts))
    if len(gt_ts) and len(est_ts):
        order = np.argsort(gt_ts)
        g = gt_ts[order]
        j = np.searchsorted(g, est_ts).clip(0, len(g) - 1)
        jm = (j - 1).clip(0, len(g) - 1)
        near = np.where(np.abs(g[jm] - est_ts) <= np.abs(g[j] - est_ts), jm, j)
        ok = np.abs(g[near] - est_ts) <= max_dt
        if ok.sum() >= max(MIN_MATCHED, len(est_ts) // 2):
            return np.flatnonzero(ok), order[near[ok]], "timestamp"
    ok = (est_idx >= 0) & (est_idx < len(gt_ts))
    return np.flatnonzero(ok), est_idx[ok].astype(np.int64), "index"


def ground_truth_overlay(indices: Sequence[int], timestamps: Sequence[float], c2w: np.ndarray,
                         reference: Union[str, Path, tuple]) -> GroundTruthOverlay:
    """The overlay of the session poses (`indices`, `timestamps`, camera-to-world `c2w` [N,4,4],
    re-aligned as drawn) against `reference`: a TUM file or (timestamps [M], c2w [M,4,4])."""
    from .io.export import TrajectoryError, read_tum
    from .metrics import ate

    source = ""
    if isinstance(reference, (str, Path)):
        source = str(reference)
        try:
            gt_ts, gt = read_tum(reference)
        except (OSError, UnicodeDecodeError) as exc:
            raise GroundTruthError(f"cannot read the reference trajectory {reference}: {exc}") from None
        except TrajectoryError as exc:
            raise GroundTruthError(str(exc)) from None
    else:
        gt_ts, gt = (np.asarray(a, np.float64) for a in reference)
    idx = np.asarray(indices, np.int64)
    est = np.asarray(c2w, np.float64).reshape(-1, 4, 4)
    pos, lines, how = associate(np.asarray(timestamps, np.float64), idx, gt_ts)
    if len(pos) < MIN_MATCHED:
        raise GroundTruthError(f"the reference {source or 'trajectory'} matches {len(pos)} of the session's "
                               f"{len(idx)} frames (by time and by line number); it needs {MIN_MATCHED}")
    a = ate(est[pos], gt[lines])
    # the reference in the session's world: the inverse of the estimate -> reference similarity
    S_inv = sim3_inverse(sim3_matrix(a["scale"], a["R"], a["t"]))
    return GroundTruthOverlay(indices=idx[pos], reference=apply_to_points(S_inv, gt[lines, :3, 3]),
                              estimated=est[pos, :3, 3].copy(), errors_m=np.asarray(a["errors"], np.float64),
                              rmse_m=float(a["rmse"]), scale=float(a["scale"]), association=how, source=source)


def error_colors(errors: np.ndarray, max_error: Optional[float] = None) -> np.ndarray:
    """[N,3] uint8 colours of per-frame errors: green (0) -> yellow -> red (>= max_error, default
    the largest error)."""
    e = np.asarray(errors, np.float64)
    top = float(max_error) if max_error else (float(e.max()) if len(e) and e.max() > 0 else 1.0)
    t = np.clip(e / top, 0.0, 1.0)
    r = np.clip(2.0 * t, 0.0, 1.0)
    g = np.clip(2.0 * (1.0 - t), 0.0, 1.0)
    return (np.stack([r, g, np.zeros_like(t)], 1) * 255).round().astype(np.uint8)
