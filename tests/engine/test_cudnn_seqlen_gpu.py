"""GPU checks of the cuDNN backend's sequence-length form (`CuDNNSeqLenBackend`: cuDNN's padding
mask through the cuDNN frontend, the visible length as a device tensor) against SDPA on the same
steps, to bf16 tolerance: while the window fills (paged form), in the steady state (dense form),
across keyframe rollbacks and the special ring's wrap; no host synchronisation inside a step;
graphs built once per layout; one call captured in a CUDA graph and replayed at new lengths; and
a LingBot-Map session on backend "cudnn" against an SDPA session. Skipped without CUDA or without
the frontend (pip nvidia-cudnn-frontend). CPU checks of the bookkeeping: test_cudnn_seqlen.py."""
import pytest
import torch

from engine.kv import PagedKVCache
from engine.kv.cudnn import CuDNNSeqLenBackend
from engine.kv.cudnn_kernels import CuDNNFrontendKernel, _import_cudnn_frontend

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
needs_frontend = pytest.mark.skipif(torch.cuda.is_available() and _import_cudnn_frontend()[0] is None,
                                    reason=f"cuDNN frontend missing: {_import_cudnn_frontend()[1]}")

L, H, D, S6 = 2, 16, 64, 6
KW = dict(scale_frames=2, window=4, special_cap=8, dtype=torch.bfloat16, device="cuda")


def _qkv(gen, nf, page):
    return (torch.randn(L, nf, S6 + page, H, D, generator=gen, device="cuda", dtype=torch.bfloat16)
            for _ in range(3))


@needs_cuda
@needs_frontend
@pytest.mark.parametrize("page", [130, 128])
def test_seqlen_form_equals_sdpa_without_syncs(page):
    """130-token pages: cuDNN's paged form cannot run (not a power of two), non-contiguous steps
    exact; 128: the dense form with paged window filling."""
    cu = PagedKVCache(L, H, D, page, backend="sdpa", **KW)
    cu._attn = CuDNNSeqLenBackend(cu, kernel=CuDNNFrontendKernel("cuda"))
    sdpa = PagedKVCache(L, H, D, page, backend="sdpa", **KW)
    gen = torch.Generator(device="cuda").manual_seed(0)
    outs = {id(c): [] for c in (cu, sdpa)}
    for i, (nf, scale, key) in enumerate([(2, True, True)] + [(1, False, c == "k") for c in "kkknkkkkknnkkkkkkk"]):
        k, v, q = _qkv(gen, nf, page)
        for c in (cu, sdpa):
            # the backend's own steps raise on any synchronising PyTorch call (after the first
            # step of each q length, which builds the graphs)
            strict = c is cu and i >= 2
            if strict:
                torch.cuda.set_sync_debug_mode("error")
            try:
                c.begin_step(nf, scale=scale, keyframe=key)
                for layer in range(L):
                    c.write(layer, k[layer], v[layer])
                    outs[id(c)].append(c.attend(layer, q[layer]).clone())
                c.end_step()
            finally:
                torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    be = cu._attn
    assert be.error is None, be.error
    assert cu.stats()["special_dropped"] > 0
    assert be.calls["fixed"] == L * (be.forms["dense"] + be.forms["paged"]) > 0
    assert be.forms["dense"] > 0 and (be.forms["paged"] > 0) == (page == 128)
    assert (be.calls["exact"] == 0) == (page == 128)
    assert be._kernel.builds <= 4
    for a, b in zip(outs[id(cu)], outs[id(sdpa)]):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)


@needs_cuda
@needs_frontend
def test_seqlen_call_is_cuda_graph_capturable():
    """Plan outside the graph (it writes the lengths into fixed buffers), one captured attend of
    the steady state's dense form replayed at later steps of other lengths (the special tokens
    grow) == SDPA at those lengths; the window-filling steps eagerly."""
    P = 128
    cu = PagedKVCache(1, H, D, P, backend="sdpa", **dict(KW, special_cap=32))
    cu._attn = be = CuDNNSeqLenBackend(cu)
    sdpa = PagedKVCache(1, H, D, P, backend="sdpa", **dict(KW, special_cap=32))
    gen = torch.Generator(device="cuda").manual_seed(1)
    q_static = torch.zeros(S6 + P, H, D, device="cuda", dtype=torch.bfloat16)
    graph = None
    replays = 0
    for nf, scale in [(2, True)] + [(1, False)] * 12:
        k, v, q = _qkv(gen, nf, P)
        outs = []
        for c in (cu, sdpa):
            step = c.begin_step(nf, scale=scale)
            c.write(0, k[0], v[0])
            if c is cu and step.contiguous is not None:
                assert be._step_view == ("dense", step.contiguous[0])
                first = step.contiguous[0] if graph is None else first
                assert step.contiguous[0] == first          # keyframes: the run starts on one page
                q_static.copy_(q[0].reshape(-1, H, D))
                if graph is None:
                    c.attend(0, q_static.view(1, -1, H, D))  # builds the graph, outside the capture
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        static_out = be._attend_fixed(None, q_static, 0)
                graph.replay()
                replays += 1
                outs.append(static_out.clone())
            else:
                outs.append(c.attend(0, q[0]).reshape(-1, H, D))
            c.end_step()
        torch.testing.assert_close(outs[0].float(), outs[1].float(), atol=2e-2, rtol=2e-2)
    assert be.error is None and replays >= 4


@needs_cuda
@needs_frontend
def test_cudnn_session_on_the_seqlen_form_matches_sdpa_session():
    from tests.engine.backend_sessions import assert_matches_sdpa

    def uses_seqlen(s):
        be = s.kv.attention
        assert isinstance(be, CuDNNSeqLenBackend), getattr(be, "frontend_error", None)
        assert be.error is None, be.error
        # 999-token pages: the window-filling steps exact (no paged form), the rest dense
        assert be.calls["fixed"] > 0 and be.forms["dense"] > 0 and be.paged_note
    assert_matches_sdpa("cudnn", check=uses_seqlen)
