"""Settings on the fast path (issue 26 item 2), on the CPU in float32: compressed windows
(token_partition / random_subset / token_merge at keep 0.5 and 0.25), block_sparse (its chosen
window blocks gathered into a fixed-length scratch, the token count on the device) and fp8 / int8 stores
attended by the cuDNN split in its static mode (fixed shapes and pointers: whole-step CUDA graphs)
must give the SDPA backend's outputs through window filling, eviction, keyframe-interval-2
rollbacks and the special ring's wrap; the packing of the compressed window's slots must not
change a result (against the layout without packing); the batched commit of a compressed frame
must keep the tokens the per-layer one keeps; a steady step must read nothing back to the host.
The kernels are CPU stand-ins for cuDNN / flash (tests/engine/test_step_graph.py has the same
for native stores); GPU runs: tests/engine/test_cudnn_split_gpu.py and the settings table of
`engine.bench` (docs/benchmarks.md "Every setting on the fast path")."""
import contextlib

import pytest
import torch

from engine.kv import make_compressor
from engine.kv.backends import SDPABackend
from engine.kv.cudnn_kernels import masked_lse, torch_flash_lse
from engine.kv.cudnn_split import CuDNNSplitBackend
from engine.kv.page_table import PageTable
from tests.engine.kv_pair import D, H, KW, L, P, S6, cache_pair, drive, tiny_sessions_against_sdpa

PATTERN = "kknkkknkknknnkkkknknkkkkk"      # fills, evicts, rolls back (interval 2), wraps the ring
STORING = ["token_partition", "random_subset", "token_merge"]


class Recording:
    """A kernel stand-in that records the (shape, address) of the keys it is handed."""

    def __init__(self, fn):
        self.fn, self.seen = fn, set()

    def __call__(self, q, k, *rest):
        self.seen.add((tuple(k.shape), k.data_ptr()))
        return self.fn(q, k, *rest)


@contextlib.contextmanager
def no_host_reads():
    """Any read of a tensor's value into Python (what a host sync is on CUDA) raises."""
    names = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def refuse(*_a, **_k):
        raise AssertionError("a tensor value was read on the host inside a static step")
    try:
        for n in names:
            setattr(torch.Tensor, n, refuse)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)


def _static_split(cache):
    a, b = Recording(torch_flash_lse), Recording(masked_lse)
    be = cache._attn = CuDNNSplitBackend(cache, kernel_a=a, kernel_b_static=b, fallback=SDPABackend.create(cache))
    assert cache.enable_static_steps() and be.static
    return be, a, b


def _drive_static(cu, sd, pattern, strict=True, dense=None, diffs=None):
    """Drive both caches; per step: (static key, split). Outputs must agree (1e-5). `strict`:
    steps whose key was seen before (a graph replay on the GPU) run with no host reads.
    `dense`: a third cache driven alike; `diffs` gets the largest difference of cu's outputs from
    its outputs, per step."""
    keys, seen = [], set()
    g = torch.Generator().manual_seed(3)
    for nf, scale, kf in [(2, True, True)] + [(1, False, c == "k") for c in pattern]:
        k, v, q = (torch.randn(L, nf, S6 + P, H, D, generator=g) for _ in range(3))
        outs = []
        for c in (cu, sd) + ((dense,) if dense is not None else ()):
            c.begin_step(nf, scale=scale, keyframe=kf)
            key = cu.static_key() if c is cu else None
            replay = c is cu and strict and key is not None and key in seen
            ctx = no_host_reads() if replay else contextlib.nullcontext()
            with ctx:
                outs.append([(c.write(i, k[i], v[i]), c.attend(i, q[i]))[1] for i in range(L)])
            if c is cu:
                keys.append((key, cu._attn._split, kf))
                seen.add(key)
            c.end_step()
        for x, y in zip(outs[0], outs[1]):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        if dense is not None:
            diffs.append(max(float((x - y).abs().max()) for x, y in zip(outs[0], outs[2])))
    return keys


