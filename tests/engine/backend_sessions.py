"""Shared by the GPU tests that compare an attention backend's full-size LingBot-Map session with
an SDPA session on the same frames (eviction and keyframe rollback in play)."""
import numpy as np
import torch


def rel(a, b) -> float:
    """Relative L2 difference of `a` against `b`."""
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def backend_results(model, backend: str, frames, check=None) -> list:
    """All results of `frames` through a bf16 CUDA session on `backend` (window 4, keyframe
    interval 2: evictions and non-keyframe rollbacks both happen); `check(session)` runs before
    the session closes."""
    from engine import SessionConfig, open_session
    s = open_session(SessionConfig(engine="lingbot-map", device="cuda", dtype="bf16", backend=backend,
                                   scale_frames=2, window=4, keyframe_interval=2, special_cap=8), model=model)
    res = []
    for f in frames:
        res += s.push(f)
    res += s.flush()
    assert s.stats()["kv"]["backend"] == backend
    if check is not None:
        check(s)
    s.close()
    return res


def assert_matches_sdpa(backend: str, check=None) -> None:
    """14 random frames through `backend` and through SDPA on one full-size bf16 model: as many
    results, poses and depth within 5e-2 relative."""
    from tests.engine.factories import random_model
    model = random_model("lingbot-map", "cuda")
    gen = torch.Generator().manual_seed(3)
    frames = [torch.rand(3, 378, 518, generator=gen) for _ in range(14)]
    b = backend_results(model, "sdpa", frames)
    a = backend_results(model, backend, frames, check)
    assert len(a) == len(b) == len(frames)
    pose = rel(np.stack([r.pose_enc for r in a]), np.stack([r.pose_enc for r in b]))
    depth = rel(np.stack([r.depth for r in a]), np.stack([r.depth for r in b]))
    print(f"relative difference {backend} vs sdpa: pose_enc {pose:.2e}, depth {depth:.2e}")
    assert np.isfinite(pose) and np.isfinite(depth)
    assert pose < 5e-2 and depth < 5e-2
