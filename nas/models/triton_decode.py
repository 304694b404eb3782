"""``TritonDecoder``: one generated token of a ``TritonModel`` on the library's decode kernels.

Per block: norm → qkv linear (every linear here is ``linear_rows``, split over K for the few rows
of a step; heads already zero-padded to the kernel's head dim by the weights, as in the forward)
→ short-conv step → softmax attention: ``rope_append`` (rotate q and k at the position, write k
and v to the cache) then ``decode_attention``; linear attention: ``linear_attention_step`` (the
state and z in place) → out linear with the residual add → norm → MLP up (activation) → down
(residual); final norm → head; then every sequence's position advances by one.

Every buffer is allocated once, at construction, for ``batch`` sequences of ``capacity`` tokens,
and the positions live on the device, so a step makes no host sync and the whole of it can be
recorded in one CUDA graph (``capture``): a replay is one generated token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels._common import pdl_early
from kernels.device import is_cuda
from kernels.linear_attention.reference import normalizes
from nas.models.decode import DecodeCache, LayerCache
from nas.models.triton_model import PDL_EARLY_MAX_TOKENS, TritonModel, _Block, _channels, _halves

__all__ = ["TritonDecoder"]


@dataclass(frozen=True)
class _Buffers:
    """One block's device state; fields absent from its mixer are None (all of them for an MLP-only block)."""

    conv: torch.Tensor | None  # [B, K-1, 3·H·P] in the model's dtype (the padded heads' channels)
    k: torch.Tensor | None  # [B, H, C, P] keys after RoPE, the model's dtype
    v: torch.Tensor | None  # [B, H, C, P]
    rope: tuple[torch.Tensor, torch.Tensor] | None  # cos, sin [>= C, P/2] fp32
    state: torch.Tensor | None  # [B, H, P, P] fp32
    z: torch.Tensor | None  # [B, H, P] fp32; None for the unnormalized identity map

    def recurrent(self) -> list[torch.Tensor]:
        """The tensors a step rewrites as a whole (KV rows past the position are never read)."""
        return [t for t in (self.conv, self.state, self.z) if t is not None]


def _padded(x: torch.Tensor, P: int, mixer: str) -> torch.Tensor:
    """A torch cache's ``[..., D]`` channels in the kernel's head dim P, as ``_pad_weights`` lays them
    out: attention's rotary halves at [0, D/2) and [P/2, P/2 + D/2), linear attention's at [0, D)."""
    D = x.shape[-1]
    out = x.new_zeros(*x.shape[:-1], P)
    if mixer == "attention":
        lo, hi, lo_p, hi_p = _halves(D, P)
        out[..., lo_p], out[..., hi_p] = x[..., lo], x[..., hi]
    else:
        out[..., :D] = x
    return out


