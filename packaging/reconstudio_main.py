"""Entry script of the PyInstaller bundle: the same `reconstudio` command as the installed one."""
import logging
import multiprocessing
import os
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
    if getattr(sys, "frozen", False) and "PySide6" in sys.modules:
        # In the frozen app, CPython's final garbage collection can abort inside PySide6's
        # wrappers ("Fatal Python error: none_dealloc", exit 134) after all work is done. By
        # now the session store is closed and QSettings synced, so skip finalization.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