@pytest.mark.parametrize("keep", [0.5, 0.25])
@pytest.mark.parametrize("method", STORING)
def test_compressed_window_is_static_on_the_split_and_equals_sdpa(method, keep):
    comp = dict(keep_ratio=keep, seed=5)
    cu, sd = cache_pair(compression=make_compressor(method, **comp))
    sd.compression = make_compressor(method, **comp)
    be, a, b = _static_split(cu)
    keys = _drive_static(cu, sd, PATTERN)
    K = cu.table.keep_tokens
    W, M, SF = KW["window"], 1, KW["scale_frames"]
    # steps 1-3 fill the window (k, k, n): their A would grow a frame a step -> the fallback, so
    # that the split's few shapes are the steady state's
    assert [key for key, _, _ in keys[1:4]] == [None] * 3 and cu._attn.calls["fallback"] >= 3 * L
    full = [(key, split, kf) for key, split, kf in keys[4:]]      # the window is full from here on
    assert all(key is not None for key, _, _ in full)             # every steady step is static
    assert len(be.a_shapes) == 2                                  # keyframes, non-keyframes
    by_kind = {}
    for key, split, kf in full:
        by_kind.setdefault(kf, set()).add(key)
        a0, na, b0, nb, whole = split
        # A = the step page, the scale pages and the packed window slots; B = the special zone
        assert a0 == 0 and na == (M + SF) * P + (W - (1 if kf else 0)) * K and not whole
        assert b0 == cu.table._patch_zone * P
    assert {len(v) for v in by_kind.values()} == {1} and set(by_kind) == {True, False}   # one graph per kind
    # part A: one shape per step kind, at one address; part B: one fixed view for the whole run
    assert {shape for shape, _ in a.seen} >= {((M + SF) * P + (W - 1) * K, H, D), ((M + SF) * P + W * K, H, D)}
    assert len({shape for shape, _ in b.seen}) == 1
    assert be.calls["split"] >= L * len(full) and be.error is None
    assert cu.state()["window"] == sd.state()["window"]


