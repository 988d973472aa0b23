"""Ring attention (engine/parallel/ring_attention.py): exact against single-process attention.

The distributed cases spawn 2-4 gloo processes on the CPU (localhost, file rendezvous); each
rank writes its output shard to a file and the test compares the concatenation with one SDPA
call over the whole sequence (fp32, 1e-5)."""
import os

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from engine.parallel import attention_lse, blockwise_attention, ring_attention, split_lengths

# (world, key/query shard lengths per rank, batch, heads, head dim); uneven shards, an empty one
CASES = {
    2: [((7, 12), 1, 4, 16), ((33, 1), 2, 3, 8)],
    3: [((5, 0, 9), 1, 2, 16)],
    4: [((5, 13, 1, 7), 1, 4, 16), ((8, 8, 8, 8), 2, 2, 32)],
}


def _full_inputs(case_id: int, lengths, B, H, D):
    g = torch.Generator().manual_seed(1000 + case_id)
    L = sum(lengths)
    return [torch.randn(B, H, L, D, generator=g) * 2 for _ in range(3)]


def _worker(rank: int, world: int, tmp: str):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rdzv", rank=rank, world_size=world)
    try:
        outs = []
        for i, (lengths, B, H, D) in enumerate(CASES[world]):
            q, k, v = _full_inputs(i, lengths, B, H, D)
            a = sum(lengths[:rank])
            sl = slice(a, a + lengths[rank])
            pass_lengths = lengths if i % 2 else None      # both the given and the gathered path
            outs.append(ring_attention(q[:, :, sl], k[:, :, sl], v[:, :, sl], lengths=pass_lengths))
        torch.save(outs, os.path.join(tmp, f"out{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_attention_gloo_exact(tmp_path, world):
    mp.spawn(_worker, args=(world, str(tmp_path)), nprocs=world, join=True)
    shards = [torch.load(tmp_path / f"out{r}.pt") for r in range(world)]
    for i, (lengths, B, H, D) in enumerate(CASES[world]):
        q, k, v = _full_inputs(i, lengths, B, H, D)
        got = torch.cat([shards[r][i] for r in range(world)], dim=2)
        ref = F.scaled_dot_product_attention(q, k, v)
        assert got.shape == ref.shape
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_blockwise_merge_equals_full_attention():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, n, 16, generator=g) * 3 for n in (11, 40, 40))
    cuts = [0, 1, 17, 17, 40]                      # uneven, one empty block
    kb = [k[:, :, a:b] for a, b in zip(cuts, cuts[1:])]
    vb = [v[:, :, a:b] for a, b in zip(cuts, cuts[1:])]
    out, lse = blockwise_attention(q, kb, vb, return_lse=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=1e-5, atol=1e-5)
    ref_lse = torch.logsumexp(q @ k.transpose(-1, -2) / 4.0, dim=-1)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)


def test_attention_lse_math_fallback_matches_fused(monkeypatch):
    import importlib
    ra = importlib.import_module("engine.parallel.ring_attention")
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for n in (9, 21, 21))
    fused = attention_lse(q, k, v)
    monkeypatch.setattr(ra, "_MATH_CHUNK", 4)      # several query chunks
    math_out = ra._math_attention_lse(q, k, v, 8 ** -0.5)
    torch.testing.assert_close(fused[0], math_out[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused[1], math_out[1], rtol=1e-5, atol=1e-5)


def test_without_a_process_group_it_is_plain_attention():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, 10, 16, generator=g) for _ in range(3))
    torch.testing.assert_close(ring_attention(q, k, v), F.scaled_dot_product_attention(q, k, v),
                               rtol=1e-5, atol=1e-5)


def test_split_lengths():
    assert split_lengths(10, 4) == [3, 3, 2, 2] and split_lengths(3, 4) == [1, 1, 1, 0]


# -- LingBot-Map's scale phase over the ring (engine/parallel/lingbot_ring.py) -------------------

def _frames(n=6):
    import numpy as np
    rng = np.random.default_rng(11)
    return [rng.integers(0, 256, (60, 80, 3), dtype=np.uint8) for _ in range(n)]


