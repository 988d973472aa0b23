"""What session edits (engine/io/edits.py) cost an export: a PLY re-export of one synthetic session
raw, with a box crop, with a screen polygon crop, and with statistical outlier removal.

The session (dense depth at the neural engines' result size, a wall with noise and floating
points) is written once under --root; each case exports it in this process and prints wall time
and the points kept.

    python benchmarks/edits_bench.py                     # 60 frames at 518 x 392, stride 2
    python benchmarks/edits_bench.py --frames 200 --stride 1

Figures and hardware: docs/benchmarks_edits.md.
"""
from __future__ import annotations

import argparse
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def build(folder: Path, frames: int, h: int, w: int) -> None:
    from engine.api import FrameResult, SessionConfig
    from engine.io.store import SessionStore

    rng = np.random.default_rng(0)
    K = np.array([[0.9 * w, 0, (w - 1) / 2], [0, 0.9 * w, (h - 1) / 2], [0, 0, 1]])
    with SessionStore(folder, SessionConfig(engine="synthetic"), "edits-bench") as st:
        for i in range(frames):
            c2w = np.eye(4)
            c2w[:3, 3] = [0.02 * i, 0.0, 0.0]
            depth = (2.0 + 0.01 * rng.normal(size=(h, w))).astype(np.float32)
            far = rng.random((h, w)) < 0.002            # floating points between camera and wall
            depth[far] = rng.uniform(0.5, 1.5, far.sum())
            img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            st.write(FrameResult(index=i, timestamp=i / 30, is_keyframe=i % 4 == 0, c2w=c2w, K=K, image=img,
                                 depth=depth, conf=np.full((h, w), 5.0, np.float32)))


def main() -> None:
    from engine.io.edits import BoxCrop, OutlierRemoval, PolygonCrop, SessionEdits
    from engine.io.export import export_results
    from engine.io.session_reader import read_session

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--size", default="518x392", help="result size WxH")
    ap.add_argument("--stride", type=int, default=2)
    ap.add_argument("--root", default="/tmp/reconstudio-edits-bench")
    ap.add_argument("--cases", default="raw,box,polygon,outliers",
                    help="comma list of the cases to export (first word of each case's name)")
    a = ap.parse_args()
    w, h = (int(v) for v in a.size.split("x"))
    root = Path(a.root)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    folder = root / "session"
    build(folder, a.frames, h, w)
    view = np.array([[500.0, 0, 320, 320], [0, 500, 240, 240], [0, 0, 0, 1], [0, 0, 1, 1]])
    cases = {
        "raw": SessionEdits(),
        "box crop": SessionEdits(crops=[BoxCrop.from_bounds([-0.5, -0.5, 1.8], [0.8, 0.5, 2.2])]),
        "polygon crop": SessionEdits(crops=[PolygonCrop(view=view, polygon=np.array(
            [[200.0, 150], [450, 160], [420, 380], [230, 330]]), size=(640, 480))]),
        "outliers k=20": SessionEdits(outliers=OutlierRemoval(k=20, std_ratio=2.0)),
    }
    print(f"# {a.frames} frames {w}x{h}, PLY stride {a.stride}; {platform.processor() or platform.machine()}, "
          f"python {platform.python_version()}")
    print("| case | export s | points |")
    print("| --- | ---: | ---: |")
    wanted = set(a.cases.split(","))
    for name, edits in cases.items():
        if name.split()[0] not in wanted:
            continue
        reader = read_session(folder, edits=edits)
        t = time.perf_counter()
        out = export_results(reader, {"ply": root / "out.ply"}, stride=a.stride)
        print(f"| {name} | {time.perf_counter() - t:.2f} | {out['points']:,} |", flush=True)


if __name__ == "__main__":
    main()