@pytest.mark.parametrize("keep,block", [(0.5, 2), (0.25, 2), (0.5, 3), (0.5, 5)])
def test_block_sparse_is_static_on_the_split_and_equals_the_fallback(keep, block):
    """block_sparse on the split's fixed shapes (scale pages by the fixed kernel, the own page and
    the chosen window blocks gathered into a fixed-length scratch with the token count on the
    device, the specials over the fixed zone) gives the fallback's outputs (SDPA over the token
    list the cache makes) through filling, eviction, rollbacks and the ring's wrap; steady steps
    are static (one key per step kind) and read nothing back to the host. Blocks of 2 and 3
    leave each 5-token page a partial last block; 5 is one block a page."""
    comp = dict(keep_ratio=keep, block_size=block)
    cu, sd = cache_pair(compression=make_compressor("block_sparse", **comp))
    sd.compression = make_compressor("block_sparse", **comp)
    dense, _ = cache_pair()
    be, a, b = _static_split(cu)
    diffs = []
    keys = _drive_static(cu, sd, PATTERN, dense=dense, diffs=diffs)
    # the window fills in steps 1-3 (its block count grows: the fallback), full from step 4 on
    assert [key for key, _, _ in keys[1:4]] == [None] * 3
    steady = keys[4:]
    assert all(key is not None and key[0] == "sparse" for key, _, _ in steady)
    by_kind = {}
    for key, split, kf in steady:
        by_kind.setdefault(kf, set()).add(key)
        a0, na, b0, nb, whole = split
        assert (a0, na) == (cu.table.max_step_frames * P, KW["scale_frames"] * P) and not whole
    assert set(by_kind) == {True, False} and all(len(v) == 1 for v in by_kind.values())
    W, nbk = KW["window"], -(-P // block)
    comp_ = cu.compression
    # a keyframe sees one window frame fewer: its fixed gather is shorter
    assert {k[3] for v in by_kind.values() for k in v} == {P + comp_.kept_blocks(w * nbk) * block for w in (W - 1, W)}
    assert be.calls["sparse"] == L * len(steady) and be.error is None and len(be.a_shapes) == 1
    gathered = {(k[3], H, D) for v in by_kind.values() for k in v}
    assert len({shape for shape, _ in b.seen} - gathered) == 1                 # the specials' fixed view
    assert len({ptr for shape, ptr in b.seen if shape in gathered}) == 1      # one gather scratch
    # the selection really drops keys: the outputs differ from attending the whole window
    assert max(diffs[4:]) > 1e-3


def test_block_slots_are_the_fallbacks_tokens_packed():
    """BlockSparse.block_slots (fixed length, the count on the device) holds exactly the pool
    slots of the token list the fallback builds (`block_tokens`), packed at the front."""
    g = torch.Generator().manual_seed(1)
    for block in (2, 3, 5, 8):
        comp = make_compressor("block_sparse", keep_ratio=0.4, block_size=block)
        nb = comp.blocks_per_page(P)
        pages = torch.tensor([7, 2, 9, 4])
        means, q = torch.randn(4, nb, H, D, generator=g), torch.randn(6, H, D, generator=g)
        chosen = comp.top_blocks(q, means)
        with no_host_reads():
            slots, valid = comp.block_slots(chosen, pages, P)
        assert slots.numel() == comp.kept_blocks(4 * nb) * block
        tok = comp.block_tokens(comp.select_blocks(q, means), P)      # offsets in the window's pages
        want = pages[tok // P] * P + tok % P
        assert int(valid) == want.numel()
        assert sorted(slots[:int(valid)].tolist()) == sorted(want.tolist())
        assert torch.equal(torch.sort(chosen).values, comp.select_blocks(q, means))


@pytest.mark.parametrize("method", STORING)
def test_packing_the_window_slots_changes_no_result(method):
    """Against the layout before packing (evicted slots left where they were): same outputs."""
    comp = dict(keep_ratio=0.5, seed=2)
    cu, sd = cache_pair(compression=make_compressor(method, **comp))
    sd.compression = make_compressor(method, **comp)
    sd.table._pack_slots = lambda: None                       # the unpacked reference
    moved = differ = 0
    for oa, ob, st, _, _ in drive(cu, sd, PATTERN + "kkk"):
        for x, y in zip(oa, ob):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        moved += st.slot_moves is not None
        differ += cu.table._window != sd.table._window
        assert sorted(cu.table._window) == list(range(len(cu.table._window)))    # packed
    assert moved > 0 and differ > 0         # evictions moved slots: the layouts really differed


@pytest.mark.parametrize("method", STORING)
def test_batched_commit_keeps_the_tokens_of_the_per_layer_commit(method):
    g = torch.Generator().manual_seed(7)
    comp = make_compressor(method, keep_ratio=0.4, seed=9)
    k, v = torch.randn(3, 11, H, D, generator=g), torch.randn(3, 11, H, D, generator=g)
    kk, vv = comp.kept_layers(k, v, frame=4)
    for i in range(3):
        rk, rv = comp.kept(k[i], v[i], i, 4)
        torch.testing.assert_close(kk[i], rk, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(vv[i], rv, atol=1e-6, rtol=1e-6)
    assert kk.shape == (3, comp.keep_tokens(11), H, D)


@pytest.mark.parametrize("kv_dtype", ["fp8", "int8"])
def test_quantized_stores_are_static_on_the_split_and_equal_sdpa(kv_dtype):
    """The run read into 16-bit scratch (fp8: scales folded into q / the output; int8: the
    per-token scales applied in the scratch) -- SDPA dequantises the same store on gather."""
    cu, sd = cache_pair(dtype=kv_dtype, attn_dtype="fp32")
    be, a, b = _static_split(cu)
    keys = _drive_static(cu, sd, PATTERN)
    steady = [key for key, _, _ in keys[6:]]
    assert all(key is not None for key in steady) and len(set(steady)) == 2      # one per step kind
    assert be._scratch is not None and be.error is None and be.calls["split"] > 0
    # A and B read into disjoint rows of the scratch: one address each for the whole run
    assert len({ptr for _, ptr in b.seen}) == 1


def test_int8_steps_carry_no_token_list_unless_compressed():
    """An int8 store gathers its token scales by slot only on SDPA; the step itself stays a page
    run (what the split needs), and SDPA still reads the right scales (equal to the fp32 store
    within int8's error)."""
    cu, ref = cache_pair(dtype="int8", attn_dtype="fp32")
    for oa, ob, st, _, _ in drive(cu, ref, "kkkkknk"):
        assert st.slots_t is None and (st.int8_slots_t is not None)
        for x, y in zip(oa, ob):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


def test_page_table_packs_after_every_eviction():
    t = PageTable(page_size=4, special_tokens=2, scale_frames=1, window=3, special_cap=8, keep_tokens=2)
    t.begin_step(1, scale=True)
    t.end_step()
    for i in range(8):
        st = t.begin_step(1, keyframe=True)
        used = sorted(t._window)
        assert used == list(range(len(used)))                 # packed while attending
        assert (st.token_runs is None) == (i < 2)             # runs once the window is full
        if st.token_runs is not None:
            (a0, na), (b0, nb) = st.token_runs
            assert a0 == 0 and na == (1 + 1) * 4 + len(used) * 2 and na + nb == st.num_kv_tokens
            assert sorted(st.slots.tolist()) == sorted(list(range(na)) + list(range(b0, b0 + nb)))
        t.end_step()


@pytest.mark.parametrize("settings", [dict(kv_compression="token_merge", kv_keep_ratio=0.5),
                                      dict(kv_compression="token_partition", kv_keep_ratio=0.25),
                                      dict(kv_compression="block_sparse", kv_keep_ratio=0.5, kv_block_size=8),
                                      dict(kv_dtype="int8")])
def test_session_takes_the_step_graph_path_with_the_setting(monkeypatch, settings):
    """The tiny model through a split-backend session whose graph cache runs each captured step
    (what a capture runs) against an SDPA session without graphs, both with the setting: equal
    results (tests/engine/kv_pair.py), and streamed steps took the whole-step path once the
    window was full."""
    from tests.engine.test_step_graph import RecordingGraphs
    graphs, seen = RecordingGraphs(), {}

    def opened(s):
        s.model.aggregator.graphs = graphs

    be = tiny_sessions_against_sdpa(
        monkeypatch, lambda cache: CuDNNSplitBackend(cache, kernel_a=torch_flash_lse, kernel_b_static=masked_lse,
                                                      kernel_full=lambda q, k, v: torch_flash_lse(q, k, v)[0],
                                                      fallback=SDPABackend.create(cache)),
        frames=24, special_cap=9, seed=6, opened=opened, settings=settings,
        closing=lambda s: seen.update(stats=s.stats()))
    steps = [k for k in graphs.keys if isinstance(k, tuple) and k and k[0] == "step"]
    path = "sparse" if settings.get("kv_compression") == "block_sparse" else "split"
    assert be.error is None and be.calls[path] > 0
    assert steps and seen["stats"]["step_graph"]["error"] is None
    assert seen["stats"]["step_graph"]["replays"] == len(steps) >= 10
    assert len({k[1][1:] for k in steps}) <= 4                 # one graph per step kind
    assert {k[1][1] for k in steps} <= ({"sparse"} if path == "sparse" else {"split", "whole"})
    fp = seen["stats"]["fast_path"]
    assert fp["attention"].startswith("cudnn") and path in fp["attention"]


def test_fast_path_reasons():
    """stats()["fast_path"]: whole-step once replays ran, else the reason in words; and
    stats()["step_graph"] reads the same decision (`on` = whole-step, `why_not` = the reason)."""
    from types import SimpleNamespace

    from engine import fast_path as fpm
    from engine.kv import PagedKVCache

    def session(kv, device="cuda", graphs=True, replays=5, error=None, weight_dtype=None, window=3,
                cuda_graphs=True, scope="step"):
        agg = SimpleNamespace(graphs=object() if graphs else None, graph_scope=scope)
        model = SimpleNamespace(aggregator=agg, step_graph_replays=replays, step_graph_error=error,
                                weight_dtype=weight_dtype, step_graph_pool_bytes=0)
        return SimpleNamespace(kv=kv, model=model, config=SimpleNamespace(window=window, cuda_graphs=cuda_graphs),
                               device=torch.device(device))

    def both(s):
        """fast_path and step_graph as the session builds them (one decision)."""
        decision = fpm.lingbot_whole_step(s, s.kv.stats())
        fp, sg = fpm.lingbot_fast_path(s, decision=decision), fpm.step_graph_stats(s.model, decision)
        assert sg["why_not"] == fp["reason"] and sg["on"] == (fp["graphs"] == "whole-step")
        assert sg["replays"] == s.model.step_graph_replays and sg["error"] == s.model.step_graph_error
        assert fp == fpm.lingbot_fast_path(s)          # the decision made inside: the same
        return fp, sg

    cu, sd = cache_pair()
    be, _, _ = _static_split(cu)
    for _ in drive(cu, sd, "kkkkk"):
        pass
    whole, sg = both(session(cu))
    assert whole["graphs"] == "whole-step" and whole["reason"] is None
    assert whole["attention"].startswith("cudnn-split: split")
    assert sg["on"] and sg["why_not"] is None
    fp, sg = both(session(cu, device="cpu"))
    assert fp["reason"] == fpm.NOT_CUDA and fp["graphs"] == "none" and not sg["on"]
    assert both(session(cu, graphs=False, weight_dtype="int8"))[0]["reason"] == fpm.QUANTIZED_WEIGHTS
    assert both(session(cu, graphs=False, cuda_graphs=False))[0]["reason"] == fpm.GRAPHS_OFF
    assert both(session(cu, graphs=False))[0]["reason"] == fpm.CLOSED     # graphs freed, cuda_graphs on
    fp, sg = both(session(cu, scope="fixed", replays=0))
    assert fp["graphs"] == "per-part" and fp["reason"] == fpm.GRAPH_SCOPE.format(scope="fixed") and not sg["on"]
    per, sg = both(session(cu, replays=0, error="capture failed"))
    assert per["graphs"] == "per-part" and "capture failed" in per["reason"] and sg["error"] == "capture failed"
    # replays from before a capture failure do not make the session whole-step
    assert both(session(cu, replays=9, error="capture failed"))[0]["graphs"] == "per-part"
    assert both(session(cu, window=64, replays=0))[0]["reason"] == fpm.FILLING
    assert both(session(cu, replays=0))[0]["reason"] == "no streamed step was replayed as one graph yet"
    # block_sparse: on the split's fixed shapes like exact (whole-step once replays ran) ...
    bs, bs_ref = cache_pair(compression=make_compressor("block_sparse", keep_ratio=0.5, block_size=2))
    _static_split(bs)
    for _ in drive(bs, bs_ref, "kkkkk"):
        pass
    fp, sg = both(session(bs))
    assert fp["graphs"] == "whole-step" and fp["reason"] is None and "sparse" in fp["attention"] and sg["on"]
    # ... except over a quantized store: its gather reads native stores only
    q8, q8_ref = cache_pair(dtype="fp8", attn_dtype="fp32",
                            compression=make_compressor("block_sparse", keep_ratio=0.5, block_size=2))
    _static_split(q8)
    assert both(session(q8, replays=0))[0]["reason"] == fpm.BLOCK_SPARSE_QUANTIZED.format(kind="fp8")
    sdpa = PagedKVCache(L, H, D, P, special_tokens=S6, backend="sdpa", **KW)
    assert "no fixed-shape steps" in both(session(sdpa, replays=0))[0]["reason"]
    w = fpm.windowed_fast_path(whole, 256)
    assert w["graphs"] == "whole-step" and "restarts every 256 frames" in w["reason"]
    assert fpm.vggt_fast_path(None, "cuda")["graphs"] == "none"


@pytest.mark.parametrize("kv_dtype", ["fp8", "int8", "fp32"])
def test_scratch_bytes_is_what_the_split_allocates(kv_dtype):
    cu, sd = cache_pair(dtype=kv_dtype, attn_dtype="fp32")
    be, _, _ = _static_split(cu)
    for _ in drive(cu, sd, "kkkkk"):
        pass
    got = sum(x.numel() * x.element_size() for x in be._scratch) if be._scratch is not None else 0
    kind = cu.pool.kind
    assert got == CuDNNSplitBackend.scratch_bytes(cu.num_pages * P, H, D, kind, attn_bytes=4)
    assert (got > 0) == (kind != "native")


def test_a_new_session_counts_its_own_step_graph_replays():
    """The model's replay count belongs to the session's fresh graph cache: a second session on
    the same model (a benchmark's settings table, the GUI's next run) starts from 0, so its
    `fast_path` / `step_graph` never report the previous session's whole-step replays."""
    from engine import SessionConfig, open_session
    from engine.model_zoo import build_model
    model = build_model("lingbot-map-tiny")
    cfg = SessionConfig(engine="lingbot-map", model="lingbot-map-tiny", image_width=70, device="cpu",
                        dtype="fp32")
    open_session(cfg, model=model).close()
    model.step_graph_replays = 7                     # what the previous session left behind
    s = open_session(cfg, model=model)
    try:
        assert s.stats()["step_graph"]["replays"] == 0
    finally:
        s.close()
