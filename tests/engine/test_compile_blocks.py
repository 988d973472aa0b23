"""engine/models/compile.py: the blocks' halves under torch.compile compute what the plain blocks
compute (CPU: the "aot_eager" backend, bit-identical; GPU: a full-size bf16 session with
the setting compile_blocks against the default one, to bf16 tolerance), compiling is
idempotent and undone exactly, and a session compiles only on CUDA when asked."""
import numpy as np
import pytest
import torch

from engine import SessionConfig, open_session
from engine.model_zoo import build_model
from engine.models.compile import blocks_compiled, compile_blocks, uncompile_blocks
from engine.models.recipe import fill_recipe


@pytest.fixture(scope="module")
def tiny():
    return fill_recipe(build_model("lingbot-map-tiny"))


def test_compiled_halves_equal_plain_and_undo(tiny):
    x = torch.rand(2, 3, 56, 70, generator=torch.Generator().manual_seed(1))
    ref = tiny(x)
    n = compile_blocks(tiny, backend="aot_eager")
    try:
        assert n == 2 * (2 + 4 + 4) and blocks_compiled(tiny)
        assert compile_blocks(tiny, backend="aot_eager") == n        # idempotent
        got = tiny(x)
    finally:
        uncompile_blocks(tiny)
    assert not blocks_compiled(tiny)
    for k in ("pose_enc", "depth", "conf"):
        torch.testing.assert_close(got[k], ref[k], rtol=0, atol=0)


def test_session_compiles_only_on_cuda_when_asked(tiny):
    compile_blocks(tiny, backend="aot_eager")          # left over from an earlier session
    s = open_session(SessionConfig(engine="lingbot-map", image_width=70, scale_frames=2, window=3,
                                   special_cap=8, camera_iterations=2, compile_blocks=True), model=tiny)
    assert not blocks_compiled(tiny)                     # CPU: plain blocks, though asked
    s.close()


@pytest.mark.gpu
def test_cuda_compiled_session_matches_default():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from tests.engine.factories import random_model
    model = random_model("lingbot-map", "cuda")
    gen = torch.Generator().manual_seed(4)
    frames = [torch.rand(3, 378, 518, generator=gen) for _ in range(10)]
    out = {}
    for compiled in (False, True):
        s = open_session(SessionConfig(engine="lingbot-map", device="cuda", dtype="bf16", scale_frames=2,
                                       window=4, keyframe_interval=2, special_cap=8, compile_blocks=compiled),
                         model=model)
        assert blocks_compiled(model) == compiled
        res = []
        for f in frames:
            res += s.push(f)
        res += s.flush()
        s.close()
        out[compiled] = res
    uncompile_blocks(model)
    rel = lambda a, b: float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))  # noqa: E731
    for a, b in zip(out[True], out[False]):
        assert rel(a.depth, b.depth) < 2e-2, a.index
        assert rel(a.pose_enc, b.pose_enc) < 5e-2, a.index
