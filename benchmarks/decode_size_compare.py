"""Results and depth points of the geometric engine on an upscaled copy of the sample clip, for
several decode sizes (SessionConfig.decode_max_side): what the GUI and `run` get from a large input.

    python benchmarks/decode_size_compare.py --size 3840x2880 --frames 120 --decode 0 960 1920

The clip is written to a temporary folder (MJPG AVI); `--intrinsics` puts the sample's
intrinsics.txt beside it. Prints one line per decode size: decoded frame size, results, depth
pixels > 0 summed over the results, seconds.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from engine import SessionConfig, open_session
from engine.intrinsics import attach_found_intrinsics
from engine.io.sources import open_source
from resources import sample_clip_path


def upscaled_clip(folder: Path, size: tuple, frames: int, intrinsics: bool) -> Path:
    cap = cv2.VideoCapture(str(sample_clip_path()))
    out = folder / "clip.avi"
    w = cv2.VideoWriter(str(out), cv2.VideoWriter_fourcc(*"MJPG"), 30, size)
    for _ in range(frames):
        ok, f = cap.read()
        if not ok:
            break
        w.write(cv2.resize(f, size, interpolation=cv2.INTER_CUBIC))
    w.release()
    cap.release()
    if intrinsics:
        shutil.copy(sample_clip_path().parent / "intrinsics.txt", folder / "intrinsics.txt")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="3840x2880")
    ap.add_argument("--frames", type=int, default=120)
    ap.add_argument("--decode", type=int, nargs="+", default=[0, 960, 1920])
    ap.add_argument("--intrinsics", action="store_true")
    a = ap.parse_args()
    size = tuple(int(v) for v in a.size.lower().split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        clip = upscaled_clip(Path(tmp), size, a.frames, a.intrinsics)
        for d in a.decode:
            cfg = SessionConfig(engine="geometric", decode_max_side=d)
            attach_found_intrinsics(cfg, clip)
            t0 = time.perf_counter()
            src = open_source(clip, max_side=d or None)
            session = open_session(cfg)
            results, shape = [], None
            for f in src:
                shape = f.image.shape
                results += session.push(f.image)
            results += session.flush()
            points = sum(int(np.count_nonzero(r.depth > 0)) for r in results if r.depth is not None)
            session.close()
            src.close()
            print(f"decode {d or 'full'}: frames {shape[1]}x{shape[0]}, {len(results)} results, "
                  f"{points:,} depth points, {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