def _session_cfg(**kw):
    from engine import SessionConfig
    base = dict(engine="lingbot-map", image_width=70, scale_frames=3, window=3, special_cap=8,
                camera_iterations=2)
    base.update(kw)
    return SessionConfig(**base)


def _run_session(cfg):
    import numpy as np
    from engine import open_session
    from engine.model_zoo import build_model
    from engine.models.recipe import fill_recipe
    model = fill_recipe(build_model("lingbot-map-tiny"))
    seen = []                         # frames per aggregator call (shows the split)
    model.aggregator.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
    s = open_session(cfg, model=model)
    res = [r for f in _frames() for r in s.push(f)]
    kv = s.kv
    slots = kv.committed_slots()
    L, N, P, H, D = kv.k_pool.shape
    cache_k = kv.k_pool.view(L, N * P, H, D)[:, slots].clone()
    s.close()
    return (np.stack([r.pose_enc for r in res]), np.stack([r.depth for r in res]),
            np.stack([r.conf for r in res]), cache_k, seen)


def _session_worker(rank: int, world: int, tmp: str):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rdzv", rank=rank, world_size=world)
    try:
        torch.save(_run_session(_session_cfg(sequence_parallel="ring", ring_world_size=world)),
                   os.path.join(tmp, f"sess{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_lingbot_scale_phase_over_two_gloo_ranks_equals_one_process(tmp_path):
    import numpy as np
    mp.spawn(_session_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
    ref = _run_session(_session_cfg())
    for rank in range(2):             # 3 scale frames split 2 + 1, then 3 streamed frames
        got = torch.load(tmp_path / f"sess{rank}.pt", weights_only=False)
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got[1], ref[1], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[2], ref[2], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[3], ref[3], rtol=1e-5, atol=1e-5)   # every rank's full KV cache
        assert got[4] == [[2, 1][rank], 1, 1, 1] and ref[4] == [3, 1, 1, 1]


def test_ring_setting_without_a_process_group_is_a_clear_error():
    from engine import EngineError
    with pytest.raises(EngineError, match="torch.distributed"):
        _run_session(_session_cfg(sequence_parallel="ring"))


# -- VGGT chunks over the ring (engine/parallel/vggt_ring.py) ------------------------------------

def _run_vggt(**kw):
    import numpy as np
    from engine import SessionConfig, build_model, open_session
    from engine.models.recipe import fill_recipe
    model = fill_recipe(build_model("vggt-tiny"))
    seen = []
    model.aggregator.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
    cfg = SessionConfig(**{**dict(engine="vggt-1b", image_width=70, chunk_size=4, overlap=1, backend="sdpa",
                                  camera_iterations=2), **kw})
    s = open_session(cfg, model=model)
    g = torch.Generator().manual_seed(21)
    res = [r for _ in range(9) for r in s.push(torch.rand(3, 56, 70, generator=g))] + s.flush()
    s.close()
    return (np.stack([r.pose_enc for r in res]), np.stack([r.depth for r in res]),
            np.stack([r.c2w for r in res]), seen)


def _vggt_worker(rank: int, world: int, tmp: str):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rdzv", rank=rank, world_size=world)
    try:
        out = [_run_vggt(sliding_window_num=w, sequence_parallel="ring") for w in (1, 2)]
        torch.save(out, os.path.join(tmp, f"vggt{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_vggt_chunks_over_two_gloo_ranks_equal_one_process(tmp_path):
    import numpy as np
    mp.spawn(_vggt_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
    refs = [_run_vggt(sliding_window_num=w) for w in (1, 2)]
    for rank in range(2):
        got = torch.load(tmp_path / f"vggt{rank}.pt", weights_only=False)
        for g, ref in zip(got, refs):
            np.testing.assert_allclose(g[0], ref[0], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(g[1], ref[1], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(g[2], ref[2], rtol=1e-5, atol=1e-5)
        # chunks of 4, 4, 3 frames. A chunk that sees only itself is split 2 + 2; a chunk that also
        # sees cached frames runs whole on every rank: with a window of 2 chunks every chunk after
        # the first, with independent chunks the short last one (its 3 frames evict only 3 of the
        # 4 cached ones, so one earlier frame stays visible)
        assert got[0][3] == [2, 2, 3] and refs[0][3] == [4, 4, 3]
        assert got[1][3] == [2, 4, 3]
