"""The GPU side of the live viewer's point cloud: one vispy Visual (`SegmentCloudVisual`) whose
attributes live in ONE vertex buffer written with `set_subdata` (appends and thinning passes upload
only the rows that changed), the per-frame transforms in one float texture (`FrameTransforms`: a
re-alignment rewrites 64 bytes per frame, never the points), and the per-level index lists of the
level-of-detail draw (`LevelIndex`). ui/viewer.py decides what to draw and when; this module
holds the GL state and the shaders. Why a custom visual and how the levels are drawn: the
docstring of ui/viewer.py.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

import numpy as np
from vispy import gloo, scene
from vispy.gloo.context import get_current_canvas
from vispy.visuals import Visual

from engine.scene import LOD_LEVELS, SceneModel

log = logging.getLogger(__name__)

_VERT = """
uniform sampler2D u_xf_tex;      // frame i: texture row i / 256, 4 RGBA texels = the 4 columns
uniform float u_xf_rows;
uniform float u_size;
uniform float u_conf_min;
uniform float u_color_mode;      // 0 rgb, 1 depth, 2 confidence
uniform vec2 u_depth_range;
uniform vec2 u_conf_range;
uniform float u_overlay;         // 1 = lines: keep own colour, ignore the threshold
attribute vec3 a_position;
attribute float a_color;         // r + 256 g + 65536 b (exact in float32)
attribute float a_conf;
attribute vec2 a_depth_seg;      // (depth in the capturing camera, frame sequence number)
varying vec4 v_color;

vec3 ramp(float t) {             // blue -> cyan -> green -> yellow -> red
    return clamp(vec3(1.5 - abs(4.0 * t - 3.0), 1.5 - abs(4.0 * t - 2.0),
                      1.5 - abs(4.0 * t - 1.0)), 0.0, 1.0);
}

mat4 frame_matrix(float i) {
    float row = floor(i / 256.0);                 // exact: i < 2^24 and a power-of-two divisor
    float u = (4.0 * (i - 256.0 * row) + 0.5) / 1024.0;
    float v = (row + 0.5) / u_xf_rows;
    float du = 1.0 / 1024.0;
    return mat4(texture2D(u_xf_tex, vec2(u, v)), texture2D(u_xf_tex, vec2(u + du, v)),
                texture2D(u_xf_tex, vec2(u + 2.0 * du, v)), texture2D(u_xf_tex, vec2(u + 3.0 * du, v)));
}

