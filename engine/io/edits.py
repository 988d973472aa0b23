"""Session edits: what the reviewer did to a session (crop, outlier removal, metric scale, floor),
kept beside it in `edits.json` and applied to every export (engine/io/session_reader.py).

The session's own data (config.json, frames/, events.jsonl) is never rewritten: an edit is a
small versioned JSON record, written atomically (engine/io/atomic.py), that a reader applies on
the way out. Deleting `edits.json` (the viewer's "Reset edits") gives the raw session back.

Coordinates. Crops and picked points are in the session's world as the viewer draws it: the
engine's results with their re-alignments applied, before any edit. The edits then act in this
order:
1. crops (boxes and screen polygons; every crop must keep a point) and statistical outlier removal
   drop points -- on a FrameResult they zero the depth of the dropped pixels (0 = no depth), so
   every exporter that back-projects (PLY, NPZ, COLMAP, GLB, ...) sees the same points;
2. the floor alignment (rigid) and the metric scale form one similarity applied to points and
   cameras (engine.geometry.apply_similarity: depth is scaled with it).

Floor: the plane through three picked points becomes y = 0 with the world's "up" along -y (the
viewer's up: OpenCV's y points down), the cameras on the up side, the first point at the origin.
Scale: `length / |p1 - p0|`, so a known distance between two picked points reads `length` metres.

Outlier removal is the usual statistical filter (as Open3D's `remove_statistical_outlier`): a
point is an outlier when the mean distance to its k nearest neighbours exceeds mean + std_ratio *
std of that quantity over the cloud. The cloud here is the session's cropped points (confidence
>= `conf_threshold`) at a pixel step that keeps at most OUTLIER_REFERENCE_POINTS of them (the
statistics need the whole scene, the exports stream one frame at a time); each exported point is
tested against that reference cloud with scipy's cKDTree.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Optional, Union

import numpy as np

from ..api import EngineError
from ..geometry import affine_rows, apply_to_c2w, apply_to_points, sim3_matrix
from .atomic import atomic_open

EDITS_FILE = "edits.json"
EDITS_FORMAT = "reconstudio-edits"
EDITS_VERSION = 1
OUTLIER_REFERENCE_POINTS = 1_000_000   # points of the reference cloud the statistics use, at most
UP = np.array([0.0, -1.0, 0.0])        # the world's up after a floor alignment (viewer: up="-y")


class EditsError(EngineError):
    """An edits file that cannot be read or an edit that cannot be made (message user-facing)."""


def _vec(v, n: int, what: str) -> np.ndarray:
    a = np.asarray(v, np.float64)
    if a.size != n or not np.all(np.isfinite(a)):
        raise EditsError(f"{what}: expected {n} finite numbers, got {np.shape(a)}")
    return a.reshape(-1)


def _mat(v, shape: tuple, what: str) -> np.ndarray:
    a = np.asarray(v, np.float64)
    if a.shape != shape or not np.all(np.isfinite(a)):
        raise EditsError(f"{what}: expected a finite {shape[0]}x{shape[1]} matrix, got shape {a.shape}")
    return a


@dataclasses.dataclass
class BoxCrop:
    """An oriented box: world = rotation @ local + center, inside when |local| <= half_size on
    every axis. An axis-aligned box has the identity rotation."""
    center: np.ndarray
    half_size: np.ndarray
    rotation: np.ndarray = dataclasses.field(default_factory=lambda: np.eye(3))
    keep_inside: bool = True

    @classmethod
    def from_bounds(cls, lo, hi, rotation=None, keep_inside: bool = True) -> "BoxCrop":
        """The box [lo, hi] of the frame `rotation` (world = rotation @ local; identity = axis-aligned)."""
        lo, hi = _vec(lo, 3, "box min"), _vec(hi, 3, "box max")
        R = np.eye(3) if rotation is None else _mat(rotation, (3, 3), "box rotation")
        c_local = (lo + hi) / 2
        return cls(center=R @ c_local, half_size=np.abs(hi - lo) / 2, rotation=R, keep_inside=keep_inside)

    def inside(self, points: np.ndarray) -> np.ndarray:
        local = affine_rows(np.asarray(points, np.float64).reshape(-1, 3), self.rotation.T,
                            -(self.rotation.T @ self.center))
        return np.all(np.abs(local) <= self.half_size, axis=1)

    @classmethod
    def around(cls, points: np.ndarray, rotation=None, percentile: float = 0.5) -> "BoxCrop":
        """The box holding the points between the `percentile` and 100 - `percentile` percentiles
        on each axis of the frame `rotation` (world = rotation @ local; identity: world axes)."""
        P = np.asarray(points, np.float64).reshape(-1, 3)
        if not len(P):
            raise EditsError("no points to put a box around")
        R = np.eye(3) if rotation is None else _mat(rotation, (3, 3), "box rotation")
        local = affine_rows(P, R.T)
        lo, hi = np.percentile(local, [percentile, 100 - percentile], axis=0)
        return cls.from_bounds(lo, hi, R)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) in the box's frame (as `from_bounds` takes them)."""
        c = self.rotation.T @ self.center
        return c - self.half_size, c + self.half_size

    def corners(self) -> np.ndarray:
        """[8,3] world corners (for drawing)."""
        s = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], np.float64)
        return (s * self.half_size) @ self.rotation.T + self.center

    def edges(self) -> np.ndarray:
        """[24,3] world end points of the 12 edges (line segments, for drawing)."""
        c = self.corners()
        pairs = [(i, j) for i in range(8) for j in range(i + 1, 8) if bin(i ^ j).count("1") == 1]
        return c[np.array(pairs).reshape(-1)]

    def to_dict(self) -> dict:
        return {"kind": "box", "center": self.center.tolist(), "half_size": self.half_size.tolist(),
                "rotation": self.rotation.tolist(), "keep": "inside" if self.keep_inside else "outside"}

    @classmethod
    def from_dict(cls, d: dict) -> "BoxCrop":
        R = _mat(d.get("rotation", np.eye(3).tolist()), (3, 3), "box rotation")
        if abs(abs(np.linalg.det(R)) - 1) > 1e-6 or not np.allclose(R.T @ R, np.eye(3), atol=1e-6):
            raise EditsError("box rotation is not a rotation matrix")
        half = _vec(d["half_size"], 3, "box half_size")
        if np.any(half < 0):
            raise EditsError("box half_size must not be negative")
        return cls(center=_vec(d["center"], 3, "box center"), half_size=half, rotation=R,
                   keep_inside=_keep(d))


