"""`reconstudio eval SEQUENCE_DIR`: run a sequence with ground truth (the layout of
shared/data/README.md) through an engine and print ATE / RPE / coverage / depth metrics.

Module level imports nothing heavy (no torch, cv2 or Qt)."""
from __future__ import annotations

import argparse
import json
import sys

from app.config_flags import add_session_flags, config_from_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sequence", metavar="SEQUENCE_DIR",
                   help="folder with rgb/, groundtruth.txt, intrinsics.txt and optionally depth/")
    p.add_argument("--trajectory", metavar="OUT.txt", help="write the estimated trajectory (TUM format)")
    p.add_argument("--session-dir", metavar="DIR",
                   help="also store the run as a session in DIR (new or empty): the viewer reopens it "
                        "with the ground truth beside the run")
    p.add_argument("--max-frames", type=int, default=None, metavar="N", help="use only the first N frames")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any engine setting by its SessionConfig name, e.g. --set depth=false "
                        "(unknown keys go to SessionConfig.extra)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    p.add_argument("--no-intrinsics", action="store_true",
                   help="ignore the sequence's intrinsics.txt (and --intrinsics): the engine self-calibrates "
                        "its focal length, which the report compares with the sequence's")
    # every engine setting from the SessionConfig metadata (--intrinsics overrides intrinsics.txt)
    add_session_flags(p)


def _value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def main(args) -> int:
    from engine.api import EngineError, SessionConfig
    from engine.evaluate import evaluate_sequence, format_report

    try:
        cfg = config_from_args(args)
        sets = {}
        for item in args.set:
            if "=" not in item:
                raise EngineError(f"--set needs KEY=VALUE, got {item!r}")
            k, v = item.split("=", 1)
            sets[k.strip()] = _value(v.strip())
        if sets:      # typed fields are converted (ValueError names a bad one); the rest -> extra
            cfg = SessionConfig.from_dict({**cfg.to_dict(), **sets})

        def progress(i, n):
            if not args.quiet and (i % 20 == 0 or i == n):
                print(f"\r{i}/{n} frames", end="" if i < n else "\n", file=sys.stderr, flush=True)

        rep = evaluate_sequence(args.sequence, cfg, max_frames=args.max_frames, trajectory=args.trajectory,
                                progress=progress, session_dir=getattr(args, "session_dir", None),
                                use_intrinsics=not args.no_intrinsics)
    except (EngineError, ValueError) as exc:
        print(f"reconstudio eval: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("reconstudio eval: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(rep, indent=2, default=float))
    else:
        print(format_report(rep))
    return 0
