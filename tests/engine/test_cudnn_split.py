"""The cuDNN split backend (`CuDNNSplitBackend`) on the CPU: a fixed-length part (the patch pages)
and the rest (the special tokens) attended apart, each returning its log-sum-exp, merged exactly.
The fixed kernel is a stand-in that checks what cuDNN would be handed (zero-copy views of the
pool, one shape per step kind) and runs PyTorch's CPU flash kernel with its log-sum-exp; the
variable part runs the backend's real `torch_flash_lse` (CPU flash). Outputs equal the SDPA
backend's through window filling (fallback), eviction, the special ring's growth and wrap,
keyframe interval 2 rollbacks and partial last pages. GPU checks: test_cudnn_split_gpu.py."""
import pytest
import torch
import torch.nn.functional as F

from engine.kv import PagedKVCache
from engine.kv.backends import SDPABackend
from engine.kv.cudnn_split import CuDNNSplitBackend
from engine.kv.cudnn_kernels import chunked_lse, even_chunks, merge_lse, tail_chunks, torch_flash_lse
from tests.engine.kv_pair import KW, D, H, L, P, S6, cache_pair, drive

PATTERN = "kknkkknkknknnkkkknknkk"      # fills, evicts, rolls back (interval 2), wraps the ring


class FixedStandIn:
    """The fixed part's kernel: checks the K/V it gets are in-place views of the pool, records
    the shapes (one cuDNN graph each) and returns CPU flash attention with its log-sum-exp."""

    def __init__(self, cache, fail=False):
        self.pool, self.fail = cache.pool, fail
        self.compact = cache.table.compact          # a compressed window: A ends inside a page
        self.shapes, self.calls = set(), 0

    def __call__(self, q, k, v):
        if self.fail:
            raise RuntimeError("cuDNN rejected the graph (stand-in)")
        pool = self.pool
        assert q.is_contiguous() and k.shape == v.shape and k.stride() == v.stride() == (H * D, D, 1)
        if not self.compact:                                           # whole pages only
            assert k.shape[0] % pool.page_size == 0
        base = pool.k.data_ptr()
        assert base <= k.data_ptr() < base + pool.k.numel() * pool.k.element_size()   # zero copy
        self.shapes.add((tuple(q.shape), tuple(k.shape)))
        self.calls += 1
        return torch_flash_lse(q, k, v)


def _caches(dtype=torch.float32, fail=False, **kw):
    cu, sd = cache_pair(dtype=dtype, **kw)
    stand_in = FixedStandIn(cu, fail=fail)
    cu._attn = CuDNNSplitBackend(cu, kernel_a=stand_in, fallback=SDPABackend.create(cu))
    return cu, sd, stand_in


def _drive(a, b, pattern, seed=0, dtype=torch.float32):
    """(outputs a, outputs b, step of a, split of a as planned) per step (tests/engine/kv_pair.py)."""
    for oa, ob, st, split, _ in drive(a, b, pattern, seed, dtype, planned=lambda c: c._attn._split):
        yield oa, ob, st, split


def test_merge_of_two_key_sets_equals_attention_over_both():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(7, 3, 16, generator=g) * 3 for _ in range(3))
    ref = F.scaled_dot_product_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)))[0].transpose(0, 1)
    for cut in (1, 4, 6):
        oa, la = torch_flash_lse(q, k[:cut], v[:cut])
        ob, lb = torch_flash_lse(q, k[cut:], v[cut:])
        assert la.shape == lb.shape == (3, 7) and la.dtype == torch.float32
        torch.testing.assert_close(merge_lse(oa, la, ob, lb), ref, atol=1e-5, rtol=1e-5)
    # far apart log-sum-exps: no overflow, the heavier part wins
    big = torch.full((3, 7), 500.0)
    torch.testing.assert_close(merge_lse(oa, big, ob, -big), oa)