@dataclasses.dataclass
class PolygonCrop:
    """A polygon drawn on screen: `view` maps homogeneous world points to homogeneous screen
    pixels (x = v0/v3, y = v1/v3, v3 > 0 in front of the camera); `polygon` [N,2] in those
    pixels on a screen of `size` (w, h). Inside = in front of the camera and within the polygon."""
    view: np.ndarray
    polygon: np.ndarray
    size: tuple
    keep_inside: bool = True

    SUBPIXEL_BITS = 4              # cv2.fillPoly's fixed-point precision: 1/16 pixel

    def inside(self, points: np.ndarray) -> np.ndarray:
        import cv2
        w, h = int(self.size[0]), int(self.size[1])
        P = np.asarray(points, np.float64)
        v = affine_rows(P.reshape(-1, 3), self.view[:, :3], self.view[:, 3])   # [N,4] homogeneous screen pixels
        ok = v[:, 3] > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            x = v[:, 0] / v[:, 3]
            y = v[:, 1] / v[:, 3]
        ok &= np.isfinite(x) & np.isfinite(y) & (x >= -0.5) & (y >= -0.5) & (x < w - 0.5) & (y < h - 0.5)
        mask = self.__dict__.get("_mask")          # the polygon rasterised once (not a field)
        if mask is None:
            mask = np.zeros((h, w), np.uint8)
            pts = np.round(self.polygon * (1 << self.SUBPIXEL_BITS)).astype(np.int32)
            cv2.fillPoly(mask, [pts.reshape(-1, 1, 2)], 1, lineType=cv2.LINE_8, shift=self.SUBPIXEL_BITS)
            self.__dict__["_mask"] = mask
        out = np.zeros(len(P), bool)
        i = np.flatnonzero(ok)
        out[i] = mask[np.rint(y[i]).astype(int).clip(0, h - 1), np.rint(x[i]).astype(int).clip(0, w - 1)] > 0
        return out

    def to_dict(self) -> dict:
        return {"kind": "polygon", "view": self.view.tolist(), "polygon": self.polygon.tolist(),
                "size": [int(self.size[0]), int(self.size[1])], "keep": "inside" if self.keep_inside else "outside"}

    @classmethod
    def from_dict(cls, d: dict) -> "PolygonCrop":
        poly = np.asarray(d["polygon"], np.float64)
        if poly.ndim != 2 or poly.shape[1] != 2 or len(poly) < 3 or not np.all(np.isfinite(poly)):
            raise EditsError(f"polygon: expected at least 3 finite (x, y) vertices, got shape {poly.shape}")
        size = _vec(d["size"], 2, "polygon size")
        if np.any(size < 1) or np.any(size > 1 << 15):
            raise EditsError(f"polygon size {size.tolist()} is not a screen size")
        return cls(view=_mat(d["view"], (4, 4), "polygon view"), polygon=poly,
                   size=(int(size[0]), int(size[1])), keep_inside=_keep(d))


