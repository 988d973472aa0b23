"""Export density benchmark: points drawn in the GUI after a run against the PLY the GUI exports
and the PLY `reconstudio run --ply` writes for the same clip, at several absolute thresholds.

    QT_QPA_PLATFORM=xcb xvfb-run -a .venv/bin/python benchmarks/export_density.py [CLIP] [--engine geometric]

Prints one line per threshold (figures for docs/benchmarks_io.md); writes into a temp folder.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("clip", nargs="?", default=str(REPO / "resources" / "sample" / "icl_livingroom_kt3.mp4"))
    p.add_argument("--engine", default="geometric")
    p.add_argument("--stride", type=int, default=2)
    p.add_argument("--thresholds", default="0,2,5,10")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="reconstudio-density-"))
    os.environ["RECONSTUDIO_SESSIONS"] = str(tmp / "sessions")
    os.environ["RECONSTUDIO_SETTINGS"] = str(tmp / "settings.ini")
    from plyfile import PlyData
    from PySide6 import QtWidgets

    app = QtWidgets.QApplication([])
    from app.settings import AppSettings
    from ui.main_window import MainWindow

    w = MainWindow(settings=AppSettings(), session_root=str(tmp / "sessions"))
    c = w.settings_panel.config()
    c.engine = a.engine
    w.settings_panel.set_config(c)
    w.resize(1280, 720)
    w.show()
    w.set_input(a.clip)
    w.stride.setValue(a.stride)
    done = []
    w.runFinished.connect(done.append)
    w.start_run()
    while not done:
        app.processEvents()
    for t in (float(x) for x in a.thresholds.split(",")):
        w.set_conf_threshold(t)
        app.processEvents()
        drawn = w.drawn_point_count()
        gui_ply, cli_ply = tmp / f"gui_{t:g}.ply", tmp / f"cli_{t:g}.ply"
        if w.export("ply", str(gui_ply)) is None:
            print(f"threshold {t:g}: GUI export not written ({w.banner.label.text()})")
            continue
        n = len(PlyData.read(str(gui_ply))["vertex"])
        subprocess.run([sys.executable, "-m", "app", "run", a.clip, "--engine", a.engine, "--ply", str(cli_ply),
                        "-q", "--conf-threshold", str(t), "--stride", str(a.stride)], check=True, cwd=REPO)
        m = len(PlyData.read(str(cli_ply))["vertex"])
        print(f"threshold {t:g}: loaded {w.viewer.point_count}, drawn {drawn}, GUI PLY {n} "
              f"({100 * n / max(drawn, 1):.1f} % of drawn), run --ply {m} ({100 * m / max(n, 1):.1f} % of GUI PLY)",
              flush=True)
    w.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
