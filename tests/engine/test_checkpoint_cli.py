"""`reconstudio model inspect` against the full-size LingBot-Map key list (the fixtures' TSV is the
oracle; the command compares with the model built on the meta device), and the other sub-actions.

Full-size files are made without 4.6 GB of disk or RAM: a .pt of meta tensors (shapes only) and a
sparse .safetensors file (a real header, the data region a hole)."""
import json
import struct
import subprocess
import sys

import pytest
import torch

from app.cli import main as cli_main
from engine.checkpoint import architecture_shapes, compare_shapes, read_key_list
from tests.conftest import FIXTURES, REPO

_ST_DTYPES = {"float32": ("F32", 4), "bfloat16": ("BF16", 2)}


@pytest.fixture(scope="module")
def tsv_shapes():
    return read_key_list(FIXTURES / "lingbot_map_keys.tsv")


def _sparse_safetensors(path, shapes, dtype="float32"):
    code, size = _ST_DTYPES[dtype]
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = size
        for d in shape:
            n *= d
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + offset)     # a hole: no disk used
    return path


def _meta_pt(path, shapes, wrapper=None):
    with torch.device("meta"):
        sd = {k: torch.empty(s) for k, s in shapes.items()}
    torch.save({wrapper: sd} if wrapper else sd, path)
    return path


def _inspect(capsys, path, *extra):
    rc = cli_main(["model", "inspect", str(path), *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_model_architecture_equals_the_released_key_list(tsv_shapes):
    diff = compare_shapes(architecture_shapes("lingbot-map"), tsv_shapes, ignore_prefixes=())
    assert diff.fits, diff.problem_lines()
    assert len(diff.matched) == 1342


def test_inspect_full_size_meta_state_dict_fits(tmp_path, capsys, tsv_shapes):
    rc, out, _ = _inspect(capsys, _meta_pt(tmp_path / "lingbot-map.pt", tsv_shapes, wrapper="model"))
    assert rc == 0
    assert "PyTorch zip" in out and "wrapper:    'model'" in out
    assert "tensors:    1,342 (1,157,943,540 values, 4.63 GB)" in out
    assert "dtypes:     float32 ×1342" in out
    assert "aggregator" in out and "camera_head" in out and "depth_head" in out
    assert "aggregator.frame_blocks" in out and "aggregator.global_blocks" in out
    assert "result:     FITS" in out


def test_inspect_full_size_sparse_safetensors_bf16_with_point_head(tmp_path, capsys, tsv_shapes):
    shapes = dict(tsv_shapes)
    shapes["point_head.scratch.output_conv2.2.weight"] = (4, 128, 1, 1)
    path = _sparse_safetensors(tmp_path / "lingbot-map-bf16.safetensors", shapes, "bfloat16")
    assert path.stat().st_size > 2.3e9
    rc, out, _ = _inspect(capsys, path)
    assert rc == 0, out
    assert "safetensors" in out and "bfloat16 ×1343" in out and "metadata:   format=pt" in out
    assert "FITS" in out and "converted to the model's on load" in out
    assert "skipped 1 extra key(s) the model does not use (point_head.* ×1)" in out


def test_inspect_non_fitting_file(tmp_path, capsys, tsv_shapes):
    shapes = dict(tsv_shapes)
    del shapes["aggregator.scale_token"]                         # a VGGT-like aggregator
    shapes["depth_head.scratch.output_conv1.weight"] = (1, 1, 1, 1)
    shapes["head.fc.weight"] = (10, 2048)
    rc, out, _ = _inspect(capsys, _meta_pt(tmp_path / "other.pt", shapes), "--limit", "3")
    assert rc == 1
    assert "DOES NOT FIT" in out
    assert "1 missing key(s)" in out and "aggregator.scale_token" in out
    assert "1 unexpected key(s)" in out and "head.fc.weight" in out
    assert "depth_head.scratch.output_conv1.weight (model [128, 256, 3, 3], file [1, 1, 1, 1])" in out


def test_inspect_keys_listing(tmp_path, capsys):
    torch.save({"a.weight": torch.zeros(2, 3, dtype=torch.float16)}, tmp_path / "small.pt")
    rc, out, _ = _inspect(capsys, tmp_path / "small.pt", "--keys")
    assert rc == 1
    assert "a.weight\t[2, 3]\tfloat16" in out
    assert "1342 missing key(s)" in out


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


def test_inspect_unreadable_and_refused_files(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not weights")
    rc, out, err = _inspect(capsys, tmp_path / "notes.txt")
    assert rc == 2 and "not a model checkpoint" in err and out == ""
    rc, _, err = _inspect(capsys, tmp_path / "absent.pt")
    assert rc == 2 and "not found" in err
    marker = tmp_path / "PWNED"
    torch.save({"x": _Payload(marker)}, tmp_path / "evil.pt")
    rc, _, err = _inspect(capsys, tmp_path / "evil.pt")
    assert rc == 2 and "not a plain weights file" in err and "Nothing in it was executed" in err
    assert not marker.exists()


def test_inspect_unknown_architecture(tmp_path, capsys):
    torch.save({"a": torch.zeros(1)}, tmp_path / "a.pt")
    rc, _, err = _inspect(capsys, tmp_path / "a.pt", "--arch", "nonsense")
    assert rc == 2 and "unknown model 'nonsense'" in err


def test_model_list(capsys):
    assert cli_main(["model", "list"]) == 0
    out = capsys.readouterr().out
    assert "robbyant/lingbot-map/lingbot-map.pt" in out and "lingbot-map-long.pt" in out
    assert "lingbot-map-stage1.pt" in out


def test_module_imports_nothing_heavy_and_download_offline(tmp_path):
    code = ("import sys, app.cmd_model\n"
            "heavy = [m for m in ('torch', 'cv2', 'PySide6', 'huggingface_hub', 'safetensors') if m in sys.modules]\n"
            "assert not heavy, heavy\n"
            "from app.cli import main\n"
            "sys.exit(main(['model', 'download', 'lingbot-map-long']))\n")
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "lingbot-map-long.pt" in out.stderr and "offline" in out.stderr and "Checkpoint…" in out.stderr


def test_inspect_notes_a_shapes_only_file(tmp_path, capsys, tsv_shapes):
    rc, out, _ = _inspect(capsys, _meta_pt(tmp_path / "shapes.pt", tsv_shapes))
    assert rc == 0 and "1,342 tensors hold no data" in out
    assert "aggregator (own)                      3 tensors" in out