def test_split_equals_sdpa_through_fill_eviction_rollback_and_ring_wrap():
    cu, sd, stand_in = _caches()
    be = cu._attn
    seen = []
    for a, b, step, split in _drive(cu, sd, PATTERN):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        assert (split is not None) == (step.contiguous is not None)   # steady state split, else fallback
        if split is not None:
            a0, na, b0, n_b, _ = split            # flat slots: A's start and length, B's
            n_a, first = na // P, a0 // P
            # A = scale + window (+ the new frame): constant; B = the visible special tokens right after
            assert na == n_a * P and a0 == first * P and b0 == a0 + na
            assert n_a == len(step.pages) - -(-n_b // P)
            assert n_b == step.special_start + S6 and n_a * P + n_b == step.num_kv_tokens
            assert (first, n_a) == ((1, 2 + 3) if step.keyframe else (0, 2 + 3 + 1))
            seen.append((step.keyframe, step.last_page_len < P))
    assert {kf for kf, _ in seen} == {True, False}                    # keyframes and rollbacks split
    assert {part for _, part in seen} == {True, False}                # partial and full last pages
    assert cu.state() == sd.state() and cu.stats()["special_dropped"] > 0      # the ring wrapped
    assert be.error is None and be.calls["split"] == L * len(seen) == stand_in.calls
    assert be.calls["split"] + be.calls["fallback"] == L * (len(PATTERN) + 1)
    # one fixed shape per step kind: one cuDNN graph each for the whole run
    assert stand_in.shapes == {((S6 + P, H, D), (n * P, H, D)) for n in (5, 6)}
    assert be.a_shapes == {(S6 + P, 5 * P), (S6 + P, 6 * P)}


def test_split_in_bf16_is_close_to_sdpa():
    cu, sd, _ = _caches(dtype=torch.bfloat16)
    for a, b, step, split in _drive(cu, sd, PATTERN[:12], dtype=torch.bfloat16):
        for x, y in zip(a, b):
            assert x.dtype == torch.bfloat16
            torch.testing.assert_close(x.float(), y.float(), atol=2e-2, rtol=2e-2)
    assert cu._attn.calls["split"] > 0


def test_kernel_failure_falls_back_for_good():
    cu, sd, _ = _caches(fail=True)
    be = cu._attn
    for a, b, step, split in _drive(cu, sd, PATTERN):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    assert "rejected" in be.error and be.calls["split"] == 0 and be.path == "fallback"


def test_shape_cap_sends_new_lengths_to_the_fallback():
    cu, sd, stand_in = _caches()
    cu._attn.max_shapes = 1
    for a, b, step, split in _drive(cu, sd, PATTERN):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        if split is not None:
            assert step.keyframe                # the first steady shape (keyframes) only
    assert len(stand_in.shapes) == 1 and cu._attn.calls["split"] > 0


@pytest.mark.parametrize("spare", [0, -1])
def test_split_runs_only_when_its_call_fits_one_wave(spare):
    """ceil(q / 128) x heads work tiles must fit the GPU's SMs (wave_sms): with one SM short of
    that (and not one whole tile a head left: no wave tail possible) every step goes to the
    fallback (same outputs), with exactly that the split runs."""
    cu, sd, stand_in = _caches()
    be = cu._attn
    assert be.wave_sms is None                  # CPU: no wave limit by default
    be.wave_sms = -(-(P + S6) // be.Q_TILE) * H + spare
    for a, b, step, split in _drive(cu, sd, PATTERN):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    if spare < 0:
        assert be.calls["split"] == 0 and stand_in.calls == 0 and be.wave_declined > 0
    else:
        assert be.calls["split"] > 0 and be.wave_declined == 0 and be.wave_tail_steps == 0


class RowsStandIn(FixedStandIn):
    """FixedStandIn that also records the q rows cuDNN was handed."""

    def __init__(self, cache):
        super().__init__(cache)
        self.rows = set()

    def __call__(self, q, k, v):
        self.rows.add(q.shape[0])
        return super().__call__(q, k, v)


@pytest.mark.parametrize("whole", [False, True])
def test_wave_tail_rows_attend_through_key_chunks(whole):
    """Rows past one wave: cuDNN gets the rows that fit (whole tiles a head), the rest attend the
    same keys in chunks merged by log-sum-exp (`chunked_lse`); every output still equals SDPA,
    split and whole steps alike, and the tail switched off sends those steps to the fallback."""
    cu, sd = cache_pair()
    fixed = RowsStandIn(cu)
    full = WholeStandIn(cu)
    be = cu._attn = CuDNNSplitBackend(cu, kernel_a=fixed, kernel_full=full if whole else None,
                                      fallback=SDPABackend.create(cu), whole=whole)
    be.Q_TILE, be.tail_min_keys = 2, 2          # tiny tiles: 8 rows = 4 tiles a head
    be.wave_sms = 7                              # 8 tiles do not fit; 3 a head do (6 rows)
    assert be.wave_rows(P + S6) == 6 and not be.fits_one_wave(P + S6)
    for a, b, step, split in _drive(cu, sd, PATTERN + ("nkknkk" if whole else "")):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    assert be.wave_tail_steps > 0 and be.wave_declined == 0 and be.error is None
    assert fixed.rows == {6}                     # never more rows than one wave
    chunks = {spec[0] for spec in be._tail.values()}
    assert chunks and all(c > 1 for c in chunks)  # 2 tail rows x 2 heads: 3 chunks fill 7 SMs
    if whole:
        assert be.calls["whole"] > 0 and full.shapes and all(qs[0] == 6 for qs, _ in full.shapes)
    # switched off: the same steps decline, as before the tail
    cu2, sd2 = cache_pair()
    be2 = cu2._attn = CuDNNSplitBackend(cu2, kernel_a=FixedStandIn(cu2), fallback=SDPABackend.create(cu2),
                                        tail=False)
    be2.Q_TILE, be2.wave_sms = 2, 7
    for a, b, step, split in _drive(cu2, sd2, PATTERN):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    assert be2.calls["split"] == 0 and be2.wave_declined > 0 and be2.wave_tail_steps == 0


def test_chunked_lse_equals_attention_over_all_keys():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(5, 3, 16, generator=g) * 2
    k, v = (torch.randn(41, 3, 16, generator=g) * 2 for _ in range(2))
    ref_out, ref_lse = torch_flash_lse(q, k, v)
    for chunks in (1, 2, 5, 7):
        out, lse = chunked_lse(q, k, v, chunks)
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    # the count: chunks x heads x tiles fill the SMs, chunks >= min_keys long and none empty
    assert tail_chunks(18, 16, 132, 74592) == 8            # the H200 at 518x392: 8 x 16 CTAs
    assert tail_chunks(18, 16, 132, 3000) == 2             # >= 1,024 keys a chunk
    assert tail_chunks(200, 16, 132, 74592) == 4           # 2 tiles a head
    for keys in range(1, 60):
        n = tail_chunks(1, 1, 8, keys, min_keys=1)
        assert 1 <= n <= 8 and (n - 1) * -(-keys // n) < keys
    # equal chunks for the cuDNN form: 72 and 73 patch pages of 1,036 tokens, and a whole run
    assert even_chunks(72 * 1036, 8) == 8 and even_chunks(73 * 1036, 8) == 7
    assert even_chunks(72 * 1036 + 6150, 8) == 6 and even_chunks(1031, 8) == 1
    assert even_chunks(4096, 8, min_keys=1024) == 4


def test_wave_tail_kernel_is_cudnn_only_for_equal_chunks():
    cu, sd = cache_pair()
    be = cu._attn = CuDNNSplitBackend(cu, kernel_a=FixedStandIn(cu), fallback=SDPABackend.create(cu))
    be.Q_TILE, be.tail_min_keys, be.wave_sms = 2, 2, 7
    for a, b, step, split in _drive(cu, sd, PATTERN):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    kinds = {L: (c, kind) for (t, L), (c, _, kind) in be._tail.items()}
    assert kinds and all(kind == ("cudnn" if L % c == 0 else "flash") for L, (c, kind) in kinds.items())
    assert any(kind == "cudnn" for _, kind in kinds.values())
    assert len(be.path_stats()["wave_tails"]) == len(kinds)


def test_block_sparse_steps_fall_back():
    from engine.kv import make_compressor
    cu, sd, stand_in = _caches(compression=make_compressor("block_sparse", keep_ratio=0.5, block_size=2))
    for a, b, step, split in _drive(cu, sd, "kkkkknkk"):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    be = cu._attn
    assert be.calls["fallback"] > 0 and be.error is None
    # the selected blocks differ per layer and step: token lists, no fixed-shape step
    assert be.calls["split"] == 0 and cu.static_key() is None


def test_split_falls_back_to_sdpa_on_the_cpu():
    cu = PagedKVCache(L, H, D, P, special_tokens=S6, backend="sdpa", **KW)
    be = CuDNNSplitBackend.create(cu)
    assert be.mode == "split" and isinstance(be._fallback, SDPABackend)     # no FlashInfer on the CPU


def test_auto_takes_the_split_for_native_16_bit_stores(monkeypatch):
    from engine.kv import backends, kv_precision, resolve
    cuda = torch.device("cuda")
    monkeypatch.setattr(backends, "_import_flashinfer", lambda: (None, "not installed"))
    assert resolve.resolve_backend("auto", cuda, torch.bfloat16) is CuDNNSplitBackend   # without FlashInfer too
    monkeypatch.setattr(backends, "_import_flashinfer", lambda: (object(), None))
    assert resolve.resolve_backend("auto", cuda, torch.bfloat16) is CuDNNSplitBackend
    assert resolve.resolve_backend("auto", cuda, kv_precision("fp16", "auto")) is CuDNNSplitBackend
    # fp8 / int8 stores attended in 16 bits: the split too (their runs read into 16-bit scratch);
    # the CPU keeps SDPA
    assert resolve.resolve_backend("auto", cuda, kv_precision("bf16", "fp8")) is CuDNNSplitBackend
    assert resolve.resolve_backend("auto", cuda, kv_precision("bf16", "int8")) is CuDNNSplitBackend
    assert resolve.resolve_backend("auto", "cpu", torch.bfloat16) is SDPABackend


def test_cudnn_split_is_a_backend_name_and_compile_blocks_a_setting():
    """The split is reachable as a typed choice ("cudnn-split": the settings panel / --backend),
    with the cuDNN backend's checks; compiled blocks as a typed setting (--compile-blocks)."""
    from engine import SessionConfig
    from engine.kv import KVCacheError, resolve
    from engine.shared_streams import model_key
    cuda = torch.device("cuda")
    assert resolve.resolve_backend("cudnn-split", cuda, torch.bfloat16) is CuDNNSplitBackend
    assert "cudnn-split" in resolve.available_backends("cuda", "bf16")
    assert "cudnn-split" not in resolve.available_backends("cpu")
    with pytest.raises(KVCacheError, match="CUDA device"):
        resolve.resolve_backend("cudnn-split", "cpu", torch.bfloat16)
    with pytest.raises(KVCacheError, match="supports bf16, fp16"):
        resolve.resolve_backend("cudnn-split", cuda, torch.float32)
    cfg = SessionConfig(engine="lingbot-map", backend="cudnn-split", compile_blocks=True)
    assert cfg.backend == "cudnn-split" and cfg.compile_blocks is True
    assert SessionConfig().compile_blocks is False
    # streams that compile and streams that do not never share one network
    assert model_key(cfg) != model_key(SessionConfig(engine="lingbot-map", backend="cudnn-split"))


def test_sessions_accept_every_backend_choice_and_name_the_bad_one():
    """Both neural sessions' own validation takes every choice of the backend setting (a CLI run with
    --backend cudnn-split was refused by a second, stale list) and names the choices otherwise."""
    from engine import EngineError, SessionConfig
    from engine.api import ATTENTION_BACKENDS
    from engine.lingbot.session import _validate as validate_lingbot
    from engine.vggt.session import validate as validate_vggt
    assert "cudnn-split" in ATTENTION_BACKENDS
    for validate, engine in ((validate_lingbot, "lingbot-map"), (validate_vggt, "vggt")):
        for b in ATTENTION_BACKENDS:
            validate(SessionConfig(engine=engine, backend=b))
        with pytest.raises(EngineError, match="cudnn-split"):
            validate(SessionConfig(engine=engine, backend="cudnn2"))


class WholeStandIn:
    """The whole-run kernel (plain cuDNN, no statistics): checks it is handed the contiguous run
    in place and exactly the visible keys, records the shapes; returns CPU flash attention."""

    def __init__(self, cache):
        self.pool, self.shapes, self.calls = cache.pool, set(), 0

    def __call__(self, q, k, v):
        base = self.pool.k.data_ptr()
        assert base <= k.data_ptr() < base + self.pool.k.numel() * self.pool.k.element_size()
        assert k.stride() == v.stride() == (H * D, D, 1)
        self.shapes.add((tuple(q.shape), tuple(k.shape)))
        self.calls += 1
        return torch_flash_lse(q, k, v)[0]


def test_full_ring_steps_are_attended_whole_with_one_shape_per_step_kind():
    """Once the window and the special ring are full every step of a kind has one K/V length for
    good, so the split attends it as ONE call without statistics (its fastest cuDNN form); the
    earlier steady steps split; every output equals SDPA."""
    cu, sd = cache_pair()
    fixed, whole = FixedStandIn(cu), WholeStandIn(cu)
    be = cu._attn = CuDNNSplitBackend(cu, kernel_a=fixed, kernel_full=whole, fallback=SDPABackend.create(cu))
    assert be.whole                                         # a whole-run kernel given: on
    kinds = []
    for a, b, step, split in _drive(cu, sd, PATTERN + "nkknkk"):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        if step.fixed_length:            # the visible specials are the cap's (+ the new frame's)
            assert step.special_start + S6 == S6 * (KW["special_cap"] + 1)
        if split is not None:
            kinds.append((step.keyframe, split[4], step.num_kv_tokens))
            assert split[4] == step.fixed_length
    wholes = {(kf, n) for kf, w, n in kinds if w}
    assert {kf for kf, _ in wholes} == {True, False}        # keyframes and rollbacks whole
    assert len(wholes) == 2                                 # one length per step kind, for good
    assert any(not w for _, w, _ in kinds)                  # steady steps before the ring filled split
    # the whole steps come last: once fixed, always fixed
    flags = [w for _, w, _ in kinds]
    assert flags == sorted(flags)
    assert whole.shapes == {((S6 + P, H, D), (n, H, D)) for _, n in wholes} == {
        ((S6 + P, H, D), (n, H, D)) for _, n in {(q, n) for q, n in be.whole_shapes}}
    assert whole.calls == be.calls["whole"] == L * sum(flags) and be.error is None
    assert be.path_stats()["whole_shapes"] == 2 and cu.stats()["attention_paths"]["calls"]["whole"] == whole.calls


def test_whole_run_is_off_on_the_cpu_without_a_stand_in():
    cu, _ = cache_pair()
    assert not CuDNNSplitBackend(cu, kernel_a=FixedStandIn(cu), fallback=SDPABackend.create(cu)).whole
    assert CuDNNSplitBackend(cu, kernel_a=FixedStandIn(cu), kernel_full=WholeStandIn(cu),
                             fallback=SDPABackend.create(cu)).whole
