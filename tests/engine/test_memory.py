"""engine.memory.bound_heap: applied once on glibc, never over the user's MALLOC_* settings."""
import os
import subprocess
import sys

from tests.conftest import REPO

CODE = "from engine.memory import bound_heap; print(bound_heap(), bound_heap())"


def _run(env):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env
    return subprocess.run([sys.executable, "-c", CODE], cwd=REPO, env=env, capture_output=True,
                          text=True, check=True).stdout.split()


def test_applied_on_glibc_and_user_settings_win():
    if sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION"):
        assert _run({}) == ["True", "True"]
    assert _run({"MALLOC_ARENA_MAX": "4"}) == ["False", "False"]


def test_trim_heap_runs_anywhere():
    code = "from engine.memory import trim_heap; import numpy as np; a = [np.ones(4096) for _ in range(2000)]; " \
           "del a[::2]; print(type(trim_heap()).__name__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["bool"]
