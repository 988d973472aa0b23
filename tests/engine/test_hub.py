"""Hub download helper: known checkpoints, progress reporting, and clear errors when offline or
when the file does not exist. No real network: a local fake hub (HF_ENDPOINT) and a fake cache.

huggingface_hub reads HF_ENDPOINT / HF_HUB_OFFLINE / HF_HOME at import, so each case runs in a
fresh interpreter."""
import json
import subprocess
import sys
import textwrap

import pytest

from engine.api import EngineError
from engine.hub import KNOWN_CHECKPOINTS, _callback_tqdm, known_checkpoint
from tests.conftest import REPO

COMMIT = "0123456789abcdef0123456789abcdef01234567"

# A minimal stand-in for the hub's file endpoint: HEAD/GET /<repo>/resolve/<rev>/<file>.
FAKE_HUB = textwrap.dedent('''
    import hashlib, os, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    FILES = {("robbyant/lingbot-map", "lingbot-map.pt"): bytes(range(256)) * 4096}   # 1 MiB
    class Hub(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def _lookup(self):
            parts = self.path.split("?")[0].strip("/").split("/")
            repo, rest = "/".join(parts[:2]), parts[2:]
            if repo not in {r for r, _ in FILES}:
                return None, "RepoNotFound"
            data = FILES.get((repo, "/".join(rest[2:])))
            return data, (None if data is not None else "EntryNotFound")
        def _head(self):
            data, err = self._lookup()
            if err:
                self.send_response(404); self.send_header("X-Error-Code", err)
                self.send_header("Content-Length", "0"); self.end_headers(); return None
            self.send_response(200)
            self.send_header("X-Repo-Commit", "%(commit)s")
            self.send_header("ETag", '"%%s"' %% hashlib.sha256(data).hexdigest())
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return data
        def do_HEAD(self):
            self._head()
        def do_GET(self):
            data = self._head()
            if data is not None:
                self.wfile.write(data)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ["HF_ENDPOINT"] = "http://127.0.0.1:%%d" %% server.server_port
''' % {"commit": COMMIT})


def _run(code, tmp_path, offline=False, fake_hub=False):
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1" if offline else "0",
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1", "PATH": "/usr/bin:/bin",
           "HF_HUB_ETAG_TIMEOUT": "5"}
    script = (FAKE_HUB if fake_hub else "") + textwrap.dedent(code)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_known_checkpoints_table():
    names = [c.name for c in KNOWN_CHECKPOINTS]
    assert names == ["lingbot-map", "lingbot-map-long", "lingbot-map-stage1", "vggt-1b"]
    assert known_checkpoint("vggt-1b").engine == "vggt-1b"
    ck = known_checkpoint("lingbot-map")
    assert (ck.repo_id, ck.filename, ck.engine) == ("robbyant/lingbot-map", "lingbot-map.pt", "lingbot-map")
    assert known_checkpoint("lingbot-map-long.pt").name == "lingbot-map-long"
    assert 4.5e9 < ck.size_bytes < 4.8e9
    with pytest.raises(EngineError, match="unknown checkpoint 'nope'; known: lingbot-map"):
        known_checkpoint("nope")


def test_progress_adaptor_reports_bytes():
    calls = []
    bar = _callback_tqdm(lambda done, total: calls.append((done, total)))(total=1000, unit="B", desc="x")
    bar.update(300)
    bar.update(700)
    bar.close()
    assert calls[0] == (0, 1000) and calls[-1] == (1000, 1000)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


DOWNLOAD = '''
    import json
    from engine.hub import download_checkpoint, DownloadError
    def attempt(repo, name, **kw):
        calls = []
        try:
            p = download_checkpoint(repo, name, progress=lambda d, t: calls.append((d, t)), **kw)
            return {"path": str(p), "size": p.stat().st_size, "head": list(p.read_bytes()[:4]), "calls": calls}
        except DownloadError as e:
            return {"error": str(e), "calls": calls}
'''