void main() {
    if (u_overlay < 0.5 && a_conf < u_conf_min) {
        gl_Position = vec4(0.0, 0.0, 2.0, 1.0);   // beyond the far plane: clipped, no fragment
        gl_PointSize = 1.0;
        v_color = vec4(0.0);
    } else {
        vec4 world = frame_matrix(a_depth_seg.y) * vec4(a_position, 1.0);
        gl_Position = $transform(world);
        gl_PointSize = u_size;
        vec3 rgb = vec3(mod(a_color, 256.0), mod(floor(a_color / 256.0), 256.0),
                        floor(a_color / 65536.0)) / 255.0;
        if (u_overlay < 0.5 && u_color_mode > 0.5) {
            float t;
            if (u_color_mode < 1.5)
                t = (a_depth_seg.x - u_depth_range.x) / max(u_depth_range.y - u_depth_range.x, 1e-6);
            else
                t = (a_conf - u_conf_range.x) / max(u_conf_range.y - u_conf_range.x, 1e-6);
            rgb = ramp(clamp(t, 0.0, 1.0));
        }
        v_color = vec4(rgb, 1.0);
    }
}
"""

_FRAG = """
uniform float u_round;
varying vec4 v_color;
void main() {
    if (u_round > 0.5) {
        vec2 d = gl_PointCoord - vec2(0.5);
        if (dot(d, d) > 0.25) discard;
    }
    gl_FragColor = v_color;
}
"""


def pack_rgb(colors: np.ndarray) -> np.ndarray:
    """uint8 [N,3] → float32 [N] holding r + 256 g + 65536 b (one 4-byte attribute per point)."""
    c = np.asarray(colors, dtype=np.uint32)
    return (c[:, 0] + (c[:, 1] << 8) + (c[:, 2] << 16)).astype(np.float32)


FRUSTUM_VERTICES = 16       # line vertices per camera frustum (apex → 4 corners, image rectangle)
TRAJECTORY_VERTICES = 2     # line vertices per camera on the trajectory (one segment to the previous)


class _GrowableAttribute:
    """One GPU vertex buffer, with a host mirror for the small line layers (which own their
    data) and without one for the point cloud (the SceneModel owns it). Appends upload only the
    new rows; when full the capacity doubles: with a mirror it is uploaded once, without one the
    buffer is re-allocated empty and the caller uploads what it holds."""

    def __init__(self, width: int, capacity: int, fill: float = 0.0, mirror: bool = True):
        self.width = width
        self.fill = fill
        self.host = np.full((capacity, width), fill, np.float32) if mirror else None
        self._capacity = capacity
        self.vbo = gloo.VertexBuffer(np.full((1, width), fill, np.float32))
        self.vbo.resize_bytes(capacity * width * 4)
        if mirror:
            self.vbo.set_data(self.host)
        self.uploaded_bytes = self.host.nbytes if mirror else 0
        self.full_uploads = 1

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def nbytes(self) -> int:
        return self._capacity * self.width * 4

    def grow(self, capacity: int, used: int) -> None:
        self._capacity = capacity
        if self.host is None:
            self.vbo.resize_bytes(capacity * self.width * 4)
            self.full_uploads += 1
            return
        host = np.full((capacity, self.width), self.fill, np.float32)
        host[:used] = self.host[:used]
        self.host = host
        self.vbo.set_data(self.host)
        self.uploaded_bytes += self.host.nbytes
        self.full_uploads += 1

    def write(self, offset: int, rows: np.ndarray, copy: bool = True) -> None:
        """copy=False only when the GL commands are executed before `rows` can change."""
        rows = np.array(rows, np.float32, copy=True if copy else None).reshape(-1, self.width)
        if self.host is not None:
            self.host[offset:offset + len(rows)] = rows
        self.vbo.set_subdata(rows, offset=offset)
        self.uploaded_bytes += rows.nbytes


class FrameTransforms:
    """The per-frame 4x4 transforms as one RGBA32F texture shared by the viewer's layers: frame i
    is row i // 256, texels 4 (i % 256) .. + 3 = its columns. Rows grow by doubling (one full
    upload); `write` uploads only the texture rows of the frames written."""

    PER_ROW = 256

    def __init__(self, rows: int = 4):
        self.host = self._identity(rows)
        self.texture = gloo.Texture2D(self.host, format="rgba", internalformat="rgba32f",
                                      interpolation="nearest", wrapping="clamp_to_edge")
        self.uploads = 0
        self.uploaded_bytes = self.host.nbytes

    @classmethod
    def _identity(cls, rows: int) -> np.ndarray:
        return np.tile(np.eye(4, dtype=np.float32)[None, None], (rows, cls.PER_ROW, 1, 1)).reshape(
            rows, 4 * cls.PER_ROW, 4)

    @property
    def rows(self) -> int:
        return self.host.shape[0]

    def write(self, lo: int, mats: np.ndarray) -> None:
        """Frames [lo, lo + n) get the 4x4 matrices `mats` [n,4,4]."""
        n = len(mats)
        if n == 0:
            return
        hi = lo + n
        rows = self.rows
        while rows * self.PER_ROW < hi:
            rows *= 2
        grown = rows != self.rows
        if grown:
            host = self._identity(rows)
            host[: self.rows] = self.host
            self.host = host
        flat = self.host.reshape(-1, 4, 4)          # texel c of frame i = column c of its matrix
        flat[lo:hi] = np.transpose(np.asarray(mats, np.float32), (0, 2, 1))
        if grown:
            self.texture.set_data(self.host)
            self.uploaded_bytes += self.host.nbytes
        else:
            r0, r1 = lo // self.PER_ROW, (hi - 1) // self.PER_ROW + 1
            block = self.host[r0:r1].copy()          # GLIR uploads later
            self.texture.set_data(block, offset=(r0, 0))
            self.uploaded_bytes += block.nbytes
        self.uploads += 1

    def reset(self) -> None:
        self.host[:] = self._identity(1)[0]
        self.texture.set_data(self.host)
        self.uploads += 1


INDEX_BLOCK = 1 << 17       # entries per GPU index buffer of the level lists (512 KiB)


class IndexBlocks:
    """GPU index buffers of INDEX_BLOCK entries, each created once on first need and then reused
    (a free list shared by the view's level lists): a list grows by taking a block, never by
    re-creating a larger buffer and uploading every entry again (an O(entries) block of the GUI
    thread at a few million points). The pool's size follows the entries held at the peak: about
    two layouts' worth during a catch-up (ui/viewer.py), so it is bounded by the point budget."""

    def __init__(self):
        self.free: list = []
        self.created = 0

    def take(self):
        if self.free:
            return self.free.pop()
        self.created += 1
        return gloo.IndexBuffer(np.zeros(INDEX_BLOCK, np.uint32))

    def give(self, blocks: list) -> None:
        self.free.extend(blocks)
        blocks.clear()

    @property
    def nbytes(self) -> int:
        """GPU bytes of every block created."""
        return self.created * INDEX_BLOCK * 4


class LevelIndex:
    """Per draw-order level, the rows of that level in row order: a host uint32 array (grown by
    doubling: a host copy only) and on the GPU a list of fixed-size index blocks from a shared
    `IndexBlocks` pool. `update(model, start, stop)` keeps them equal to the model's rows
    [0, stop): entries >= start are dropped and rows [start, stop) appended, so appends cost
    O(new rows) and a thinning pass O(rows it rewrote); `views(level, k)` are the (buffer,
    count) pairs that draw a level's first k entries."""

    def __init__(self, levels: int = LOD_LEVELS, capacity: int = 1 << 14, pool: Optional[IndexBlocks] = None):
        self.host = [np.zeros(capacity, np.uint32) for _ in range(levels)]
        self.used = [0] * levels
        self.pool = pool if pool is not None else IndexBlocks()
        self.blocks: list = [[] for _ in range(levels)]
        self.uploaded_bytes = 0

    def clear(self) -> None:
        self.used = [0] * len(self.used)
        for b in self.blocks:
            self.pool.give(b)

    def _put(self, j: int, n: int, rows: np.ndarray) -> None:
        """Level j: entries [n, n + len(rows)) = rows (host, then the GPU blocks they fall in)."""
        need = n + len(rows)
        h = self.host[j]
        if need > len(h):
            cap = len(h)
            while cap < need:
                cap *= 2
            grown = np.zeros(cap, np.uint32)
            grown[:n] = h[:n]
            self.host[j] = h = grown
        h[n:need] = rows
        blocks = self.blocks[j]
        nb = -(-need // INDEX_BLOCK)
        while len(blocks) > nb:                  # truncated: blocks past the end go back
            self.pool.free.append(blocks.pop())
        while len(blocks) < nb:
            blocks.append(self.pool.take())
        e = n
        while e < need:                          # GLIR uploads later: copies
            b, o = divmod(e, INDEX_BLOCK)
            k = min(need - e, INDEX_BLOCK - o)
            blocks[b].set_subdata(h[e:e + k].copy(), offset=o)
            self.uploaded_bytes += 4 * k
            e += k
        self.used[j] = need

    def update(self, model: SceneModel, start: int, stop: Optional[int] = None) -> None:
        stop = model.count if stop is None else stop
        lv = model.level[start:stop]
        order = np.argsort(lv, kind="stable")
        bounds = np.searchsorted(lv[order], np.arange(len(self.used) + 1))
        for j in range(len(self.used)):
            n = self.count_before(j, start)
            rows = (order[bounds[j]:bounds[j + 1]] + start).astype(np.uint32)
            self._put(j, n, rows)

    def copy_prefix(self, other: "LevelIndex", row: int) -> None:
        """Become `other`'s entries of rows < row (host copy and uploads into this one's blocks)."""
        for j in range(len(self.used)):
            self._put(j, 0, other.host[j][: other.count_before(j, row)])

    def count_before(self, level: int, row: int) -> int:
        """Entries of `level` that are rows < `row`."""
        # a uint32 needle: a Python int would make numpy cast the whole list first (O(entries))
        return int(np.searchsorted(self.host[level][: self.used[level]], np.uint32(min(max(row, 0), 0xFFFFFFFF)),
                                   "left"))

    def views(self, level: int, k: int) -> list:
        """(index buffer, count) pairs drawing the level's first k entries."""
        out = []
        for b in range(-(-k // INDEX_BLOCK)):
            out.append((self.blocks[level][b], min(INDEX_BLOCK, k - b * INDEX_BLOCK)))
        return out

    @property
    def nbytes(self) -> int:
        return sum(h.nbytes for h in self.host)


class SegmentCloudVisual(Visual):
    """Points or lines with per-vertex frame numbers (placed by the shared `FrameTransforms`)
    and uniform-driven styling: appended (line layers, `append`) or written row ranges from a
    SceneModel (the cloud, `write_rows`)."""

    _ATTRS = (("a_position", 3, 0.0), ("a_color", 1, 0.0), ("a_conf", 1, 0.0), ("a_depth_seg", 2, 0.0))
    BYTES_PER_VERTEX = 4 * sum(w for _, w, _ in _ATTRS)

    def __init__(self, mode: str = "points", capacity: int = 1 << 16, overlay: bool = False,
                 mirror: bool = True, frame_xf: Optional[FrameTransforms] = None):
        Visual.__init__(self, vcode=_VERT, fcode=_FRAG)
        self._draw_mode = mode
        self.count = 0
        self._attrs = {name: _GrowableAttribute(w, capacity, fill, mirror) for name, w, fill in self._ATTRS}
        self.frame_xf = frame_xf if frame_xf is not None else FrameTransforms()
        self._uniforms: dict[str, bytes] = {}
        p = self.shared_program
        p["u_xf_tex"] = self.frame_xf.texture
        self.set_uniform("u_xf_rows", float(self.frame_xf.rows))
        p["u_size"] = 2.0
        p["u_conf_min"] = -3.0e38
        p["u_color_mode"] = 0.0
        p["u_depth_range"] = (0.0, 1.0)
        p["u_conf_range"] = (0.0, 1.0)
        p["u_overlay"] = 1.0 if overlay else 0.0
        p["u_round"] = 1.0 if mode == "points" else 0.0
        self.set_gl_state(depth_test=True, blend=False)

    # -- data ---------------------------------------------------------------------------------
    @property
    def uploaded_bytes(self) -> int:
        return sum(a.uploaded_bytes for a in self._attrs.values())

    @property
    def capacity(self) -> int:
        return self._attrs["a_position"].capacity

    @property
    def buffer_bytes(self) -> int:
        """GPU bytes allocated for this layer's vertices."""
        return sum(a.nbytes for a in self._attrs.values())

    def reserve(self, capacity: int) -> None:
        """Re-allocate every buffer at `capacity` vertices (contents kept only with a mirror)."""
        if capacity != self.capacity:
            for a in self._attrs.values():
                a.grow(capacity, min(self.count, capacity))

    def write_rows(self, offset: int, positions, packed_colors, conf, depth, frame, copy: bool = True) -> None:
        """Overwrite vertices [offset, offset + n) (`set_count` says how many are drawn)."""
        self._attrs["a_position"].write(offset, positions, copy)
        self._attrs["a_color"].write(offset, packed_colors, False)        # computed here: no alias
        self._attrs["a_conf"].write(offset, conf, copy)
        self._attrs["a_depth_seg"].write(offset, np.stack([np.asarray(depth, np.float32),
                                                           np.asarray(frame, np.float32)], 1), False)
        self.update()

    def set_count(self, n: int) -> None:
        """Draw the first n vertices."""
        if n != self.count:
            self.count = n
            self._bind()
            self.update()

    def append(self, positions, packed_colors, conf, depth, frame) -> None:
        """Append n vertices (all arrays length n except `frame`, a scalar or [n]: the frame
        sequence numbers whose transforms place them)."""
        n = len(positions)
        if n == 0:
            return
        need = self.count + n
        if need > self.capacity:
            cap = self.capacity
            while cap < need:
                cap *= 2
            for a in self._attrs.values():
                a.grow(cap, self.count)
        seg = np.broadcast_to(np.asarray(frame, np.float32), (n,))
        self._attrs["a_position"].write(self.count, positions)
        self._attrs["a_color"].write(self.count, packed_colors)
        self._attrs["a_conf"].write(self.count, conf)
        self._attrs["a_depth_seg"].write(self.count, np.stack([np.asarray(depth, np.float32), seg], 1))
        self.count = need
        self._bind()
        self.update()

    def clear(self) -> None:
        self.count = 0
        self.update()

    def _bind(self) -> None:
        # A buffer *view* of the first `count` rows: the draw call covers only the used part and
        # re-binding a view uploads nothing.
        for name, a in self._attrs.items():
            self.shared_program[name] = a.vbo[: self.count]

    @property
    def seg_uploads(self) -> int:
        """Uploads of the (shared) transform texture."""
        return self.frame_xf.uploads

    # -- styling (uniforms only) --------------------------------------------------------------
    def set_uniform(self, name: str, value) -> None:
        """Set a uniform; an unchanged value queues no GL command (callers set some per batch)."""
        key = np.asarray(value, np.float64).tobytes()
        if self._uniforms.get(name) == key:
            return
        self._uniforms[name] = key
        self.shared_program[name] = value
        self.update()

    # -- vispy hooks --------------------------------------------------------------------------
    draw_plan = None      # None: draw vertices [0, count); else [(level index views...), (first, count)]
    time_draws = False    # the cloud: time its own draw (glFinish before and after)
    last_draw_ms = None   # that time, of the last draw

    def draw(self):
        if not (self.time_draws and self.visible and self.count > 0):
            return self._draw()
        ctx = get_current_canvas().context
        ctx.finish()                   # what was queued before (uploads, clear) is not the cloud's
        t0 = time.perf_counter()
        self._draw()
        ctx.finish()
        self.last_draw_ms = (time.perf_counter() - t0) * 1000.0

    def _draw(self):
        plan = self.draw_plan
        if plan is None or not self.visible or self._prepare_draw(view=self) is False:
            return super().draw()
        views, (first, n) = plan
        self._configure_gl_state()
        prog = self._program
        prog.build_if_needed()         # what ModularProgram.draw does before drawing
        prog.update_variables()
        glir = get_current_canvas().context.glir
        glir.associate(prog.glir)      # the program's pending uniforms and attribute bindings
        mode = self._vshare.draw_mode
        for ibo, k in views:           # glDrawElements of each level's rows before the live ones
            glir.associate(ibo.glir)
            glir.command("DRAW", prog._id, mode, (ibo.id, "UNSIGNED_INT", k), 1)
        if n:                          # glDrawArrays of the live rows
            glir.command("DRAW", prog._id, mode, (first, n), 1)

    def _prepare_transforms(self, view):
        view.view_program.vert["transform"] = view.get_transform()

    def _prepare_draw(self, view):
        return self.count > 0

    def _compute_bounds(self, axis, view):
        if self.count == 0 or self._attrs["a_position"].host is None:
            return None
        col = self._attrs["a_position"].host[: self.count, axis]
        return float(col.min()), float(col.max())


SegmentCloud = scene.visuals.create_visual_node(SegmentCloudVisual)
