"""Make a long loop sequence (the shared-data layout) from a short clip by playing it forwards and
backwards: `python scripts/make_loop_sequence.py SRC OUT --pattern fbfbf [--stride 1]`.

Frames are symbolic links to the source JPEGs (nothing is copied); groundtruth.txt is re-ordered
with new timestamps (index / 30 s), intrinsics.txt (and depth/ links, if any) come along. A
"f" plays frames 0..N-1, a "b" plays them back N-1..0 (the first frame of each pass after the
first is skipped so the camera never stands still for two frames). Never commit the output.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path


def make(src: Path, out: Path, pattern: str, stride: int = 1) -> int:
    frames = sorted((src / "rgb").glob("*.jpg")) or sorted((src / "rgb").glob("*.png"))
    gt = [l for l in (src / "groundtruth.txt").read_text().splitlines() if l.strip() and not l.startswith("#")]
    if len(gt) != len(frames):
        raise SystemExit(f"{src}: {len(frames)} frames but {len(gt)} ground-truth lines")
    n = len(frames)
    order: list[int] = []
    for k, ch in enumerate(pattern):
        run = list(range(0, n, stride)) if ch == "f" else list(range(n - 1, -1, -stride))
        order += run[1:] if k else run
    (out / "rgb").mkdir(parents=True, exist_ok=True)
    depth = src / "depth"
    if depth.is_dir():
        (out / "depth").mkdir(exist_ok=True)
    lines = ["# timestamp tx ty tz qx qy qz qw (made by scripts/make_loop_sequence.py)"]
    for j, i in enumerate(order):
        link = out / "rgb" / f"{j:06d}{frames[i].suffix}"
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(frames[i].resolve(), link)
        d = depth / f"{frames[i].stem}.png"
        if d.exists():
            dl = out / "depth" / f"{j:06d}.png"
            if dl.is_symlink() or dl.exists():
                dl.unlink()
            os.symlink(d.resolve(), dl)
        lines.append(f"{j / 30.0:.6f} " + " ".join(gt[i].split()[1:8]))
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
    a = p.parse_args()
    if set(a.pattern) - {"f", "b"} or not a.pattern:
        raise SystemExit("--pattern is a word of f and b")
    print(f"{make(a.src, a.out, a.pattern, a.stride)} frames in {a.out}")


if __name__ == "__main__":
    main()
