"""LingBot-Map (streaming GCT): aggregator + causal camera head + DPT depth head.

Forward API used by the streaming session (engine/lingbot/session.py) and the benchmarks:

    out = model.forward_step(images, time_index=[...], first_frame=..., scale_phase=...,
                             kv=paged_kv_cache_or_None, camera_cache=cam_cache_or_None,
                             iterations=4)
    # images [S, 3, H, W] float in [0, 1], H and W multiples of 14
    # out: pose_enc [S, 9], depth [S, H, W], conf [S, H, W], and unless extras=False:
    #      pose_enc_list [S, K, 9], camera_features [S, 4, 2C] (token 0 of the four aggregator
    #      layers the heads read)

`model(images)` runs one bidirectional batch without caches (a scale phase on its own).

Sections: "patch_embed", each "frame_blocks" and "global_blocks" call (24 each), "camera_head" and
"depth_head" are named sections (engine/models/sections.py): profiler ranges, and timed by the
timer a benchmark installs with `sections.timing(timer)` (nothing is set on the model).

CUDA graphs (`aggregator.graph_scope`): "step" (the default) replays the patch embed, each frame
block and the depth head as graphs, and, when the KV backend has static steps (the cuDNN split:
`kv.static_key()`), the whole streamed step as ONE graph per step kind (`_graphed_step`: one launch
instead of one per part and layer; latency figures in docs/benchmarks.md); inside that graph the
camera head runs on a side stream beside the depth head (`_heads_stream`). "fixed" only the parts; "all" also each global block's halves around eager
attention and the camera head.

Dtypes: `set_dtype(torch.bfloat16)` converts the aggregator's matmul weights (Linear, Conv2d) and
its qk-norms; the residual stream, its LayerNorms and LayerScales, the special tokens and the
position embedding stay float32 (as under upstream's bf16 autocast, where only matmuls run in
bf16). The camera and depth heads always stay float32 and read float32 features, as upstream does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
import torch.nn as nn

from ..models.camera_head import CameraCache, CameraHead
from ..models.dpt_head import DPTHead
from ..models.layers import global_attend
from ..models.rope import Rope2D, Rotation, VideoRope3D
from ..models.sections import timer_installed
from ..models.trunk import IMAGENET_MEAN, IMAGENET_STD, Trunk, TrunkConfig, TrunkModel, build_preset


@dataclass
class LingBotMapConfig(TrunkConfig):
    """TrunkConfig (engine/models/trunk.py) and the 3D RoPE / training sizes."""
    rope3d_theta: float = 1e4
    rope3d_split: Optional[Sequence[int]] = None     # default (20, 22, 22) at head dim 64
    max_frame_num: int = 1024           # size of the released 3D-RoPE table (see engine/lingbot/session.py)
    trained_views: int = 320            # cached views seen in training
    extra: dict = field(default_factory=dict)

    @property
    def num_special(self) -> int:
        return 2 + self.num_register_tokens          # camera, registers, scale


class Aggregator(Trunk):
    """Patch embed + 6 special tokens per frame + alternating frame / global blocks (engine/models/trunk.py)."""

    def __init__(self, cfg: LingBotMapConfig):
        super().__init__(cfg)
        # scale token: variant 0 for scale-phase frames, variant 1 for the rest
        self.scale_token = nn.Parameter(torch.zeros(1, 2, 1, cfg.embed_dim))
        self.register_buffer("_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        head_dim = cfg.embed_dim // cfg.num_heads
        self.rope2d = Rope2D(head_dim, cfg.rope_freq)
        self.rope3d = VideoRope3D(head_dim, cfg.rope3d_theta, cfg.rope3d_split)
        self.graphs = None      # engine.models.graphs.GraphCache: replay fixed-shape parts (CUDA)
        # "fixed": patch embed, frame blocks, depth head. "all": also both halves of
        # each global block (around the eager attention) and the camera head (static-shape cache)
        # -- not the default: it was not faster than graphing the fixed parts only and holds more
        # graph memory (docs/benchmarks.md); kept for the GPU-bound regime it was meant for.
        # "step" (the default): as "fixed", and a streamed step whose KV backend attends with
        # fixed shapes and pointers (`kv.static_key()`, the cuDNN split) runs as ONE graph: the
        # whole network, KV writes and attention included (LingBotMap.forward_step).
        self.graph_scope = "step"
        self.graph_batch = 1    # steps of up to this many frames use the graphs (engine/scheduler.py raises it)
        self._in_step_graph = False     # capturing a whole step: its parts run unwrapped

    def _graphed(self, name, fn, *inputs):
        """fn(*inputs), through a CUDA graph when graphs are on and the step holds at most
        `graph_batch` frames (one graph per batch size; a scale phase stays eager)."""
        if self.graphs is None or self._in_step_graph or inputs[0].shape[0] > self.graph_batch:
            return fn(*inputs)
        return self.graphs.run(name, fn, *inputs)

    def special_tokens(self, num_frames: int, first_frame: bool, scale_phase: bool) -> torch.Tensor:
        """[S, 6, C]: camera, registers, scale for S consecutive frames (frame 0 first if `first_frame`)."""
        def pick(tok, first_variant0):
            rows = tok[0, 1:2].expand(num_frames, -1, -1)
            if first_variant0:
                rows = torch.cat((tok[0, 0:1], rows[1:]), dim=0)
            return rows
        cam = pick(self.camera_token, first_frame)
        reg = pick(self.register_token, first_frame)
        scale = self.scale_token[0, 0 if scale_phase else 1].expand(num_frames, -1, -1)
        return torch.cat((cam, reg, scale), dim=1)

    def forward(self, images: torch.Tensor, time_index: Sequence[int], first_frame: bool, scale_phase: bool,
                kv=None, rot3d: Optional[Rotation] = None) -> list[torch.Tensor]:
        """images [S, 3, H, W] in [0, 1] -> the 4 feature maps [S, T, 2C] the heads read
        (T = 6 specials + patches; each = frame-block output ‖ global-block output).
        rot3d: the 3D-RoPE rotation of `time_index` when the caller built it (a graph input)."""
        cfg = self.cfg
        S, _, H, W = images.shape
        gh, gw = H // cfg.patch_size, W // cfg.patch_size
        dtype = self.frame_blocks[0].attn.qkv.weight.dtype     # matmul dtype (q, k, RoPE tables)
        n_sp = cfg.num_special
        # RoPE tables (built on the CPU, rounded once to the compute dtype) are uploaded before any
        # GPU work of this step is queued, through pinned memory without a host sync (a blocking
        # copy mid-step would make the CPU wait until the GPU work queued before it finished).
        rot2d = self.rope2d.rotation(gh, gw, n_sp, images.device, dtype)
        if rot3d is None:
            rot3d = self.rope3d.rotation(list(time_index), gh, gw, n_sp, images.device, dtype)
        x = (images.float() - self._mean.float()) / self._std.float()
        with self._section("patch_embed"):
            patches = self._graphed("patch_embed", self.patch_embed, x)
        # [S, T, C] residual stream, in the dtype of the tokens and norms (float32 but in full fp16/bf16)
        x = torch.cat((self.special_tokens(S, first_frame, scale_phase), patches.to(self.camera_token.dtype)), dim=1)

        def frame_step(i, x):
            blk = self.frame_blocks[i]
            return self._graphed(("frame", i), lambda t: blk(t, rope=rot2d), x)

        def global_step(i, x):
            blk = self.global_blocks[i]
            if (self.graphs is not None and S == 1 and kv is not None and self.graph_scope == "all"
                    and not self._in_step_graph):
                # fixed-shape halves as CUDA graphs; the cache write + attention over the
                # growing KV set run eagerly in between
                q, k, v = self.graphs.run(("global_pre", i), lambda t, c, s: blk.attn_pre(
                    t, Rotation(c, s, rot3d.interleaved, rot3d.chunks)), x, rot3d.cos, rot3d.sin)
                return self.graphs.run(("global_post", i), blk.attn_post, x, global_attend(i, kv)(q, k, v))
            return blk(x, rope=rot3d, attend=global_attend(i, kv))

        return self.run_blocks(x, frame_step, global_step)


class LingBotMap(TrunkModel, nn.Module):
    def __init__(self, cfg: Optional[LingBotMapConfig] = None):
        super().__init__()
        self.config = cfg = cfg or LingBotMapConfig()
        self.check_layers(cfg)
        self.aggregator = Aggregator(cfg)
        self.camera_head = CameraHead(2 * cfg.embed_dim, cfg.camera_depth, cfg.camera_heads, cfg.mlp_ratio)
        self.depth_head = DPTHead(2 * cfg.embed_dim, cfg.patch_size, cfg.dpt_features, tuple(cfg.dpt_out_channels))
        self.residual_fp32 = True       # set_dtype's default precision policy (see there)
        self.step_graph_error = None    # why whole-step graphs stopped (`_graphed_step`)
        self.step_graph_replays = 0     # streamed steps run as one graph (benchmarks, tests)
        self.step_graph_pool_bytes = 0  # what the whole-step captures added to reserved memory (stats)
        self._step_keys_run: set = set()    # step kinds that ran eagerly once (`_graphed_step`)
        self.eval()

    # -- configuration (device: TrunkModel) ----------------------------------------------------
    @property
    def compute_dtype(self) -> torch.dtype:
        """dtype of the trunk's matmul weights."""
        return self.aggregator.frame_blocks[0].attn.qkv.weight.dtype

    def set_dtype(self, dtype: torch.dtype, residual_fp32: Optional[bool] = None) -> "LingBotMap":
        """Trunk matmuls (Linear, Conv2d weights) and qk-norms in `dtype`; with `residual_fp32`
        (the default, upstream's autocast precision) the residual stream and what acts on it in
        float32: the block LayerNorms and LayerScales, the final patch-embed norm, the special
        tokens and the position embedding. Heads in float32 (as upstream).
        `residual_fp32=False` converts the whole aggregator (the earlier behaviour: a bf16 residual
        loses the blocks' small updates, docs/model.md "Precision"); None = `self.residual_fp32`."""
        if residual_fp32 is None:
            residual_fp32 = self.residual_fp32
        agg = self.aggregator
        agg.to(dtype)
        if residual_fp32 and dtype != torch.float32:
            blocks = [*agg.patch_embed.blocks, *agg.frame_blocks, *agg.global_blocks]
            for blk in blocks:
                for m in (blk.norm1, blk.norm2, blk.ls1, blk.ls2):
                    m.float()
            pe = agg.patch_embed
            pe.norm.float()
            for p in (pe.cls_token, pe.pos_embed, pe.register_tokens, pe.mask_token,
                      agg.camera_token, agg.register_token, agg.scale_token):
                p.data = p.data.float()
        self.camera_head.float()
        self.depth_head.float()
        return self

    def kv_geometry(self) -> dict:
        """Shape facts a KV cache needs (per global layer)."""
        c = self.config
        return {"num_layers": c.depth, "num_heads": c.num_heads, "head_dim": c.embed_dim // c.num_heads,
                "special_tokens": c.num_special}

    def new_camera_cache(self, iterations: int, scale_frames: int, cap: int) -> CameraCache:
        return self.camera_head.new_cache(iterations, scale_frames, cap, self.device)

    # -- inference ----------------------------------------------------------------------------
    @torch.no_grad()
    def forward_step(self, images: torch.Tensor, *, time_index: Sequence[int], first_frame: bool,
                     scale_phase: bool, kv=None, camera_cache: Optional[CameraCache] = None,
                     iterations: int = 4, extras: bool = True) -> dict:
        cfg = self.config
        S, C3, H, W = images.shape
        if C3 != 3 or H % cfg.patch_size or W % cfg.patch_size:
            raise ValueError(f"images must be [S, 3, H, W] with H, W multiples of {cfg.patch_size}; got {tuple(images.shape)}")
        key = None if (extras or first_frame or scale_phase) else self._step_graph_key(S, kv, camera_cache, iterations)
        if key is not None:
            out = self._graphed_step(key, images, time_index, kv, camera_cache, iterations)
            if out is not None:
                return out
        feats = self.aggregator(images, time_index, first_frame, scale_phase, kv=kv)
        feats32 = [f.float() for f in feats]
        graphs = self.aggregator.graphs
        with self.aggregator._section("camera_head"):
            if graphs is not None and S == 1 and camera_cache is not None and self.aggregator.graph_scope == "all":
                # the whole iterative head as one graph over the fixed-capacity camera cache
                # (slot index and mask are device tensors the cache updates each step)
                poses = graphs.run(("camera_head", iterations, id(camera_cache)),
                                   lambda t: tuple(self.camera_head(t, iterations, camera_cache, static=True)),
                                   feats32[-1][:, 0])
            else:
                poses = self.camera_head(feats32[-1][:, 0], iterations, camera_cache)
        with self.aggregator._section("depth_head"):
            # one frame at a time outside graphs too: 8 full-resolution frames at once in float32
            # were the peak of a session's GPU memory (the scale phase)
            depth, conf = self.aggregator._graphed("depth_head", lambda *f: self._depth(list(f), (H, W)), *feats32)
        out = {"pose_enc": poses[-1], "depth": depth, "conf": conf}
        if extras:
            out.update(pose_enc_list=torch.stack(poses, dim=1),
                       camera_features=torch.stack([f[:, 0] for f in feats32], dim=1))
        return out

    def _depth(self, feats32: list, hw: tuple) -> tuple:
        """The depth head, one frame at a time, in float32 as upstream."""
        if feats32[0].is_cuda and not getattr(self, "_depth_cl", False):
            # convolution weights in channels-last: every conv of the head then runs NHWC end to end
            # (with NCHW weights cuDNN transposes the activations before and after each conv)
            self.depth_head.to(memory_format=torch.channels_last)
            self._depth_cl = True
        return self.depth_head(feats32, hw, self.config.num_special, chunk=1)

    # -- one streamed step as one CUDA graph ---------------------------------------------------
    def _step_graph_key(self, S: int, kv, camera_cache, iterations: int):
        """The graph key of a streamed one-frame step that can run as one captured graph (graphs
        on, scope "step", a KV backend with static steps, no section timer installed), else None."""
        agg = self.aggregator
        if (agg.graphs is None or agg.graph_scope != "step" or S != 1 or kv is None or camera_cache is None
                or self.step_graph_error is not None or timer_installed()):
            return None
        fn = getattr(kv, "static_key", None)
        key = fn() if fn is not None else None
        return None if key is None else ("step", key, iterations, id(camera_cache))

    def _graphed_step(self, key, images, time_index, kv, camera_cache, iterations: int) -> Optional[dict]:
        """The whole streamed step -- aggregator with KV writes and attention, the camera head over
        its fixed-capacity cache, the depth head -- captured once per `key` and replayed: one launch
        instead of ~2,000. Inputs copied into the graph: the image and the step's 3D-RoPE tables;
        every index it writes or reads is a persistent device buffer its caches update before the
        replay (kv `static_key`, camera cache `_at`). The warm-up and capture runs repeat the
        step's writes with the same values, so caches end as after one eager step. A failed
        capture is recorded in `step_graph_error` and the step (and every later one) runs eagerly:
        None is returned."""
        agg, cfg = self.aggregator, self.config
        _, _, H, W = images.shape
        rot = agg.rope3d.rotation(list(time_index), H // cfg.patch_size, W // cfg.patch_size, cfg.num_special,
                                  images.device, self.compute_dtype)

        side = self._heads_stream(images.device)

        def step(img, cos, sin):
            r = Rotation(cos, sin, rot.interleaved, rot.chunks)
            feats32 = [f.float() for f in agg(img, time_index, False, False, kv=kv, rot3d=r)]
            if side is None:
                poses = self.camera_head(feats32[-1][:, 0], iterations, camera_cache, static=True)
                depth, conf = self._depth(feats32, (H, W))
                return poses[-1], depth, conf
            # the camera head (a chain of matrix-vector products, memory-bound) on a side stream
            # beside the depth head (convolutions, compute-bound); both read only the trunk's output
            main = torch.cuda.current_stream()
            side.wait_stream(main)
            with torch.cuda.stream(side):
                poses = self.camera_head(feats32[-1][:, 0], iterations, camera_cache, static=True)
            depth, conf = self._depth(feats32, (H, W))
            main.wait_stream(side)
            return poses[-1], depth, conf

        if key not in self._step_keys_run:
            # the first step of a kind runs eagerly: a kernel that fails there sends the backend
            # to its fallback (no static key) before anything is captured
            self._step_keys_run.add(key)
            return None
        capture = not agg.graphs.has(key)
        if capture:
            # what the capture allocates comes from the graphs' private pool, and the allocator
            # cannot give the ordinary pool's cached blocks back while a capture runs: release
            # them first, then count what the pool took
            reserved = _release_cached(images.device)
        agg._in_step_graph = True
        try:
            # the longest capture of a session, while the app's reader and store threads run:
            # their CUDA calls must not invalidate it (a failure would only cost speed, below)
            pose, depth, conf = agg.graphs.run(key, step, images, rot.cos, rot.sin, error_mode="thread_local")
        except Exception as exc:        # e.g. a kernel that cannot be captured: eager from now on
            before = "" if not capture or reserved is None else (
                f" [before this capture: {reserved / 2**30:.2f} GiB reserved, "
                f"{agg.graphs.step_graphs()} step graphs, {self.step_graph_replays} replays]")
            self.step_graph_error = (f"{type(exc).__name__}: {exc}"[:500] + before)
            agg.graphs.discard(key)
            _release_cached(images.device)
            return None
        finally:
            agg._in_step_graph = False
        if capture and reserved is not None:
            self.step_graph_pool_bytes += max(0, _release_cached(images.device) - reserved)
        if kv.static_key() != key[1]:   # the backend left its static path while capturing
            self.step_graph_error = f"the attention backend left its static path during capture ({kv.static_key()})"
            agg.graphs.discard(key)
            return None                 # the step again, eagerly (its cache writes are idempotent)
        self.step_graph_replays += 1
        return {"pose_enc": pose, "depth": depth, "conf": conf}

    def _heads_stream(self, device):
        """The side stream of the camera head inside whole-step graphs (CUDA only)."""
        if device.type != "cuda":
            return None
        if getattr(self, "_side_stream", None) is None:
            self._side_stream = torch.cuda.Stream(device)
        return self._side_stream

    def forward(self, images: torch.Tensor, iterations: int = 4) -> dict:
        """One bidirectional batch (no caches): frame 0 is the reference, all frames are scale frames."""
        return self.forward_step(images, time_index=range(images.shape[0]), first_frame=True, scale_phase=True,
                                 iterations=iterations)


