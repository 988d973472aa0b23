"""Make a long loop sequence (the shared-data layout) from a short clip by playing it forwards and
backwards: `python scripts/make_loop_sequence.py SRC OUT --pattern fbfbf [--stride 1]`.

Frames are symbolic links to the source JPEGs (nothing is copied); groundtruth.txt is re-ordered
with new timestamps (index / 30 s), intrinsics.txt (and depth/ links, if any) come along. A
"f" plays frames 0..N-1, a "b" plays them back N-1..0 (the first frame of each pass after the
first is skipped so the camera never stands still for two frames). Never commit the output.

Harder revisits (`--blur SIGMA --roll DEG --gain G`): every pass after the first is written as
new JPEGs (quality 95) blurred by a Gaussian of SIGMA px, multiplied by G in brightness, and rolled
about the principal point by DEG, each ramping in over the first 60 frames of the second pass and then
staying (the ground truth turns with it: c2w · Rz(roll)ᵀ, exact for a pinhole camera with
fx ≈ fy and the principal point at the centre; the corners the rotation leaves are black). So a
revisit sees the place blurred, darker and rotated, as a hand-held camera does, instead of the same
pixels again.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np


def _quat_xyzw(R):
    from scipy.spatial.transform import Rotation
    return Rotation.from_matrix(R).as_quat()


def _perturbed(src_jpg: Path, dst: Path, blur: float, roll_deg: float, gain: float, K) -> None:
    import cv2
    img = cv2.imread(str(src_jpg))
    if roll_deg:
        M = cv2.getRotationMatrix2D((float(K[0]), float(K[1])), roll_deg, 1.0)
        img = cv2.warpAffine(img, M, (img.shape[1], img.shape[0]), flags=cv2.INTER_LINEAR,
                             borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    if blur > 0:
        img = cv2.GaussianBlur(img, (0, 0), blur)
    if gain != 1.0:
        img = np.clip(img.astype(np.float32) * gain, 0, 255).astype(np.uint8)
    cv2.imwrite(str(dst), img, [cv2.IMWRITE_JPEG_QUALITY, 95])


def make(src: Path, out: Path, pattern: str, stride: int = 1, blur: float = 0.0, roll: float = 0.0,
         gain: float = 1.0) -> int:
    frames = sorted((src / "rgb").glob("*.jpg")) or sorted((src / "rgb").glob("*.png"))
    gt = [l for l in (src / "groundtruth.txt").read_text().splitlines() if l.strip() and not l.startswith("#")]
    if len(gt) != len(frames):
        raise SystemExit(f"{src}: {len(frames)} frames but {len(gt)} ground-truth lines")
    n = len(frames)
    order: list[int] = []
    for k, ch in enumerate(pattern):
        run = list(range(0, n, stride)) if ch == "f" else list(range(n - 1, -1, -stride))
        order += run[1:] if k else run
    n1 = len(range(0, n, stride))                # frames of the first pass (never perturbed)
    ramp = [min(1.0, max(0.0, (j - n1 + 1) / 60.0)) for j in range(len(order))]   # 0..1 per frame
    angle = [roll * r for r in ramp]             # roll of each output frame (degrees)
    perturb = bool(blur or roll or gain != 1.0)
    cxcy = [float(x) for x in [l for l in (src / "intrinsics.txt").read_text().splitlines()
                               if l.strip() and not l.startswith("#")][0].split()[2:4]]
    (out / "rgb").mkdir(parents=True, exist_ok=True)
    depth = src / "depth"
    if depth.is_dir():
        (out / "depth").mkdir(exist_ok=True)
    lines = ["# timestamp tx ty tz qx qy qz qw (made by scripts/make_loop_sequence.py)"]
    for j, i in enumerate(order):
        first_pass = j < n1
        link = out / "rgb" / f"{j:06d}{frames[i].suffix if first_pass or not perturb else '.jpg'}"
        if link.is_symlink() or link.exists():
            link.unlink()
        if perturb and not first_pass:
            r = ramp[j]
            _perturbed(frames[i], link, blur * r, angle[j], 1.0 + (gain - 1.0) * r, cxcy)
        else:
            os.symlink(frames[i].resolve(), link)
        d = depth / f"{frames[i].stem}.png"
        if d.exists():
            dl = out / "depth" / f"{j:06d}.png"
            if dl.is_symlink() or dl.exists():
                dl.unlink()
            os.symlink(d.resolve(), dl)
        v = gt[i].split()[1:8]
        if angle[j]:
            from scipy.spatial.transform import Rotation
            # the image turned by +a (OpenCV: counter-clockwise on screen) = the camera rolled by
            # -a about its optical axis: x' = Rz x with Rz the turn of the pixel grid
            a = np.radians(angle[j])
            Rz = np.array([[np.cos(a), np.sin(a), 0], [-np.sin(a), np.cos(a), 0], [0, 0, 1]])
            R = Rotation.from_quat([float(x) for x in v[3:7]]).as_matrix() @ Rz.T
            v = v[:3] + [f"{x:.9f}" for x in _quat_xyzw(R)]
        lines.append(f"{j / 30.0:.6f} " + " ".join(v))
    (out / "groundtruth.txt").write_text("\n".join(lines) + "\n")
    for name in ("intrinsics.txt", "depth_intrinsics.txt"):
        if (src / name).exists():
            (out / name).write_text((src / name).read_text())
    return len(order)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--pattern", default="fbfbf", help="f = forwards, b = backwards (default fbfbf)")
    p.add_argument("--stride", type=int, default=1, help="use every N-th frame (faster motion)")
    p.add_argument("--blur", type=float, default=0.0, help="revisit passes: Gaussian blur sigma (px)")
    p.add_argument("--roll", type=float, default=0.0, help="revisit passes: roll ramped up to DEG")
    p.add_argument("--gain", type=float, default=1.0, help="revisit passes: brightness factor")
    a = p.parse_args()
    if set(a.pattern) - {"f", "b"} or not a.pattern:
        raise SystemExit("--pattern is a word of f and b")
    print(f"{make(a.src, a.out, a.pattern, a.stride, a.blur, a.roll, a.gain)} frames in {a.out}")


if __name__ == "__main__":
    main()