def _keep(d: dict) -> bool:
    keep = d.get("keep", "inside")
    if keep not in ("inside", "outside"):
        raise EditsError(f"crop keep must be 'inside' or 'outside', got {keep!r}")
    return keep == "inside"


@dataclasses.dataclass
class OutlierRemoval:
    """Statistical outlier removal (module docstring)."""
    k: int = 20
    std_ratio: float = 2.0
    conf_threshold: float = 0.0       # the reference cloud: points at least this confident

    def to_dict(self) -> dict:
        return {"k": int(self.k), "std_ratio": float(self.std_ratio), "conf_threshold": float(self.conf_threshold)}

    @classmethod
    def from_dict(cls, d: dict) -> "OutlierRemoval":
        k, r = d.get("k", 20), d.get("std_ratio", 2.0)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 1000:
            raise EditsError(f"outliers k must be an integer in 1..1000, got {k!r}")
        if not isinstance(r, (int, float)) or not 0 < r < 100:
            raise EditsError(f"outliers std_ratio must be a number in (0, 100), got {r!r}")
        t = d.get("conf_threshold", 0.0)
        t = -math.inf if t is None else float(t)
        return cls(k=k, std_ratio=float(r), conf_threshold=t)


@dataclasses.dataclass
class MetricScale:
    """Two picked points (session units) and their known distance in metres."""
    points: np.ndarray
    length: float

    @property
    def factor(self) -> float:
        return self.length / float(np.linalg.norm(self.points[1] - self.points[0]))

    def to_dict(self) -> dict:
        return {"points": self.points.tolist(), "length_m": float(self.length), "factor": self.factor}

    @classmethod
    def from_dict(cls, d: dict) -> "MetricScale":
        return scale_from_points(*_mat(d["points"], (2, 3), "scale points"), d.get("length_m"))