def test_download_from_a_fake_hub_with_progress(tmp_path):
    res = _run(DOWNLOAD + '''
    r = attempt("robbyant/lingbot-map", "lingbot-map.pt")
    again = attempt("robbyant/lingbot-map", "lingbot-map.pt")      # served from the cache
    dest = attempt("robbyant/lingbot-map", "lingbot-map.pt", dest_dir="%s")
    print(json.dumps({"r": r, "again": again, "dest": dest}))
    ''' % (tmp_path / "mine"), tmp_path, fake_hub=True)
    r = res["r"]
    assert r["size"] == 1 << 20 and r["head"] == [0, 1, 2, 3]
    assert f"snapshots/{COMMIT}/lingbot-map.pt" in r["path"]
    assert res["again"]["path"] == r["path"]
    assert res["dest"]["path"] == str(tmp_path / "mine" / "lingbot-map.pt") and res["dest"]["size"] == 1 << 20
    calls = r["calls"]
    assert {t for _, t in calls} == {1 << 20}
    assert len(calls) >= 2 and calls[-1] == [1 << 20, 1 << 20]        # the GUI sees the download complete
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert res["again"]["calls"] == [[1 << 20, 1 << 20]]               # cached: completion only


def test_missing_repo_and_file_give_clear_errors(tmp_path):
    res = _run(DOWNLOAD + '''
    print(json.dumps({"repo": attempt("nobody/nothing", "x.pt"),
                      "file": attempt("robbyant/lingbot-map", "nope.pt")}))
    ''', tmp_path, fake_hub=True)
    assert "repository 'nobody/nothing' does not exist" in res["repo"]["error"]
    assert "robbyant/lingbot-map has no file named 'nope.pt'" in res["file"]["error"]


def test_offline_without_cache_says_what_to_do(tmp_path):
    res = _run(DOWNLOAD + '''
    print(json.dumps(attempt("robbyant/lingbot-map", "lingbot-map.pt")))
    ''', tmp_path, offline=True)
    msg = res["error"]
    assert "offline" in msg and "not in the local cache" in msg
    assert "download the file by hand and choose it with 'Checkpoint…'" in msg


def _cached_snapshot(tmp_path, filename: str, data: bytes):
    """A Hugging Face cache under tmp_path/hf holding `filename` of robbyant/lingbot-map at COMMIT."""
    snap = tmp_path / "hf" / "hub" / "models--robbyant--lingbot-map" / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / filename).write_bytes(data)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text(COMMIT)
    return snap


def test_offline_uses_the_cache(tmp_path):
    snap = _cached_snapshot(tmp_path, "lingbot-map.pt", b"cached weights")
    res = _run(DOWNLOAD + '''
    from engine.hub import cached_checkpoint
    r = attempt("robbyant/lingbot-map", "lingbot-map.pt")
    r["cached"] = str(cached_checkpoint("robbyant/lingbot-map", "lingbot-map.pt"))
    print(json.dumps(r))
    ''', tmp_path, offline=True)
    assert res["path"] == str(snap / "lingbot-map.pt") == res["cached"]
    assert res["size"] == len(b"cached weights")


def test_unreachable_hub(tmp_path):
    # Nothing listens on this port: the connection is refused at once. A cached file is still served.
    snap = _cached_snapshot(tmp_path, "lingbot-map-long.pt", b"cached")
    res = _run('''
    import json, os, socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    os.environ["HF_ENDPOINT"] = "http://127.0.0.1:%d" % port
    ''' + DOWNLOAD + '''
    print(json.dumps({"missing": attempt("robbyant/lingbot-map", "lingbot-map.pt"),
                      "cached": attempt("robbyant/lingbot-map", "lingbot-map-long.pt")}))
    ''', tmp_path)
    msg = res["missing"]["error"]
    assert "cannot reach the Hugging Face hub" in msg and "refused" in msg.lower() and "Checkpoint…" in msg
    assert res["cached"]["path"] == str(snap / "lingbot-map-long.pt")
