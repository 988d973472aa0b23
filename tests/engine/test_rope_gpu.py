"""3D RoPE tables built on the GPU (engine/models/rope.py `_rotation_on`) against the host tables."""
import pytest
import torch

from engine.models.rope import VideoRope3D

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("times", [[70], [8, 9, 10, 11], [5, 3000]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_tables_match_host_tables(times, dtype):
    rope = VideoRope3D(64)
    ref = rope.rotation(times, 28, 37, 6, "cpu", dtype)
    got = rope.rotation(times, 28, 37, 6, "cuda", dtype)
    assert got.cos.device.type == "cuda" and got.cos.dtype == dtype
    # float64 cos/sin of the GPU's libdevice and the host's libm may differ in the last bits;
    # rounded to float32 / bf16 that is at most one unit in the last place
    tol = {torch.float32: 1e-6, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(got.cos.cpu(), ref.cos, atol=tol, rtol=0)
    torch.testing.assert_close(got.sin.cpu(), ref.sin, atol=tol, rtol=0)
