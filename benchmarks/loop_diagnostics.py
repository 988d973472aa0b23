"""Why do loops (not) close on a sequence? Runs the geometric engine over SEQ (the sequence layout
of ../shared/data: rgb/*.jpg, intrinsics.txt) and counts, for every place-recognition query, the
candidates above the score ratio and the verifications that passed, and for every verification
the descriptor pairs between the two keyframes' map points (30 needed) and the PnP inliers.
Usage: python benchmarks/loop_diagnostics.py SEQ [--frames N] [--no-flow]   (docs/benchmarks_geometric.md)
"""
import argparse
import collections
import glob

import cv2
import numpy as np
from PIL import Image

from engine import SessionConfig, open_session
from engine.geometric import loop as loop_mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("seq")
    ap.add_argument("--frames", type=int, default=100000)
    ap.add_argument("--no-flow", action="store_true", help="descriptor verification only (loop_flow_verify off)")
    a = ap.parse_args()
    stats = collections.Counter()
    best_match, verify = loop_mod.LoopCloser._best_match, loop_mod.LoopCloser._verify

    def counted_best_match(self, node, fids, ref, **kw):
        res = best_match(self, node, fids, ref, **kw)
        if fids:
            scores = np.array([self._score(node.bow, self.nodes[f].bow) for f in fids])
            stats["queries"] += 1
            stats["queries with a candidate over the score ratio"] += bool((scores >= self.p.min_score_ratio * ref).any())
            stats["queries verified"] += res is not None
        return res

    def counted_verify(self, q, c):
        res = verify(self, q, c)
        stats["verifications"] += 1
        stats["verifications passed"] += res is not None
        if q.a_desc is None or c.a_desc is None or len(q.a_desc) < self.p.min_matches:
            stats["query with too few map-point descriptors"] += 1
            return res
        knn = cv2.BFMatcher(cv2.NORM_HAMMING).knnMatch(q.a_desc, c.a_desc, k=2)
        pairs = [(m[0].queryIdx, m[0].trainIdx) for m in knn
                 if len(m) == 2 and m[0].distance < 0.8 * m[1].distance and m[0].distance < 64]
        stats["descriptor pairs (sum)"] += len(pairs)
        if len(pairs) < self.p.min_matches:
            stats["too few descriptor pairs"] += 1
        return res

    loop_mod.LoopCloser._best_match = counted_best_match
    loop_mod.LoopCloser._verify = counted_verify
    lines = [ln for ln in open(f"{a.seq}/intrinsics.txt").read().splitlines() if ln.strip() and not ln.startswith("#")]
    s = open_session(SessionConfig(engine="geometric", depth=False, loop_flow_verify=not a.no_flow, intrinsics=[float(x) for x in lines[0].split()]))
    for f in sorted(glob.glob(f"{a.seq}/rgb/*.jpg"))[:a.frames]:
        s.push(np.asarray(Image.open(f).convert("RGB")))
    s.flush()
    lc = s._loop
    stats["verified by descriptors"] = lc.verified_descriptors
    stats["verified by optical flow"] = lc.verified_flow
    stats["flow verifications tried"] = lc.flow_attempts
    st = s.stats()
    for k in ("loops_closed", "loops_consistent", "loops_rejected", "loop_cpu_ms"):
        stats[k] = st.get(k) or 0
    s.close()
    for k, v in stats.items():
        print(f"{k}: {int(v)}")


if __name__ == "__main__":
    main()
