"""Entry script of the PyInstaller bundle: the same `reconstudio` command as the installed one."""
import multiprocessing
import sys

from app.cli import main

if __name__ == "__main__":
    multiprocessing.freeze_support()   # worker processes of a frozen app re-enter here
    sys.exit(main())
