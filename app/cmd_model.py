"""`reconstudio model ...`: checkpoint tools.

  model inspect PATH        what a checkpoint holds and whether it fits the LingBot-Map architecture
                            (exit 0 fits, 1 does not fit, 2 unreadable or refused)
  model list                the released checkpoints the app knows how to download
  model download [NAME]     fetch a released checkpoint from the Hugging Face hub (tqdm progress)

Nothing heavy is imported at module level (the CLI builds every subcommand's parser).
"""
from __future__ import annotations

import argparse
import sys

_FORMAT_NAMES = {
    "pt": "PyTorch zip (torch.save), read with weights_only=True, memory-mapped",
    "pt-legacy": "PyTorch legacy (pre-1.6 torch.save), read with weights_only=True",
    "safetensors": "safetensors, memory-mapped",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("inspect", help="show what a checkpoint holds and whether it fits the architecture",
                       description="Print format, wrapper, tensor count, dtypes, size and key prefixes of a "
                                   "checkpoint, and compare it with the LingBot-Map architecture. Exit code: "
                                   "0 fits, 1 does not fit, 2 unreadable or refused (e.g. a pickle that would "
                                   "run code).")
    p.add_argument("path", help="checkpoint file (.pt / .pth / .safetensors)")
    p.add_argument("--arch", default=None,
                   help="architecture to compare with (default: vggt-1b for a file with a track head and no "
                        "scale token, else lingbot-map)")
    p.add_argument("--limit", type=int, default=10, metavar="N", help="names listed per problem kind (default 10)")
    p.add_argument("--keys", action="store_true", help="also list every tensor with its shape and dtype")

    sub.add_parser("list", help="list the released checkpoints known to ReconStudio")

    p = sub.add_parser("download", help="download a released checkpoint from the Hugging Face hub",
                       description="Download a released checkpoint (default: lingbot-map) from the Hugging "
                                   "Face hub into its cache, or into --dest. Prints the local path.")
    p.add_argument("name", nargs="?", default="lingbot-map", help="a name from `model list` (default lingbot-map)")
    p.add_argument("--repo", help="any hub model repository instead of a known name (with --file)")
    p.add_argument("--file", help="file name inside --repo")
    p.add_argument("--dest", help="folder to place the file in (default: the Hugging Face cache)")


def main(args: argparse.Namespace) -> int:
    return {"inspect": _inspect, "list": _list, "download": _download}[args.action](args)


# --- inspect ---------------------------------------------------------------------------------

def _inspect(args) -> int:
    from engine.api import CheckpointError, EngineError
    from engine.checkpoint import architecture_shapes, compare_shapes, inspect_checkpoint

    try:
        info = inspect_checkpoint(args.path)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"file:       {info.path} ({_gb(info.file_bytes)})")
    print(f"format:     {_FORMAT_NAMES.get(info.format, info.format)}")
    wrapper = f"{info.wrapper!r}" if info.wrapper else "none (bare state dict)"
    if info.ignored_entries:
        wrapper += f"; other entries left alone: {', '.join(info.ignored_entries[:args.limit])}"
    print(f"wrapper:    {wrapper}")
    if info.stripped_prefix:
        print(f"prefix:     {info.stripped_prefix!r} removed from every key")
    print(f"tensors:    {info.num_tensors:,} ({info.num_values:,} values, {_gb(info.tensor_bytes)})")
    print("dtypes:     " + ", ".join(f"{d} ×{n}" for d, n in info.dtypes().items()))
    if info.dataless:
        print(f"note:       {info.dataless:,} tensors hold no data (saved from the meta device): "
              f"shapes only, this file cannot be loaded")
    if info.metadata:
        print("metadata:   " + ", ".join(f"{k}={v}" for k, v in list(info.metadata.items())[:8]))
    print("prefixes:")
    top = info.prefixes(1)
    second = info.prefixes(2)
    for prefix, n, values in top:
        print(f"  {prefix:<34} {n:>6,} tensors {values:>15,} values")
        subs = [(sp if sp != prefix else f"{prefix} (own)", sn, sv) for sp, sn, sv in second
                if sp == prefix or sp.startswith(prefix + ".")]
        if len(subs) > 1:
            for sp, sn, sv in subs:
                print(f"    {sp:<32} {sn:>6,} tensors {sv:>15,} values")
    if args.keys:
        print("keys:")
        for name, (shape, dtype) in info.tensors.items():
            print(f"  {name}\t{list(shape)}\t{dtype}")

    if args.arch is None:
        args.arch = _detect_arch(info.tensors)
    try:
        expected = architecture_shapes(args.arch)
    except EngineError as exc:
        print(f"error: cannot build the {args.arch} architecture to compare with: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # an unknown architecture name or a model bug: say so, do not crash
        print(f"error: cannot build the {args.arch} architecture to compare with: {exc}", file=sys.stderr)
        return 2
    diff = compare_shapes(info.shapes(), expected)
    print(f"architecture: {args.arch} ({len(expected):,} tensors)")
    ignored = diff.ignored_line()
    if diff.fits:
        note = "every tensor present with the right shape"
        if set(d for _, d in info.tensors.values()) - {"float32"}:
            note += "; dtypes are converted to the model's on load"
        print(f"result:     FITS — {note}")
        if ignored:
            print(f"            {ignored}")
        return 0
    print("result:     DOES NOT FIT")
    for line in diff.problem_lines(args.limit):
        print(f"  - {line}")
    if ignored:
        print(f"  - {ignored}")
    return 1


def _detect_arch(names) -> str:
    """VGGT files carry a track head and no scale token; LingBot-Map files have the scale token."""
    names = set(names)
    if "aggregator.scale_token" not in names and any(n.startswith("track_head.") for n in names):
        return "vggt-1b"
    return "lingbot-map"


# --- list / download -------------------------------------------------------------------------

def _list(args) -> int:
    from engine.hub import KNOWN_CHECKPOINTS, cached_checkpoint

    for ck in KNOWN_CHECKPOINTS:
        cached = cached_checkpoint(ck.repo_id, ck.filename)
        print(f"{ck.name:<20} {ck.repo_id}/{ck.filename}  ~{_gb(ck.size_bytes)}  engine {ck.engine}")
        print(f"{'':<20} {ck.description}" + (f"\n{'':<20} cached: {cached}" if cached else ""))
    return 0


def _download(args) -> int:
    from engine.api import EngineError
    from engine.hub import download_checkpoint, known_checkpoint

    try:
        if args.repo or args.file:
            if not (args.repo and args.file):
                print("error: --repo and --file go together", file=sys.stderr)
                return 2
            repo_id, filename = args.repo, args.file
        else:
            ck = known_checkpoint(args.name)
            repo_id, filename = ck.repo_id, ck.filename
            print(f"downloading {repo_id}/{filename} (~{_gb(ck.size_bytes)})", file=sys.stderr)
        path = download_checkpoint(repo_id, filename, dest_dir=args.dest)   # hub's own tqdm bar
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"
