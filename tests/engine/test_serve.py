"""`reconstudio serve` (engine/share.py + app/cmd_serve.py): a viser server shows a session's points,
keyframe frustums and a timeline, grows with a live run, honours the session's edits, and a
browser client (HTTP page + the viser WebSocket, decoded as its client does) receives them."""
import asyncio
import socket
import time
import urllib.request

import msgspec
import pytest
import viser
import websockets
import zstandard

from engine.api import SessionConfig
from engine.io.edits import BoxCrop, SessionEdits, save_edits
from engine.io.store import SessionStore
from engine.share import SessionView
from tests.engine.test_edits import H, W, _results


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _client_state(port: int, seconds: float = 5.0) -> dict:
    """What a browser receives on connecting: {node name: visible} of the point clouds and
    frustums, and the GUI sliders' values (the wire format: zstd msgpack + binary buffers)."""
    async def go():
        msgs = []
        async with websockets.connect(f"ws://127.0.0.1:{port}", max_size=None,
                                      subprotocols=[f"viser-v{viser.__version__}"]) as ws:
            t = time.monotonic()
            while time.monotonic() - t < seconds:
                try:
                    m = await asyncio.wait_for(ws.recv(), 1.0)
                except asyncio.TimeoutError:
                    break
                n_in, n_c = int.from_bytes(m[:8], "little"), int.from_bytes(m[8:16], "little")
                inner = zstandard.ZstdDecompressor().decompress(m[16:16 + n_c], max_output_size=n_in)
                msgs += msgspec.msgpack.decode(inner)["messages"]
                if any(x.get("type") == "ReplayDoneMessage" for x in msgs):
                    break
        return msgs
    msgs = asyncio.run(go())
    nodes, sliders = {}, []
    for m in msgs:
        if m["type"] in ("PointCloudMessage", "CameraFrustumMessage"):
            nodes[m["name"]] = True
        elif m["type"] == "SetSceneNodeVisibilityMessage" and m["name"] in nodes:
            nodes[m["name"]] = m["visible"]
        elif m["type"] == "GuiSliderMessage":
            sliders.append(m["value"])
    return {"nodes": nodes, "sliders": sliders}


@pytest.fixture
def server():
    port = _port()
    s = viser.ViserServer(host="127.0.0.1", port=port, verbose=False)
    yield s
    s.stop()


def test_session_points_frustums_timeline_and_client(server, tmp_path):
    folder = tmp_path / "s"
    with SessionStore(folder, SessionConfig(engine="synthetic"), "test", image_codec="raw") as st:
        for r in _results():
            st.write(r)
    view = SessionView(server, folder, stride=2, max_points_per_frame=10_000)
    assert view.update() == 4 and view.update() == 0            # nothing new: nothing re-sent
    assert view.indices == [0, 1, 2, 3] and set(view.cameras) == {0, 1, 2, 3}
    assert all(n == (H // 2) * (W // 2) for n in view.points.values())
    assert view.slider.value == 3 and view.visible_frames() == [0, 1, 2, 3]
    view.follow.value = False
    view.slider.value = 1                                       # the timeline: frames up to 1
    view._apply_timeline()
    assert view.visible_frames() == [0, 1] and not view.cameras[3].visible
    html = urllib.request.urlopen(f"http://127.0.0.1:{server.get_port()}/", timeout=20).read()
    assert b"<html" in html.lower()
    state = _client_state(server.get_port())
    assert {f"/frames/{i:06d}" for i in range(4)} <= set(state["nodes"])
    assert {f"/cameras/{i:06d}" for i in range(4)} <= set(state["nodes"])
    assert state["nodes"]["/frames/000001"] and not state["nodes"]["/frames/000003"]
    assert 1 in state["sliders"]
    # the session's edits reach the browser as they reach the exports
    save_edits(folder, SessionEdits(crops=[BoxCrop.from_bounds([-9, -9, 0], [0.0, 9, 9])]))
    assert view.update() == 4                                   # placement changed: re-sent
    assert 0 < sum(view.points.values()) < 0.75 * 4 * (H // 2) * (W // 2)
    view.close()


def test_live_session_grows(server, tmp_path):
    folder = tmp_path / "live"
    rs = _results()
    st = SessionStore(folder, SessionConfig(engine="synthetic"), "test", image_codec="raw")
    for r in rs[:2]:
        st.write(r)
    view = SessionView(server, folder, stride=4)
    assert view.update() == 2 and view.slider.value == 1
    for r in rs[2:]:
        st.write(r)
    assert view.update() == 2 and view.indices == [0, 1, 2, 3] and view.slider.value == 3   # follows the end
    st.close()
    view.close()


def test_cli_serve_until_sigterm(tmp_path, capsys):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from app.cli import main
    folder = tmp_path / "s"
    with SessionStore(folder, SessionConfig(engine="synthetic"), "test", image_codec="raw") as st:
        for r in _results():
            st.write(r)
    port = _port()
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "app", "serve", str(folder), "--port", str(port), "--live"],
                            cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        state = {"nodes": {}}
        while time.monotonic() < deadline and "/frames/000003" not in state["nodes"] and proc.poll() is None:
            time.sleep(0.5)
            try:
                state = _client_state(port, seconds=3)
            except OSError:
                continue
        assert "/frames/000003" in state["nodes"] and "/cameras/000000" in state["nodes"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "serving" in proc.stderr.read()
    assert main(["serve"]) == 2 and "give a SESSION" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "nope"), "--port", str(_port())]) == 2
    assert "not found" in capsys.readouterr().err


def test_live_without_a_session_takes_the_newest(tmp_path, monkeypatch, capsys):
    from app.cli import main
    from engine.share import newest_session
    monkeypatch.setenv("RECONSTUDIO_SESSIONS", str(tmp_path / "root"))
    assert main(["serve", "--live"]) == 2 and "no session" in capsys.readouterr().err
    for name in ("a", "b"):
        with SessionStore(tmp_path / "root" / name, SessionConfig(engine="synthetic"), "t", image_codec="raw") as st:
            st.write(_results()[0])
        time.sleep(0.05)
    assert newest_session() == tmp_path / "root" / "b"
