"""Entry script of the PyInstaller bundle: the same `reconstudio` command as the installed one."""
import multiprocessing
import sys

from app.cli import main


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)     # SystemExit("message") semantics
    return 1


if __name__ == "__main__":
    multiprocessing.freeze_support()   # worker processes of a frozen app re-enter here
    try:
        code = _exit_code(main())
    except SystemExit as exc:          # argparse --help / usage errors
        code = _exit_code(exc.code)
    # No os._exit here any more: the abort in the final garbage collection ("none_dealloc",
    # exit 134) was PySide6 6.12.0's, which pyproject.toml now excludes (docs/packaging.md).
    sys.exit(code)
