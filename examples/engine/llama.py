"""A Llama forward pass in plain torch over a paged KV cache.

RMSNorm, rotary position embeddings (the model's theta; default, linear and llama3
scaling), grouped-query attention that reads K/V through the block table, SwiGLU MLP,
tied or separate LM head. One call processes a flat, ragged batch of query tokens
(``query_start_loc``), so the same code runs prefill (many tokens per request, no logits)
and the verify pass of speculative decoding (``k + 1`` tokens per request, logits for
all of them). Shapes depend only on the inputs' shapes and two host ints
(``max_query_len``, ``max_seq_len``); no value is read back to the host.

Numerics follow transformers' ``LlamaForCausalLM``: RMSNorm and the RoPE angles are
computed in fp32 (at least), everything else in the weights' dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from examples.engine.kv_cache import PagedKVCache


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    tie_word_embeddings: bool
    max_position_embeddings: int

    @classmethod
    def from_dict(cls, d: dict) -> LlamaConfig:
        """From a transformers ``config.json`` (v4 ``rope_theta``/``rope_scaling`` or v5
        ``rope_parameters``)."""
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", d.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        heads = d["num_attention_heads"]
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads", heads),
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=None if rope_type == "default" else rope,
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
        )


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """fp32 ``[head_dim / 2]`` inverse frequencies, with the config's scaling applied."""
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = cfg.rope_scaling
    if s is None:
        return inv
    kind = s.get("rope_type", s.get("type"))
    if kind == "linear":
        return inv / float(s["factor"])
    if kind == "llama3":
        factor = float(s["factor"])
        low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
        old = float(s["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(is_mid, mid, scaled)
    raise ValueError(f"rope scaling {kind!r} is not supported (default, linear, llama3)")


class Linear:
    """``y = x @ W.T`` for a weight ``W [out, in]``, by the fastest path the device has.

    On the CPU in fp32 the weight is pre-packed once for oneDNN (PyTorch's own
    ``mkldnn`` linear, the one Inductor's freezing uses): a call then costs about a read
    of the weight for any number of rows, where a BLAS ``mm`` repacks the weight on every
    call and a 5-row verify pass cost ~3x a 1-row pass (measured: 576x3072 at 5 rows
    0.56 ms vs 0.18 ms packed; the 49152-wide LM head 29.7 ms vs 10.0 ms, one thread).
    Its rows are also computed independently of one another: row ``i`` of a 5-row call
    equals the 1-row call on that row bit for bit, which BLAS does not promise. Elsewhere
    (other dtypes, devices, or a torch without oneDNN) the weight is stored transposed,
    ``[in, out]`` contiguous, and ``x @ Wt`` runs.
    """

    def __init__(self, weight: torch.Tensor):
        self.out_features = weight.shape[0]
        self.packed = None
        self.weight_t = None
        if _onednn_ok(weight):
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(weight, 8)
                probe = torch.zeros((1, weight.shape[1]), dtype=weight.dtype)
                torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
                self.packed = packed
            except (RuntimeError, AttributeError):  # an unusual build: use the fallback
                self.packed = None
        if self.packed is None:
            self.weight_t = weight.T.contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        return x @ self.weight_t


def _onednn_ok(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x**2) + eps)``, in fp32 at least (as transformers does)."""
    if x.dtype in (torch.float16, torch.bfloat16):
        h = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=eps)
        return weight * h.to(x.dtype)
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, half-split convention (``x * cos + rotate_half(x) * sin``)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@dataclass
class AttentionLayout:
    """Index tensors shared by all layers of one forward call (built once per call).

    The flat tokens are gathered into a padded ``[B, max_query_len]`` grid so that each
    request's queries attend to its own gathered K/V ``[B, max_seq_len]`` with one batched
    matmul, then scattered back.
    """

    grid_index: torch.Tensor  # int64 [B, Mq]: flat token of grid cell (b, j), clamped
    token_cell: torch.Tensor  # int64 [T]: grid cell b * Mq + j of flat token t
    bias: torch.Tensor  # [B*KV, G*Mq, S]: 0 where key s is visible to query (b, j), else -inf
    block_tables: torch.Tensor  # int64 [B, S / block_size], unallocated -> pad block
    max_seq_len: int


def build_layout(
    positions: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_tables: torch.Tensor,
    *,
    max_query_len: int,
    max_seq_len: int,
    block_size: int,
    pad_block: int,
    num_kv_heads: int,
    group: int,
    dtype: torch.dtype,
) -> AttentionLayout:
    T = positions.shape[0]
    B = query_start_loc.shape[0] - 1
    Mq = max_query_len
    dev = positions.device
    qsl = query_start_loc.long()
    j = torch.arange(Mq, device=dev)
    grid_index = (qsl[:-1, None] + j).clamp_(max=max(T - 1, 0))
    grid_valid = j < (qsl[1:] - qsl[:-1])[:, None]
    t = torch.arange(T, device=dev)
    # request of flat token t; tokens past qsl[B] (padding) land on the last row
    b_of_t = torch.searchsorted(qsl[1:], t, right=True).clamp_(max=B - 1)
    j_of_t = (t - qsl[b_of_t]).clamp_(0, Mq - 1)
    token_cell = b_of_t * Mq + j_of_t
    nb = -(-max_seq_len // block_size)
    S = nb * block_size
    q_pos = torch.where(grid_valid, positions[grid_index], 0)
    s = torch.arange(S, device=dev)
    visible = s <= q_pos[:, :, None]  # causal within the request: keys 0 .. position
    bias = torch.zeros(visible.shape, dtype=dtype, device=dev).masked_fill_(~visible, -math.inf)
    bias = bias[:, None, None].expand(B, num_kv_heads, group, Mq, S)
    bias = bias.reshape(B * num_kv_heads, group * Mq, S)
    bt = block_tables[:, :nb].long()
    if bt.shape[1] < nb:  # the table is narrower than the bound: pad with the pad block
        bt = torch.cat([bt, bt.new_full((B, nb - bt.shape[1]), pad_block)], dim=1)
    bt = torch.where(bt < 0, pad_block, bt)
    return AttentionLayout(grid_index, token_cell, bias, bt, S)


class Llama:
    """Weights plus the forward pass. ``state_dict`` uses transformers' parameter names."""

    def __init__(
        self,
        cfg: LlamaConfig,
        state_dict: dict[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        self.cfg = cfg
        self.dtype = dtype
        self.device = torch.device(device)

        def w(name: str) -> torch.Tensor:
            return state_dict[name].to(device=self.device, dtype=dtype).contiguous()

        def lin(*names: str) -> Linear:
            # fused projections (q, k, v and gate, up): one call instead of two or three
            return Linear(torch.cat([w(n) for n in names]))

        self.embed = w("model.embed_tokens.weight")
        self.final_norm = w("model.norm.weight")
        tied = cfg.tie_word_embeddings or "lm_head.weight" not in state_dict
        self.lm_head = lin("model.embed_tokens.weight" if tied else "lm_head.weight")
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}.self_attn."
            m = f"model.layers.{i}.mlp."
            self.layers.append(
                dict(
                    attn_norm=w(f"model.layers.{i}.input_layernorm.weight"),
                    wqkv=lin(p + "q_proj.weight", p + "k_proj.weight", p + "v_proj.weight"),
                    wo=lin(p + "o_proj.weight"),
                    mlp_norm=w(f"model.layers.{i}.post_attention_layernorm.weight"),
                    w_gate_up=lin(m + "gate_proj.weight", m + "up_proj.weight"),
                    w_down=lin(m + "down_proj.weight"),
                )
            )
        # Angles in fp32 as transformers computes them, then cast to the weights' dtype.
        inv = rope_inv_freq(cfg)
        pos = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        ang = torch.outer(pos, inv)
        ang = torch.cat([ang, ang], dim=-1)
        self.cos = ang.cos().to(device=self.device, dtype=dtype)
        self.sin = ang.sin().to(device=self.device, dtype=dtype)

    def new_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        c = self.cfg
        return PagedKVCache(
            num_layers=c.num_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            dtype=self.dtype,
            device=self.device,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        query_start_loc: torch.Tensor,
        block_tables: torch.Tensor,
        cache: PagedKVCache,
        *,
        max_query_len: int,
        max_seq_len: int,
        compute_logits: bool = True,
    ) -> torch.Tensor | None:
        """Run the model on a flat ragged batch of query tokens.

        Parameters
        ----------
        input_ids : int32/int64 ``[T]``; positions : int64 ``[T]``
            Query tokens and their positions (padding tokens: any id, position 0).
        slot_mapping : int64 ``[T]``
            KV slot each token's K/V is written to; ``-1`` (padding) writes nowhere.
        query_start_loc : int32 ``[B+1]``
            Request ``b`` owns tokens ``qsl[b] .. qsl[b+1]``; tokens past ``qsl[B]`` are padding.
        block_tables : int32 ``[B, max_blocks]``
            The block table rows of the batch (already gathered by ``req_indices``).
        cache : PagedKVCache
        max_query_len, max_seq_len : int
            Host-side bounds: tokens per request, and ``max(positions) + 1`` over the batch.
        compute_logits : bool
            ``False`` for prefill (only fills the cache).

        Returns
        -------
        torch.Tensor or None
            fp32 ``[T, V]`` logits, one row per query token.
        """
        c = self.cfg
        H, KV, hd = c.num_heads, c.num_kv_heads, c.head_dim
        G = H // KV
        T = input_ids.shape[0]
        B = query_start_loc.shape[0] - 1
        Mq = max_query_len
        lay = build_layout(
            positions,
            query_start_loc,
            block_tables,
            max_query_len=Mq,
            max_seq_len=max_seq_len,
            block_size=cache.block_size,
            pad_block=cache.pad_block,
            num_kv_heads=KV,
            group=G,
            dtype=self.dtype,
        )
        S = lay.max_seq_len
        slots = torch.where(slot_mapping < 0, cache.pad_slot, slot_mapping)
        cos = self.cos[positions][:, None, :]
        sin = self.sin[positions][:, None, :]
        scale = 1.0 / math.sqrt(hd)
        x = self.embed[input_ids.long()]
        half = self.dtype in (torch.float16, torch.bfloat16)
        for i, L in enumerate(self.layers):
            h = rms_norm(x, L["attn_norm"], c.rms_norm_eps)
            qkv = L["wqkv"](h)
            qk = rotate(qkv[:, : (H + KV) * hd].view(T, H + KV, hd), cos, sin)
            k = qk[:, H:]
            v = qkv[:, (H + KV) * hd :].view(T, KV, hd)
            kc, vc = cache.k[i], cache.v[i]
            kc.view(-1, KV, hd).index_copy_(0, slots, k)
            vc.view(-1, KV, hd).index_copy_(0, slots, v)
            # K/V of each request through its block table: [B*KV, hd, S] and [B*KV, S, hd]
            kt = kc[lay.block_tables].view(B, S, KV, hd).permute(0, 2, 3, 1)
            kt = kt.reshape(B * KV, hd, S)
            vr = vc[lay.block_tables].view(B, S, KV, hd).transpose(1, 2).reshape(B * KV, S, hd)
            # queries on the [B, Mq] grid, grouped by KV head: [B*KV, G*Mq, hd]
            qg = qk[lay.grid_index, :H].view(B, Mq, KV, G, hd).permute(0, 2, 3, 1, 4)
            qg = qg.reshape(B * KV, G * Mq, hd)
            scores = torch.baddbmm(lay.bias, qg, kt, alpha=scale)
            if half:
                probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)
            else:
                probs = torch.softmax(scores, dim=-1)
            og = torch.bmm(probs, vr).view(B, KV, G, Mq, hd).permute(0, 3, 1, 2, 4)
            o = og.reshape(B * Mq, H * hd)[lay.token_cell]
            x = x + L["wo"](o)
            h = rms_norm(x, L["mlp_norm"], c.rms_norm_eps)
            gu = L["w_gate_up"](h)
            act = torch.nn.functional.silu(gu[:, : c.intermediate_size])
            x = x + L["w_down"](act * gu[:, c.intermediate_size :])
        if not compute_logits:
            return None
        x = rms_norm(x, self.final_norm, c.rms_norm_eps)
        return self.lm_head(x).float()

    @torch.inference_mode()
    def score(self, token_ids: list[int] | torch.Tensor, block_size: int = 16) -> torch.Tensor:
        """fp32 logits ``[L, V]`` of one sequence (teacher forcing) through the paged path."""
        ids = torch.as_tensor(token_ids, dtype=torch.int64, device=self.device)
        n = ids.shape[0]
        nb = PagedKVCache.blocks_needed(n, block_size)
        cache = self.new_kv_cache(nb, block_size)
        pos = torch.arange(n, device=self.device)
        return self.forward(
            ids,
            pos,
            pos.clone(),  # blocks 0..nb-1 in order: slot == position
            torch.tensor([0, n], dtype=torch.int32, device=self.device),
            torch.arange(nb, dtype=torch.int32, device=self.device)[None],
            cache,
            max_query_len=n,
            max_seq_len=n,
        )
