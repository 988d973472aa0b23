"""One run path: the GUI's run and `reconstudio run` on the same input drive the engine through the
same objects (a RunDriver over a session of the stream layer, engine/shared_streams.py) and store
the same results, bit for bit (tiny LingBot-Map, CPU)."""
import numpy as np
import pytest
import torch
from PIL import Image

from tests.ui.conftest import wait_finished

SETTINGS = dict(image_width=70, scale_frames=2, window=3, special_cap=8, camera_iterations=2,
                keyframe_interval=2, device="cpu", dtype="fp32")


@pytest.fixture
def capture(monkeypatch):
    """Every result a StoreSink receives, by session folder, and what each RunDriver drove."""
    from engine import run_driver

    stored: dict = {}
    drivers: list = []
    on_results, run = run_driver.StoreSink.on_results, run_driver.RunDriver.run

    def spy_results(self, results):
        stored.setdefault(str(self.store.folder), []).extend(results)
        return on_results(self, results)

    def spy_run(self):
        inner = getattr(self.session, "stream", None)
        drivers.append((type(self), type(self.session), type(inner.session) if inner else None))
        return run(self)

    monkeypatch.setattr(run_driver.StoreSink, "on_results", spy_results)
    monkeypatch.setattr(run_driver.RunDriver, "run", spy_run)
    return stored, drivers


def test_gui_and_run_drive_the_same_objects_and_store_the_same_results(qtbot, make_window, tmp_path, capture):
    from app.cli import main
    from engine import build_model
    from engine.models.recipe import fill_recipe
    from engine.shared_streams import SharedSession

    stored, drivers = capture
    folder = tmp_path / "frames"
    folder.mkdir()
    rng = np.random.default_rng(5)
    for i in range(7):
        Image.fromarray(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    model = fill_recipe(build_model("lingbot-map-tiny"))
    ckpt = tmp_path / "tiny.pt"
    torch.save(model.state_dict(), ckpt)

    w = make_window(engine="lingbot-map", **SETTINGS)
    w.model = model                                   # the GUI's loaded network
    w.set_input(str(folder))
    assert w.start_run()
    gui = wait_finished(qtbot, w, timeout=120_000)
    assert gui["error"] is None and gui["results"] == 7

    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()]
    cli_dir = tmp_path / "cli-session"
    assert main(["run", str(folder), "--engine", "lingbot-map", "--model", "lingbot-map-tiny",
                 "--checkpoint", str(ckpt), *flags, "--session-dir", str(cli_dir), "-q"]) == 0

    # the same driver, over the same session type, over the same engine session
    assert len(drivers) == 2 and drivers[0] == drivers[1]
    assert drivers[0][1] is SharedSession and drivers[0][2].__name__ == "LingBotMapSession"
    got_gui, got_cli = stored[gui["session"]], stored[str(cli_dir)]
    assert [r.index for r in got_gui] == [r.index for r in got_cli] == list(range(7))
    for g, c in zip(got_gui, got_cli):
        assert g.is_keyframe == c.is_keyframe
        for name in ("pose_enc", "c2w", "K", "depth", "conf", "image"):
            np.testing.assert_array_equal(getattr(g, name), getattr(c, name), err_msg=f"frame {g.index} {name}")
