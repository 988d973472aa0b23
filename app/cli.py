"""`reconstudio` command line: `gui` (default), `run`, `eval`, `bench`, `model inspect`, `serve`.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `main(args) -> int`;
they are imported lazily so `reconstudio run` never loads Qt and `reconstudio gui` starts fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from engine.api import missing_dependency

# subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "gui": ("app.cmd_gui", "open the desktop application (default)"),
    "run": ("app.cmd_run", "reconstruct a video / image folder headless and export the results"),
    "eval": ("app.cmd_eval", "run a sequence with ground truth and print ATE / RPE / depth metrics"),
    "bench": ("app.cmd_bench", "benchmark a neural engine (FPS, latency, GPU memory)"),
    "model": ("app.cmd_model", "checkpoint tools: `model inspect PATH`"),
    "serve": ("app.cmd_serve", "a browser view (viser) of a session, or of a run as it goes (--live)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reconstudio",
        description="ReconStudio: live 3D reconstruction from a webcam, a video or an image folder.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:  # a missing optional part must not break the other commands
            if missing_dependency(exc) is None:
                raise               # a broken import of our own code: fail loudly
            p.set_defaults(_unavailable=f"{name}: unavailable ({exc})")
            continue
        mod.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["gui"] + argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_unavailable", None):
        print(args._unavailable, file=sys.stderr)
        return 2
    mod = importlib.import_module(args._module)
    try:
        return int(mod.main(args) or 0)
    except BrokenPipeError:  # output piped into `head` etc.: not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