@dataclasses.dataclass
class Floor:
    """Three picked points of the floor (session units) and the rigid transform they give."""
    points: np.ndarray
    transform: np.ndarray

    def to_dict(self) -> dict:
        return {"points": self.points.tolist(), "transform": self.transform.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> "Floor":
        T = _mat(d["transform"], (4, 4), "floor transform")
        R = T[:3, :3]
        if not np.allclose(R.T @ R, np.eye(3), atol=1e-6) or np.linalg.det(R) < 0:
            raise EditsError("floor transform is not a rotation and a translation")
        return cls(points=_mat(d["points"], (3, 3), "floor points"), transform=T)


def scale_from_points(p0, p1, length) -> MetricScale:
    """MetricScale for a known `length` (metres) between two points; EditsError if it cannot be."""
    p0, p1 = _vec(p0, 3, "scale point"), _vec(p1, 3, "scale point")
    try:
        length = float(length)
    except (TypeError, ValueError):
        raise EditsError(f"scale length must be a number of metres, got {length!r}") from None
    if not math.isfinite(length) or length <= 0:
        raise EditsError(f"scale length must be positive, got {length:g}")
    if np.linalg.norm(p1 - p0) <= 1e-12:
        raise EditsError("the two scale points are the same point; pick two different points")
    return MetricScale(points=np.stack([p0, p1]), length=length)


def floor_from_points(p0, p1, p2, toward=None) -> Floor:
    """Floor through three points (module docstring); `toward` (e.g. the mean camera centre) is
    on the up side. EditsError if the points (nearly) lie on a line."""
    a, b, c = (_vec(p, 3, "floor point") for p in (p0, p1, p2))
    n = np.cross(b - a, c - a)
    scale = max(np.linalg.norm(b - a), np.linalg.norm(c - a), 1e-300)
    if np.linalg.norm(n) <= 1e-6 * scale * scale:
        raise EditsError("the three floor points lie on a line; pick three points spread over the floor")
    n /= np.linalg.norm(n)
    if toward is not None and np.dot(_vec(toward, 3, "camera centre") - a, n) < 0:
        n = -n
    R = _rotation_between(n, UP)
    T = sim3_matrix(1.0, R, -R @ a)
    return Floor(points=np.stack([a, b, c]), transform=T)


def floor_grid(floor: "Floor", around: np.ndarray, half_extent: float, lines: int = 11) -> np.ndarray:
    """[4 * lines, 3] world end points of a square grid on the floor plane (line segments, for
    drawing), centred under the point `around`, `half_extent` (session units) to each side."""
    T = floor.transform
    R, t = T[:3, :3], T[:3, 3]
    c = R @ np.asarray(around, np.float64) + t                      # floor coordinates
    s = np.linspace(-half_extent, half_extent, lines)
    seg = []
    for v in s:
        seg += [[c[0] + v, 0, c[2] - half_extent], [c[0] + v, 0, c[2] + half_extent],
                [c[0] - half_extent, 0, c[2] + v], [c[0] + half_extent, 0, c[2] + v]]
    return (np.asarray(seg) - t) @ R                                # back to the session's world


def _rotation_between(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The smallest rotation taking unit vector u to unit vector v."""
    from scipy.spatial.transform import Rotation
    axis = np.cross(u, v)
    s, c = np.linalg.norm(axis), float(np.dot(u, v))
    if s < 1e-12:
        if c > 0:
            return np.eye(3)
        perp = np.cross(u, [1.0, 0, 0] if abs(u[0]) < 0.9 else [0, 0, 1.0])   # a half turn about any normal
        return Rotation.from_rotvec(np.pi * perp / np.linalg.norm(perp)).as_matrix()
    return Rotation.from_rotvec(axis / s * math.atan2(s, c)).as_matrix()


class OutlierModel:
    """The statistics of a reference cloud (module docstring) and the test of any point against it."""

    def __init__(self, reference: np.ndarray, params: OutlierRemoval):
        from scipy.spatial import cKDTree
        self.params = params
        ref = np.asarray(reference, np.float64).reshape(-1, 3)
        self.reference_points = len(ref)
        self.tree = cKDTree(ref) if len(ref) > params.k else None
        self.threshold = math.inf
        self.ref_mean = None                          # each reference point's mean k-NN distance
        if self.tree is not None:
            d, _ = self.tree.query(ref, params.k + 1, workers=-1)
            m = d[:, 1:].mean(axis=1)                 # the nearest is the point itself
            self.threshold = float(m.mean() + params.std_ratio * m.std())
            self.ref_mean = m

    def keep(self, points: np.ndarray) -> np.ndarray:
        """True for the points that are not outliers (all of them without enough reference points).

        Exact, in two passes: a point p whose nearest reference point r lies at distance e has a
        mean k-NN distance of at most e + ref_mean[r] (r's k neighbours are k candidates at most e
        farther), so when that bound is within the threshold p is kept after a 1-NN query; only
        the rest (few: the points near or past the threshold) need the k + 1 query."""
        P = np.asarray(points, np.float64).reshape(-1, 3)
        if self.tree is None or not len(P):
            return np.ones(len(P), bool)
        k = self.params.k
        e, r = self.tree.query(P, 1, workers=-1)
        keep = e + self.ref_mean[r] <= self.threshold
        rest = np.flatnonzero(~keep)
        if len(rest):
            d, _ = self.tree.query(P[rest], k + 1, workers=-1)
            # a point of the reference cloud finds itself first (distance 0): its k others count
            m = np.where(d[:, 0] == 0, d[:, 1:].mean(axis=1), d[:, :k].mean(axis=1))
            keep[rest] = m <= self.threshold
        return keep


def fit_outliers(frames, n_frames: int, edits: "SessionEdits") -> Optional[OutlierModel]:
    """The OutlierModel of `edits.outliers` over a session: `frames` are its FrameResults with
    depth (re-aligned, not edited; `n_frames` of them), back-projected at the pixel step that
    keeps the reference cloud within OUTLIER_REFERENCE_POINTS, cropped by `edits`' crops."""
    from ..geometry import backproject

    params = edits.outliers
    if params is None:
        return None
    parts, step = [], None
    for r in frames:
        if r.depth is None:
            continue
        if step is None:
            h, w = np.shape(r.depth)
            step = max(1, math.ceil(math.sqrt(max(1, n_frames) * h * w / OUTLIER_REFERENCE_POINTS)))
        conf_min = params.conf_threshold if r.conf is not None else -math.inf
        pts, _ = backproject(r.depth, r.K, r.c2w, step, r.conf, conf_min)
        parts.append(pts[edits.crop_mask(pts)])
    ref = np.concatenate(parts) if parts else np.zeros((0, 3), np.float32)
    return OutlierModel(ref, params)


@dataclasses.dataclass
class SessionEdits:
    """Every edit of a session (module docstring); an empty one changes nothing."""
    crops: list = dataclasses.field(default_factory=list)
    outliers: Optional[OutlierRemoval] = None
    scale: Optional[MetricScale] = None
    floor: Optional[Floor] = None

    @property
    def empty(self) -> bool:
        return not self.crops and self.outliers is None and self.scale is None and self.floor is None

    @property
    def removes_points(self) -> bool:
        return bool(self.crops) or self.outliers is not None

    @property
    def scale_factor(self) -> float:
        """Metres per session unit (1.0 without a metric scale)."""
        return self.scale.factor if self.scale is not None else 1.0

    def similarity(self) -> Optional[np.ndarray]:
        """The 4x4 similarity the floor and the scale give (None: neither is set)."""
        if self.scale is None and self.floor is None:
            return None
        T = self.floor.transform if self.floor is not None else np.eye(4)
        S = np.diag([self.scale_factor] * 3 + [1.0])
        return S @ T

    def crop_mask(self, points: np.ndarray) -> np.ndarray:
        """True for the points every crop keeps (world as drawn, before the similarity)."""
        P = np.asarray(points, np.float64).reshape(-1, 3)
        keep = np.ones(len(P), bool)
        for c in self.crops:
            if keep.any():
                keep[keep] = c.inside(P[keep]) == c.keep_inside
        return keep

    def keep_mask(self, points: np.ndarray, outlier_model: Optional[OutlierModel] = None) -> np.ndarray:
        """True for the points the crops keep and the outlier filter (its model) does not remove."""
        keep = self.crop_mask(points)
        if outlier_model is not None and keep.any():
            keep[keep] = outlier_model.keep(np.asarray(points, np.float64).reshape(-1, 3)[keep])
        return keep

    def transform_points(self, points: np.ndarray) -> np.ndarray:
        """Points moved by the floor and scale similarity (unchanged without one)."""
        S = self.similarity()
        return np.asarray(points) if S is None else apply_to_points(S, points).astype(np.float32)

    def transform_c2w(self, c2w: np.ndarray) -> np.ndarray:
        """Camera-to-world pose(s) moved by the floor and scale similarity."""
        S = self.similarity()
        return np.asarray(c2w, np.float64) if S is None else apply_to_c2w(S, c2w)

    def to_dict(self) -> dict:
        return {"format": EDITS_FORMAT, "version": EDITS_VERSION,
                "crops": [c.to_dict() for c in self.crops],
                "outliers": None if self.outliers is None else self.outliers.to_dict(),
                "scale": None if self.scale is None else self.scale.to_dict(),
                "floor": None if self.floor is None else self.floor.to_dict()}

    @classmethod
    def from_dict(cls, d) -> "SessionEdits":
        if not isinstance(d, dict):
            raise EditsError("not a JSON object")
        if d.get("format") != EDITS_FORMAT:
            raise EditsError(f"not a ReconStudio edits record (format {d.get('format')!r}, "
                             f"expected {EDITS_FORMAT!r})")
        v = d.get("version")
        if not isinstance(v, int) or v < 1 or v > EDITS_VERSION:
            raise EditsError(f"edits version {v!r} is not supported (this ReconStudio reads 1..{EDITS_VERSION}); "
                             "a newer ReconStudio wrote it")
        crops = []
        for i, c in enumerate(d.get("crops") or [], 1):
            kind = c.get("kind") if isinstance(c, dict) else None
            if kind not in ("box", "polygon"):
                raise EditsError(f"crop {i}: unknown crop kind {kind!r} (box or polygon)")
            crops.append(_entry(f"crop {i} ({kind})", BoxCrop.from_dict if kind == "box" else PolygonCrop.from_dict, c))
        return cls(crops=crops,
                   outliers=_entry("outliers", OutlierRemoval.from_dict, d.get("outliers")),
                   scale=_entry("scale", MetricScale.from_dict, d.get("scale")),
                   floor=_entry("floor", Floor.from_dict, d.get("floor")))


def _entry(name: str, parse, d):
    """parse(d) for one entry of the record (None stays None); EditsError naming the entry."""
    if d is None:
        return None
    if not isinstance(d, dict):
        raise EditsError(f"{name}: expected a JSON object, got {type(d).__name__}")
    try:
        return parse(d)
    except EditsError as exc:
        raise EditsError(f"{name}: {exc}") from None
    except KeyError as exc:
        raise EditsError(f"{name}: missing {exc}") from None
    except (TypeError, AttributeError, ValueError) as exc:
        raise EditsError(f"{name}: malformed ({exc})") from None


def edits_path(folder: Union[str, Path]) -> Path:
    return Path(folder).expanduser() / EDITS_FILE


def read_edits_file(path: Union[str, Path]) -> SessionEdits:
    """The edits of a JSON file (a session's edits.json or one given to `run --crop`); EditsError
    naming the file when it cannot be read or is not an edits record."""
    path = Path(path).expanduser()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EditsError(f"edits file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EditsError(f"cannot read edits file {path}: {exc}") from None
    except ValueError as exc:
        raise EditsError(f"edits file {path} is not valid JSON ({exc})") from None
    try:
        return SessionEdits.from_dict(data)
    except EditsError as exc:
        raise EditsError(f"edits file {path}: {exc}") from None


def load_edits(folder: Union[str, Path]) -> SessionEdits:
    """The edits stored with a session (an empty SessionEdits when it has none)."""
    p = edits_path(folder)
    if not p.exists():
        return SessionEdits()
    return read_edits_file(p)


def save_edits(folder: Union[str, Path], edits: SessionEdits) -> Optional[Path]:
    """Store `edits` with the session, atomically (engine/io/atomic.py); empty edits remove the
    file (the raw session). Returns the file written (None when removed)."""
    p = edits_path(folder)
    if edits.empty:
        p.unlink(missing_ok=True)
        return None
    with atomic_open(p, "w") as f:
        json.dump(edits.to_dict(), f, indent=2)
    return p
