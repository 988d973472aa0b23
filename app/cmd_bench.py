"""`reconstudio bench`: FPS, latency, GPU memory and a per-part time breakdown of the streaming
LingBot-Map engine, on random / recipe / checkpoint weights; `--sweep` writes a memory CSV.

Examples:
    reconstudio bench --device cuda --dtype bf16 --frames 300 --breakdown
    reconstudio bench --device cuda --sweep 64,1000,2000,5000,10000 --csv sweep.csv --json sweep.json
    reconstudio bench --model lingbot-map-tiny --device cpu --dtype fp32 --resolution 70x56 --frames 20
    reconstudio bench --device cuda --frames 200 --warmup 70 --settings-table all --json settings.json
"""
from __future__ import annotations

import argparse
import sys

from app.config_flags import add_session_flags, given_settings
from engine.api import setting_fields

# SessionConfig fields bench takes as flags: the streaming engine's, less those bench sets itself
BENCH_FIELDS = [f.name for f, m in setting_fields()
                if ("lingbot-map" in m["engines"] or f.name == "device")
                and f.name not in ("checkpoint", "mode")]


def _resolution(text: str) -> tuple:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"resolution must look like 518x378, got {text!r}") from None
    if w < 14 or h < 14 or w % 14 or h % 14:
        raise argparse.ArgumentTypeError(f"resolution {text} must be multiples of 14 (e.g. 518x378)")
    return w, h


def _counts(text: str) -> list:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sweep takes frame counts like 64,1000,10000, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("--sweep counts must be positive")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = __doc__.split("\n\n", 1)[1]
    p.add_argument("--weights", default="random",
                   help="random (fast init), recipe (the fixtures' deterministic weights) or a checkpoint path")
    p.add_argument("--resolution", type=_resolution, default=None, metavar="WxH",
                   help="model input size, multiples of 14 (default 518x378 = 37x27 patches); "
                        "--image-width alone keeps the 518:378 aspect")
    p.add_argument("--frames", type=int, default=300, help="frames to stream (default 300)")
    p.add_argument("--warmup", type=int, default=30, help="streamed frames left out of steady-state figures")
    p.add_argument("--breakdown", action="store_true",
                   help="time patch embed / frame blocks / global blocks / global attention / heads (CUDA events)")
    p.add_argument("--sweep", type=_counts, default=None, metavar="N1,N2,...",
                   help="record a row (time, FPS, peak memory, KV pages) at each frame count of one long stream")
    p.add_argument("--csv", default=None, help="write the sweep rows here (default bench_sweep.csv with --sweep)")
    p.add_argument("--json", default=None, help="write every figure here as JSON")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--settings-table", default=None, metavar="all|NAME,NAME,...",
                   help="stream once per setting of the fast-path table (KV compression, KV / weight dtypes, "
                        "keyframe interval 2, a shorter window, windowed mode) over the same frames and "
                        "report FPS, peak memory, graph mode / attention path and the deviation from the "
                        "exact path (the first row); names as printed, comma-separated")
    # the engine's settings (window, dtype, kv_dtype, kv_compression, ...) from the SessionConfig metadata
    add_session_flags(p, only=BENCH_FIELDS, defaults={"dtype": "bf16", "device": "cuda when available"})


def main(args: argparse.Namespace) -> int:
    import torch

    from engine.api import EngineError
    from engine.bench import BenchConfig, CsvRows, format_report, height_for_width, run_bench, write_json

    given = given_settings(args)
    if args.resolution:
        w, h = args.resolution
    elif args.image_width:
        if args.image_width % 14:
            print(f"bench: --image-width must be a positive multiple of 14 (got {args.image_width})", file=sys.stderr)
            return 2
        w, h = args.image_width, height_for_width(args.image_width)
    else:
        w, h = 518, 378
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    own = {k: given.pop(k) for k in ("model", "window", "scale_frames", "keyframe_interval",
                                     "camera_iterations", "special_cap", "dtype", "kv_dtype", "backend",
                                     "cuda_graphs") if k in given}
    given.pop("device", None)
    given.pop("image_width", None)
    cfg = BenchConfig(weights=args.weights, width=w, height=h, frames=args.frames, warmup=args.warmup,
                      device=device, breakdown=args.breakdown, sweep=args.sweep or [], seed=args.seed,
                      settings=given, **own)
    if args.settings_table:
        return _settings_table(cfg, args)
    rows = CsvRows(args.csv or "bench_sweep.csv") if args.sweep else None
    try:
        res = run_bench(cfg, on_row=rows)
    except EngineError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    finally:
        if rows is not None:
            rows.close()
    print(format_report(res))
    if rows is not None:
        print(f"sweep rows written to {args.csv or 'bench_sweep.csv'}")
    if args.json:
        write_json(res, args.json)
        print(f"figures written to {args.json}")
    return 0


def _settings_table(cfg, args) -> int:
    """`--settings-table`: engine.bench.run_settings_table, rows written to --json as they come."""
    from engine.api import EngineError
    from engine.bench import run_settings_table, write_json

    names = None if args.settings_table == "all" else [n.strip() for n in args.settings_table.split(",") if n.strip()]
    done: list = []

    def keep(row):
        done.append(row)
        if args.json:                  # a run cut short keeps the rows measured so far
            write_json({"config": cfg.__dict__, "rows": done}, args.json)
    try:
        run_settings_table(cfg, names, on_row=keep)
    except EngineError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(f"rows written to {args.json}")
    return 0