def _release_cached(device) -> Optional[int]:
    """Return the allocator's cached, unused blocks to CUDA and give the bytes it still reserves
    (None off CUDA)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved(device)


# tiny: the same architecture scaled down for tests of other modules (KV cache, checkpoints,
# sessions): embed_dim 64, 4 heads (head dim 16, 3D-RoPE split 8/4/4), depth 4 (features of layers
# 0-3), DINOv2 depth 2, camera head 2 blocks at 128 with 4 heads, DPT features 32, out channels
# (16, 32, 64, 64), img_size 112 (pos-embed grid 8x8); 1.26 M parameters. Any input size that is a
# multiple of 14 works (e.g. 56x70 -> 4x5 patches, 26 tokens per frame).
TINY = dict(img_size=112, embed_dim=64, depth=4, num_heads=4, patch_embed_depth=2, patch_embed_heads=4,
            intermediate_layers=(0, 1, 2, 3), camera_depth=2, camera_heads=4, dpt_features=32,
            dpt_out_channels=(16, 32, 64, 64))
MODELS = {"lingbot-map": {}, "lingbot-map-tiny": TINY}


def build_lingbot(name: str = "lingbot-map", **overrides) -> LingBotMap:
    from ..api import EngineError
    if name not in MODELS:
        raise EngineError(f"unknown LingBot-Map model {name!r}; available: {', '.join(MODELS)}")
    return build_preset(name, MODELS, LingBotMapConfig, LingBotMap, overrides)
