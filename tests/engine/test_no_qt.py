"""The engine package and all its modules import with Qt blocked."""
import importlib
import pkgutil
import subprocess
import sys

from tests.conftest import REPO


def test_engine_imports_without_qt():
    code = (
        "import sys\n"
        "from tests.conftest import _BlockQt\n"
        "sys.meta_path.insert(0, _BlockQt())\n"
        "import importlib, pkgutil, engine\n"
        "for m in pkgutil.walk_packages(engine.__path__, 'engine.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in _BlockQt.BLOCKED]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_blocker_really_blocks():
    code = (
        "import sys\n"
        "from tests.conftest import _BlockQt\n"
        "sys.meta_path.insert(0, _BlockQt())\n"
        "import PySide6\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode != 0 and "blocked" in out.stderr
