"""Checkpoint loading: formats, wrappers, dtype conversion, strictness and its messages, refusal of
pickles that would run code, damaged files."""
import os
import pickle
import zipfile

import pytest
import torch
from safetensors.torch import save_file

from engine.api import CheckpointError
from engine.checkpoint import (BENIGN_EXTRA_PREFIXES, compare_shapes, inspect_checkpoint,
                               load_checkpoint)


class Tiny(torch.nn.Module):
    """A small model with the same kinds of entries as LingBot-Map: tokens, blocks, a conv head,
    LayerNorm, and a persistent buffer."""

    def __init__(self, width=8, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.aggregator = torch.nn.Module()
        self.aggregator.camera_token = torch.nn.Parameter(torch.randn(1, 2, 1, width))
        self.aggregator.blocks = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(3))
        self.depth_head = torch.nn.Sequential(torch.nn.Conv2d(width, 4, 3), torch.nn.LayerNorm(4))
        self.register_buffer("scale", torch.randn(3))


def _sd(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(model, sd):
    got = model.state_dict()
    assert set(got) == set(sd)
    for k, v in sd.items():
        assert torch.equal(got[k], v.to(got[k].dtype)), k


def _save(sd, path, fmt):
    if fmt == "safetensors":
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    elif fmt == "legacy":
        torch.save(sd, path, _use_new_zipfile_serialization=False)
    else:
        torch.save(sd, path)
    return path


@pytest.mark.parametrize("fmt,wrapper", [("pt", None), ("pt", "model"), ("pt", "state_dict"),
                                         ("legacy", None), ("legacy", "model"), ("safetensors", None)])
def test_round_trip(tmp_path, fmt, wrapper):
    src = Tiny(seed=1)
    sd = _sd(src)
    payload = {wrapper: sd, "epoch": 7, "optimizer": {"lr": 1e-4}} if wrapper else sd
    path = _save(payload, tmp_path / ("w.safetensors" if fmt == "safetensors" else "w.pt"), fmt)
    dst = Tiny(seed=2)
    assert not torch.equal(dst.aggregator.camera_token, src.aggregator.camera_token)
    report = load_checkpoint(dst, path)
    _assert_same(dst, sd)
    assert report.ok and report.loaded == len(sd)
    assert report.values == sum(v.numel() for v in sd.values())
    assert report.wrapper == wrapper
    assert report.format == {"pt": "pt", "legacy": "pt-legacy", "safetensors": "safetensors"}[fmt]
    if wrapper:
        assert report.ignored_entries == ["epoch", "optimizer"]


def test_extension_does_not_matter(tmp_path):
    # The format is recognised from the content: a safetensors file named .pt still loads.
    sd = _sd(Tiny(seed=1))
    path = _save(sd, tmp_path / "weights.pt", "safetensors")
    dst = Tiny(seed=2)
    assert load_checkpoint(dst, path).format == "safetensors"
    _assert_same(dst, sd)


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_bf16_checkpoint_into_fp32_model(tmp_path, fmt):
    sd16 = {k: v.to(torch.bfloat16) for k, v in _sd(Tiny(seed=1)).items()}
    path = _save(sd16, tmp_path / f"w16.{fmt}", fmt)
    dst = Tiny(seed=2)
    report = load_checkpoint(dst, path)
    for k, v in dst.state_dict().items():
        assert v.dtype == torch.float32, k
        assert torch.equal(v, sd16[k].float()), k
    assert report.converted == {"bfloat16->float32": len(sd16)}
    assert any("bfloat16 → float32" in w for w in report.warnings)


def test_fp32_checkpoint_into_bf16_model(tmp_path):
    sd = _sd(Tiny(seed=1))
    path = _save(sd, tmp_path / "w.pt", "pt")
    dst = Tiny(seed=2).to(torch.bfloat16)
    report = load_checkpoint(dst, path)
    for k, v in dst.state_dict().items():
        assert v.dtype == torch.bfloat16 and torch.equal(v, sd[k].to(torch.bfloat16)), k
    assert report.converted == {"float32->bfloat16": len(sd)}


def test_module_prefix_is_stripped(tmp_path):
    sd = _sd(Tiny(seed=1))
    path = _save({"module." + k: v for k, v in sd.items()}, tmp_path / "ddp.pt", "pt")
    dst = Tiny(seed=2)
    report = load_checkpoint(dst, path)
    _assert_same(dst, sd)
    assert report.stripped_prefix == "module."


def test_meta_model_is_assigned(tmp_path):
    sd = _sd(Tiny(seed=1))
    path = _save(sd, tmp_path / "w.safetensors", "safetensors")
    with torch.device("meta"):
        dst = Tiny()
    report = load_checkpoint(dst, path)
    assert not any(t.is_meta for t in dst.state_dict().values())
    assert isinstance(dst.aggregator.camera_token, torch.nn.Parameter)
    _assert_same(dst, sd)
    assert report.loaded == len(sd)


def test_progress_callback(tmp_path):
    sd = _sd(Tiny(seed=1))
    path = _save(sd, tmp_path / "w.pt", "pt")
    calls = []
    load_checkpoint(Tiny(seed=2), path, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(i + 1, len(sd)) for i in range(len(sd))]


# --- strictness and its messages ----------------------------------------------------------------

def _load_fails(tmp_path, sd, fmt="pt"):
    path = _save(sd, tmp_path / f"bad.{fmt}", fmt)
    dst = Tiny(seed=2)
    before = _sd(dst)
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(dst, path)
    _assert_same(dst, before)          # a refused file leaves the model untouched
    return str(exc.value), exc.value.report


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_missing_keys_are_named(tmp_path, fmt):
    sd = _sd(Tiny(seed=1))
    del sd["aggregator.blocks.1.weight"], sd["scale"]
    msg, report = _load_fails(tmp_path, sd, fmt)
    assert "2 missing key(s)" in msg
    assert "aggregator.blocks.1.weight" in msg and "scale" in msg
    assert sorted(report.missing) == ["aggregator.blocks.1.weight", "scale"]
    assert not report.unexpected and not report.mismatched


def test_unexpected_keys_are_named(tmp_path):
    sd = _sd(Tiny(seed=1))
    sd["aggregator.extra_token"] = torch.zeros(3)
    msg, report = _load_fails(tmp_path, sd)
    assert "1 unexpected key(s)" in msg and "aggregator.extra_token" in msg
    assert report.unexpected == ["aggregator.extra_token"]


def test_wrong_shapes_are_named_with_both_shapes(tmp_path):
    sd = _sd(Tiny(seed=1))
    sd["aggregator.blocks.0.weight"] = torch.zeros(8, 9)
    msg, report = _load_fails(tmp_path, sd, "safetensors")
    assert "1 key(s) with the wrong shape" in msg
    assert "aggregator.blocks.0.weight (model [8, 8], file [8, 9])" in msg
    assert report.mismatched == [("aggregator.blocks.0.weight", (8, 8), (8, 9))]


def test_many_problems_list_the_first_n(tmp_path):
    sd = _sd(Tiny(seed=1))
    for i in range(25):
        sd[f"junk.{i:02d}"] = torch.zeros(1)
    path = _save(sd, tmp_path / "many.pt", "pt")
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(Tiny(), path, max_names=5)
    msg = str(exc.value)
    assert "25 unexpected key(s)" in msg and "junk.04" in msg and "junk.05" not in msg
    assert "and 20 more" in msg


def test_benign_extras_are_skipped_with_a_warning(tmp_path):
    sd = _sd(Tiny(seed=1))
    extras = {"point_head.proj.weight": torch.zeros(4, 4), "point_head.proj.bias": torch.zeros(4),
              "track_head.tracker.w": torch.zeros(2)}
    path = _save({**sd, **extras}, tmp_path / "stage1.pt", "pt")
    dst = Tiny(seed=2)
    report = load_checkpoint(dst, path)
    _assert_same(dst, sd)
    assert report.ok and sorted(report.ignored) == sorted(extras)
    assert any("point_head.* ×2" in w and "track_head.* ×1" in w for w in report.warnings)
    # with no benign prefixes the same file is refused
    with pytest.raises(CheckpointError, match="3 unexpected"):
        load_checkpoint(Tiny(), path, ignore_prefixes=())


def test_non_strict_loads_what_fits(tmp_path):
    src = _sd(Tiny(seed=1))
    sd = dict(src)
    del sd["scale"]
    sd["aggregator.blocks.0.weight"] = torch.zeros(8, 9)
    sd["other.weight"] = torch.zeros(2)
    path = _save(sd, tmp_path / "w.pt", "pt")
    dst = Tiny(seed=2)
    before = _sd(dst)
    report = load_checkpoint(dst, path, strict=False)
    assert not report.ok
    assert report.missing == ["scale"] and report.unexpected == ["other.weight"]
    assert [k for k, _, _ in report.mismatched] == ["aggregator.blocks.0.weight"]
    got = dst.state_dict()
    assert torch.equal(got["scale"], before["scale"])
    assert torch.equal(got["aggregator.blocks.0.weight"], before["aggregator.blocks.0.weight"])
    assert torch.equal(got["aggregator.blocks.1.weight"], src["aggregator.blocks.1.weight"])
    assert report.loaded == len(src) - 2


# --- files that must be refused -------------------------------------------------------------------

class _Payload:
    """Unpickling this runs a shell command that creates a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("legacy", [False, True])
def test_malicious_pickle_is_refused_and_not_executed(tmp_path, legacy):
    marker = tmp_path / "PWNED"
    sd = _sd(Tiny(seed=1))
    payload = {"model": sd, "hook": _Payload(marker)}
    path = tmp_path / "evil.pt"
    torch.save(payload, path, _use_new_zipfile_serialization=not legacy)
    # the crafted file is real: an unsafe load does run the payload (proved on a copy)
    probe = tmp_path / "PROBE"
    torch.save({"hook": _Payload(probe)}, tmp_path / "probe.pt")
    torch.load(tmp_path / "probe.pt", weights_only=False)
    assert probe.exists()

    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(Tiny(), path)
    msg = str(exc.value)
    assert "not a plain weights file" in msg and "Nothing in it was executed" in msg
    assert "system" in msg                      # names what it wanted to run
    with pytest.raises(CheckpointError, match="not a plain weights file"):
        inspect_checkpoint(path)
    assert not marker.exists()


def test_plain_pickle_with_code_is_refused(tmp_path):
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        pickle.dump(_Payload(marker), f, protocol=2)
    with pytest.raises(CheckpointError, match="not a plain weights file"):
        load_checkpoint(Tiny(), path)
    assert not marker.exists()


def test_truncated_pt_file(tmp_path):
    good = _save(_sd(Tiny(seed=1)), tmp_path / "good.pt", "pt")
    data = good.read_bytes()
    bad = tmp_path / "cut.pt"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="damaged, incomplete"):
        load_checkpoint(Tiny(), bad)


def test_truncated_safetensors_file(tmp_path):
    good = _save(_sd(Tiny(seed=1)), tmp_path / "good.safetensors", "safetensors")
    data = good.read_bytes()
    for cut in (len(data) - 10, 12):
        bad = tmp_path / f"cut{cut}.safetensors"
        bad.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match="damaged or incomplete safetensors"):
            load_checkpoint(Tiny(), bad)


def test_zip_that_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "archive.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(CheckpointError, match="not a PyTorch checkpoint"):
        load_checkpoint(Tiny(), path)


@pytest.mark.parametrize("content,match", [
    (b"", "empty"),
    (b"# just some text\nnot weights\n", "not a model checkpoint"),
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "not a model checkpoint"),
])
def test_non_checkpoint_files(tmp_path, content, match):
    path = tmp_path / "x.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(Tiny(), path)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(Tiny(), tmp_path / "nope.pt")
    with pytest.raises(CheckpointError, match="is a folder"):
        load_checkpoint(Tiny(), tmp_path)


def test_not_a_dict_and_ambiguous_wrappers(tmp_path):
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="holds a list"):
        load_checkpoint(Tiny(), tmp_path / "list.pt")
    sd = _sd(Tiny(seed=1))
    torch.save({"state_dict": sd, "net": sd}, tmp_path / "two.pt")
    with pytest.raises(CheckpointError, match="several sets of weights"):
        load_checkpoint(Tiny(), tmp_path / "two.pt")
    torch.save({"epoch": 3, "optimizer": {"lr": 0.1}}, tmp_path / "none.pt")
    with pytest.raises(CheckpointError, match="no model weights"):
        load_checkpoint(Tiny(), tmp_path / "none.pt")
    # "model" is the documented wrapper: it wins over an EMA copy beside it
    torch.save({"model": sd, "state_dict": {k: v * 0 for k, v in sd.items()}}, tmp_path / "ema.pt")
    dst = Tiny(seed=2)
    assert load_checkpoint(dst, tmp_path / "ema.pt").wrapper == "model"
    _assert_same(dst, sd)


def test_shapes_only_file_is_refused(tmp_path):
    with torch.device("meta"):
        sd = Tiny().state_dict()
    torch.save(sd, tmp_path / "meta.pt")
    with pytest.raises(CheckpointError, match="only tensor shapes"):
        load_checkpoint(Tiny(), tmp_path / "meta.pt")


# --- inspection -----------------------------------------------------------------------------------

def test_inspect_reads_metadata(tmp_path):
    sd = _sd(Tiny(seed=1))
    sd["aggregator.blocks.0.weight"] = sd["aggregator.blocks.0.weight"].to(torch.bfloat16)
    info = inspect_checkpoint(_save({"model": sd}, tmp_path / "w.pt", "pt"))
    assert info.format == "pt" and info.wrapper == "model"
    assert info.num_tensors == len(sd)
    assert info.num_values == sum(v.numel() for v in sd.values())
    assert info.tensor_bytes == sum(v.numel() * v.element_size() for v in sd.values())
    assert info.dtypes() == {"float32": len(sd) - 1, "bfloat16": 1}
    assert info.tensors["aggregator.camera_token"] == ((1, 2, 1, 8), "float32")
    prefixes = {p: n for p, n, _ in info.prefixes(1)}
    assert prefixes == {"aggregator": 7, "depth_head": 4, "scale": 1}
    assert ("aggregator.blocks", 6, 3 * (64 + 8)) in info.prefixes(2)


def test_compare_shapes():
    expected = {"a": (2, 3), "b": (4,), "c": (1,)}
    found = {"a": (2, 3), "b": (5,), "d": (1,), "point_head.x": (3,)}
    diff = compare_shapes(found, expected)
    assert diff.matched == ["a"] and diff.missing == ["c"] and diff.unexpected == ["d"]
    assert diff.mismatched == [("b", (4,), (5,))] and diff.ignored == ["point_head.x"]
    assert not diff.fits
    assert BENIGN_EXTRA_PREFIXES == ("point_head.", "track_head.")


# --- the real architecture (its small configuration) ----------------------------------------------

def _tiny_lingbot(seed):
    from engine.model_zoo import build_model

    model = build_model("lingbot-map-tiny")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict().values():
            t.copy_(torch.randn(t.shape, generator=g))
    return model


@pytest.mark.parametrize("fmt,wrapper,dtype", [("pt", "model", torch.float32), ("safetensors", None, torch.float32),
                                               ("pt", None, torch.bfloat16)])
def test_lingbot_map_tiny_round_trip(tmp_path, fmt, wrapper, dtype):
    sd = {k: v.to(dtype) for k, v in _sd(_tiny_lingbot(1)).items()}
    extras = {"point_head.scratch.output_conv.weight": torch.zeros(2, 2)}
    payload = {**sd, **extras}
    path = _save({wrapper: payload} if wrapper else payload, tmp_path / f"tiny.{fmt}", fmt)
    dst = _tiny_lingbot(2)
    report = load_checkpoint(dst, path)
    assert report.ok and report.loaded == len(sd) == 286 and report.ignored == list(extras)
    for k, v in dst.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, sd[k].float()), k


def test_lingbot_map_tiny_on_meta_device(tmp_path):
    from engine.model_zoo import build_model

    sd = _sd(_tiny_lingbot(1))
    path = _save(sd, tmp_path / "tiny.safetensors", "safetensors")
    with torch.device("meta"):
        dst = build_model("lingbot-map-tiny")
    report = load_checkpoint(dst, path)
    _assert_same(dst, sd)
    # ImageNet mean/std are non-persistent buffers: no checkpoint holds them, the report says so
    assert any("aggregator._mean" in w and "meta" in w for w in report.warnings)


def test_lingbot_map_tiny_does_not_take_the_full_size_file(tmp_path):
    from engine.checkpoint import read_key_list
    from engine.model_zoo import build_model
    from tests.conftest import FIXTURES

    shapes = read_key_list(FIXTURES / "lingbot_map_keys.tsv")
    with torch.device("meta"):
        sd = {k: torch.empty(s) for k, s in shapes.items()}
    # full-size shapes, tiny data: a zip of meta tensors keeps the file small
    torch.save(sd, tmp_path / "full.pt")
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(build_model("lingbot-map-tiny"), tmp_path / "full.pt")
    msg = str(exc.value)
    assert "with the wrong shape" in msg and "aggregator.camera_token (model [1, 2, 1, 64], file [1, 2, 1, 1024])" in msg
    assert "unexpected key(s)" in msg and "1056 unexpected key(s)" in msg and "aggregator.frame_blocks.10.attn" in msg


# --- the page release that keeps peak RSS near the model's size -----------------------------------

def test_pages_are_released_only_for_file_mapped_tensors(tmp_path):
    from engine.checkpoint import _page_releaser

    big = torch.arange(300_000, dtype=torch.float32)
    torch.save({"w": big}, tmp_path / "w.pt")
    mapped = torch.load(tmp_path / "w.pt", weights_only=True, mmap=True)["w"]
    release = _page_releaser(mapped)
    assert release is not None                     # a private file mapping (Linux)
    release(mapped)
    assert torch.equal(mapped, big)                # dropped pages come back from the unchanged file
    assert _page_releaser(big.clone()) is None     # anonymous memory is never released


def test_tensors_sharing_storage_survive_the_page_release(tmp_path):
    # Tied weights are saved once under two names; releasing the first copy's pages must not
    # change what the second name reads.
    src = Tiny(seed=1)
    sd = _sd(src)
    shared = torch.randn(3 * 8 * 8 * 1024).view(3 * 1024, 64)
    model = Tiny(seed=2)
    model.big_a = torch.nn.Parameter(torch.zeros(3 * 1024, 64))
    model.big_b = torch.nn.Parameter(torch.zeros(3 * 1024, 64))
    torch.save({**sd, "big_a": shared, "big_b": shared}, tmp_path / "tied.pt")
    load_checkpoint(model, tmp_path / "tied.pt")
    assert torch.equal(model.big_a, shared) and torch.equal(model.big_b, shared)


def test_lazy_export_from_engine():
    import engine

    assert engine.load_checkpoint is load_checkpoint


def test_check_checkpoint_and_safetensors_prefix(tmp_path):
    from engine.checkpoint import check_checkpoint

    sd = _sd(_tiny_lingbot(1))
    path = _save({"_orig_mod." + k: v for k, v in sd.items()}, tmp_path / "compiled.safetensors", "safetensors")
    info, diff = check_checkpoint(path, "lingbot-map-tiny")
    assert info.stripped_prefix == "_orig_mod." and diff.fits and len(diff.matched) == 286
    info, diff = check_checkpoint(path, "lingbot-map")
    assert not diff.fits and len(diff.mismatched) > 200
    dst = _tiny_lingbot(2)
    assert load_checkpoint(dst, path).stripped_prefix == "_orig_mod."
    _assert_same(dst, sd)
