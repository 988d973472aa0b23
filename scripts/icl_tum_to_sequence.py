"""An ICL-NUIM sequence in its TUM-compatible form (`<traj>_frei_png/rgb/<k>.png` plus a
`*.gt.freiburg` file, whose timestamps are the frame numbers k) -> this project's sequence layout
(../shared/data/README.md: rgb/NNNNNN.jpg, groundtruth.txt, intrinsics.txt, video.mp4), for
evaluating the geometric engine on long sequences with ground truth:

    python scripts/icl_tum_to_sequence.py SRC_DIR GT_FILE .cache/long_seq_NAME [--frames 1000]
    .venv/bin/python -m app eval .cache/long_seq_NAME --json

Fetched data stays out of the repository (.cache/ is git-ignored). Conventions, checked on office
kt0 (docs/benchmarks_geometric.md): image k pairs with the pose of timestamp k (`--offset` shifts
that; images without a pose are skipped), and the poses are reflected in y (R' = S R S, t' = S t,
S = diag(1, -1, 1)) to the camera convention of the shared ICL clip: relative rotations from the
images matched the reflected poses to 0.5 deg median, the raw ones to 3.4 deg. The ICL-NUIM
intrinsics are fixed (481.2, 480.0, 319.5, 239.5 at 640x480).
"""
from __future__ import annotations

import argparse
import os

import cv2
import numpy as np
from scipy.spatial.transform import Rotation

INTRINSICS = "481.2 480.0 319.5 239.5 640 480"
S = np.diag([1.0, -1.0, 1.0])


def read_gt(path: str) -> dict[int, np.ndarray]:
    """Frame number -> [tx ty tz qx qy qz qw] from a TUM-format file with integer timestamps."""
    gt = {}
    for line in open(path):
        p = line.split()
        if len(p) == 8 and not line.startswith("#"):
            gt[int(round(float(p[0])))] = np.array([float(x) for x in p[1:]])
    return gt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="folder holding rgb/<k>.png")
    ap.add_argument("gt", help="the *.gt.freiburg ground truth")
    ap.add_argument("out")
    ap.add_argument("--frames", type=int, default=0, help="keep the first N posed frames (0: all)")
    ap.add_argument("--offset", type=int, default=0, help="image k takes the pose of timestamp k + offset")
    ap.add_argument("--no-reflect", action="store_true", help="keep the poses as they are")
    a = ap.parse_args()
    gt = read_gt(a.gt)
    keys = sorted(k for k in gt if os.path.exists(os.path.join(a.src, "rgb", f"{k - a.offset}.png")))
    if not keys:
        raise SystemExit(f"no image of {a.src}/rgb matches a timestamp of {a.gt}")
    if a.frames:
        keys = keys[:a.frames]
    os.makedirs(os.path.join(a.out, "rgb"), exist_ok=True)
    video = cv2.VideoWriter(os.path.join(a.out, "video.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 30.0, (640, 480))
    with open(os.path.join(a.out, "groundtruth.txt"), "w") as f:
        f.write("# timestamp tx ty tz qx qy qz qw (camera-to-world, metres)\n")
        for i, k in enumerate(keys):
            img = cv2.imread(os.path.join(a.src, "rgb", f"{k - a.offset}.png"), cv2.IMREAD_COLOR)
            if img is None or img.shape[:2] != (480, 640):
                raise SystemExit(f"rgb/{k - a.offset}.png is not a 640x480 image")
            cv2.imwrite(os.path.join(a.out, "rgb", f"{i:06d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 95])
            video.write(img)
            t, R = gt[k][:3], Rotation.from_quat(gt[k][3:]).as_matrix()
            if not a.no_reflect:
                t, R = S @ t, S @ R @ S
            q = Rotation.from_matrix(R).as_quat()
            f.write("%.6f %.9f %.9f %.9f %.9f %.9f %.9f %.9f\n" % (i / 30.0, *t, *q))
    video.release()
    with open(os.path.join(a.out, "intrinsics.txt"), "w") as f:
        f.write(f"# fx fy cx cy width height\n{INTRINSICS}\n")
    print(f"{a.out}: {len(keys)} frames (timestamps {keys[0]}..{keys[-1]})")


if __name__ == "__main__":
    main()