class TritonDecoder:
    """Decodes ``batch`` sequences of up to ``capacity`` tokens with ``tmodel``'s weights.

    Fill the cache with ``load`` (a ``HybridModel.prefill`` cache) or ``fill_random``, then call
    ``step`` (eager) or the function ``capture`` returns (one CUDA graph replay) per token.

    A step is reproducible to rounding, not bit for bit: the linears (``linear_rows``) add their
    split-K partials with fp32 atomics, whose order can change the last bit of a bf16 output.
    """

    def __init__(self, tmodel: TritonModel, batch: int, capacity: int) -> None:
        if tmodel.arch.readout != "token":
            raise ValueError(
                f"TritonDecoder: readout {tmodel.arch.readout!r} gives one output per sequence; "
                "decoding needs readout 'token'"
            )
        if batch < 1 or capacity < 1:
            raise ValueError(f"TritonDecoder: batch and capacity must be >= 1, got {batch} and {capacity}")
        self.tmodel, self.batch, self.capacity = tmodel, batch, capacity
        self.device = tmodel.embed.device
        self.layers = tuple(self._buffers(blk) for blk in tmodel.blocks)
        self.positions = torch.zeros(batch, dtype=torch.int32, device=self.device)  # the next token's index
        self.length = 0  # the host's copy of the positions (all equal), for the capacity check

    def _buffers(self, blk: _Block) -> _Buffers:
        B, C, dt, dev = self.batch, self.capacity, self.tmodel.dtype, self.device
        conv = k = v = rope = state = z = None
        if blk.conv is not None:
            conv = torch.zeros(B, blk.conv[0].shape[1] - 1, blk.conv[0].shape[0], dtype=dt, device=dev)
        H, P = blk.heads, blk.padded_head_dim
        if blk.mixer == "attention":
            k, v = (torch.zeros(B, H, C, P, dtype=dt, device=dev) for _ in range(2))
            rope = self.tmodel._rope_tables(C, self.tmodel.arch.d_model // H, P, dev)
        elif blk.mixer == "linear_attention":
            state = torch.zeros(B, H, P, P, dtype=torch.float32, device=dev)
            if normalizes(blk.feature_map):
                z = torch.zeros(B, H, P, dtype=torch.float32, device=dev)
        return _Buffers(conv, k, v, rope, state, z)

    def seek(self, length: int) -> None:
        """Set every sequence's position to ``length`` tokens (the next step writes and attends
        from there). Only positions move: recurrent states and conv windows keep what they hold,
        which is what a timing loop over a captured step wants and a generation does not."""
        if not 0 <= length <= self.capacity:
            raise ValueError(f"seek: length must be in [0, {self.capacity}], got {length}")
        self.positions.fill_(length)
        self.length = length

    def nbytes(self) -> int:
        """Bytes of the cache buffers (KV at full capacity, states, conv windows, positions)."""
        tensors = [self.positions]
        for buf in self.layers:
            tensors += [t for t in (buf.k, buf.v, *buf.recurrent()) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    @torch.no_grad()
    def load(self, cache: DecodeCache) -> None:
        """Copy a ``HybridModel.prefill`` cache in: cast to the buffers' dtypes, heads padded to the
        kernels' head dim (padded key channels have φ = 0, so padded state rows and z stay zero)."""
        if len(cache.layers) != len(self.layers):
            raise ValueError(f"load: the cache has {len(cache.layers)} layers, the model {len(self.layers)}")
        if cache.length > self.capacity:
            raise ValueError(f"load: the cache holds {cache.length} tokens, more than capacity {self.capacity}")
        L = cache.length
        for i, (blk, buf, layer) in enumerate(zip(self.tmodel.blocks, self.layers, cache.layers, strict=True)):
            self._check_layer(i, blk, layer)
            P = blk.padded_head_dim
            if buf.conv is not None:  # the window's qkv channels, moved to the padded heads' (zeros between)
                H = blk.heads
                rows = torch.cat(
                    [s * H * P + _channels(H, layer.conv.shape[-1] // (3 * H), P, blk.mixer) for s in range(3)]
                )
                buf.conv.zero_()
                buf.conv[..., rows.to(buf.conv.device)] = layer.conv.to(buf.conv.dtype)
            if buf.k is not None:
                buf.k.zero_()
                buf.v.zero_()
                buf.k[:, :, :L] = _padded(layer.k[:, :, :L], P, blk.mixer)
                buf.v[:, :, :L] = _padded(layer.v[:, :, :L], P, blk.mixer)
            if buf.state is not None:
                D = layer.state.shape[-1]
                buf.state.zero_()
                buf.state[:, :, :D, :D] = layer.state
            if buf.z is not None:
                buf.z.copy_(_padded(layer.z, P, blk.mixer))
        self.seek(L)

    def _check_layer(self, i: int, blk: _Block, layer: LayerCache) -> None:
        fields = {"conv": blk.conv is not None, "k": blk.mixer == "attention", "v": blk.mixer == "attention"}
        fields |= {"state": blk.mixer == "linear_attention"}
        fields["z"] = blk.mixer == "linear_attention" and normalizes(blk.feature_map)
        for name, wanted in fields.items():
            t = getattr(layer, name)
            if (t is not None) != wanted:
                state = "missing" if wanted else "unexpected"
                raise ValueError(f"load: layer {i} ({blk.mixer}): cache field {name!r} is {state}")
            if t is not None and t.shape[0] != self.batch:
                raise ValueError(
                    f"load: layer {i}: cache field {name!r} has batch {t.shape[0]}, the decoder {self.batch}"
                )

    @torch.no_grad()
    def fill_random(self, length: int, generator: torch.Generator | None = None) -> None:
        """Random cache contents as if ``length`` tokens had been consumed (for timing a step at a
        long context without a prefill): KV rows [0, length) and the conv windows N(0, 1), linear
        states N(0, 1) and normalizers length + U(0, 1) (positive, as sums of φ ≥ 0), padded
        channels zero. ``generator``'s device draws the numbers (default: the decoder's)."""
        if not 0 <= length <= self.capacity:
            raise ValueError(f"fill_random: length must be in [0, capacity {self.capacity}], got {length}")
        dev = generator.device if generator is not None else self.device

        def draw(shape: tuple[int, ...], uniform: bool = False) -> torch.Tensor:
            fn = torch.rand if uniform else torch.randn
            return fn(shape, generator=generator, device=dev).to(self.device)

        d = self.tmodel.arch.d_model
        for blk, buf in zip(self.tmodel.blocks, self.layers, strict=True):
            if buf.conv is not None:  # the padded heads' channels too: their conv weights are zero
                buf.conv.copy_(draw(tuple(buf.conv.shape)))
            if blk.heads == 0:
                continue
            B, H, D, P = self.batch, blk.heads, d // blk.heads, blk.padded_head_dim
            if buf.k is not None:
                buf.k.zero_()
                buf.v.zero_()
                buf.k[:, :, :length] = _padded(draw((B, H, length, D)), P, blk.mixer)
                buf.v[:, :, :length] = _padded(draw((B, H, length, D)), P, blk.mixer)
            if buf.state is not None:
                buf.state.zero_()
                buf.state[:, :, :D, :D] = draw((B, H, D, D))
            if buf.z is not None:
                buf.z.copy_(_padded(length + draw((B, H, D), uniform=True), P, blk.mixer))
        self.seek(length)

    def _check_room(self) -> None:
        if self.length >= self.capacity:
            raise ValueError(f"step: the cache is full (capacity {self.capacity} tokens)")

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens ``[B]`` int64, the next token of each sequence → logits ``[B, n_out]`` in the
        model's dtype; the caches and positions advance in place."""
        if tuple(tokens.shape) != (self.batch,):
            raise ValueError(f"step: tokens must be [B] = [{self.batch}], got {list(tokens.shape)}")
        self._check_room()
        logits = self._step(tokens)
        self.length += 1
        return logits

    def _step(self, tokens: torch.Tensor) -> torch.Tensor:
        """The device work of one step: kernels and views only, no host sync (capturable)."""
        with pdl_early(self.batch <= PDL_EARLY_MAX_TOKENS):
            return self._step_kernels(tokens)

    def _step_kernels(self, tokens: torch.Tensor) -> torch.Tensor:
        from kernels.attention.decode import decode_attention, rope_append
        from kernels.conv.decode import causal_conv_step
        from kernels.linear.decode import linear_rows
        from kernels.linear_attention.triton import linear_attention_step

        tm, B, d = self.tmodel, self.batch, self.tmodel.arch.d_model
        h = F.embedding(tokens, tm.embed)  # residual stream [B, d]
        for blk, buf in zip(tm.blocks, self.layers, strict=True):
            if blk.qkv is not None:
                qkv = linear_rows(blk.norm1(h), *blk.qkv)  # [B, 3·H·P]
                if blk.conv is not None:
                    qkv = causal_conv_step(qkv, buf.conv, *blk.conv)
                H, D, P = blk.heads, d // blk.heads, blk.padded_head_dim
                if blk.mixer == "attention":
                    q = rope_append(qkv, H, buf.k, buf.v, self.positions, buf.rope)  # [B, H, P]
                    o = decode_attention(q, buf.k, buf.v, self.positions, scale=D**-0.5)  # [B, H·P]
                else:
                    q, k, v = qkv.view(B, 3, H, P).unbind(1)  # each [B, H, P], views of the row
                    o = linear_attention_step(q, k, v, buf.state, buf.z, feature_map=blk.feature_map)
                h = linear_rows(o.reshape(B, H * P), *blk.out, residual=h)  # the out weights read the padded heads
            if blk.up is not None:
                u = linear_rows(blk.norm2(h), *blk.up, activation=blk.activation)
                h = linear_rows(u, *blk.down, residual=h)
        logits = tm.logits(linear_rows(tm.final_norm(h), *tm.head))  # [B, n_out], a view
        self.positions += 1
        return logits

    __call__ = step

    def capture(self, tokens: torch.Tensor) -> Callable[[], torch.Tensor]:
        """Record one whole step on the static buffer ``tokens`` (CUDA, ``[B]`` int64) into one CUDA
        graph; returns a function that replays it (one generated token) and gives the static
        logits ``[B, n_out]``. Refill ``tokens`` in place between replays. A warm-up step outside
        the graph compiles and autotunes the kernels (and makes the linear-attention step's
        tickets); the cache is restored after it, so capturing consumes no token."""
        if not is_cuda(tokens.device):
            raise ValueError("capture needs tokens on a CUDA device")
        if tuple(tokens.shape) != (self.batch,):
            raise ValueError(f"capture: tokens must be [B] = [{self.batch}], got {list(tokens.shape)}")
        self._check_room()
        saved = [t.clone() for buf in self.layers for t in buf.recurrent()]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            self._step(tokens)
        torch.cuda.current_stream().wait_stream(stream)
        with torch.no_grad():  # the warm-up's KV row is overwritten by the next step: only these need restoring
            for t, s in zip((t for buf in self.layers for t in buf.recurrent()), saved, strict=True):
                t.copy_(s)
            self.positions -= 1
        del saved
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
            out = self._step(tokens)

        def replay() -> torch.Tensor:
            self._check_room()
            graph.replay()
            self.length += 1
            return out

        return replay
