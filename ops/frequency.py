"""The frequency index: the state of ``ngram_propose(scoring="frequency")``.

Made by ``new_ngram_index(..., scoring="frequency")`` and kept up to date by
``ngram_index_build`` / ``ngram_index_extend`` (their ops ``frequency_index_build`` /
``_extend``); read by ``ngram_propose`` (op ``frequency_propose``). Contract:
``docs/design.md``, "Frequency-scored drafting".
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from specdec_kernels.constants import FREQUENCY_MAX_DEPTH
from specdec_kernels.cpu import frequency as _cpu
from specdec_kernels.ops._library import define
from specdec_kernels.ops._memory import full
from specdec_kernels.ops._validation import check_shape, check_state_tensor


class FrequencyIndex(NamedTuple):
    """Per-request frequency index: a context trie per state row (``new_ngram_index(...,
    scoring="frequency")``)."""

    keys: torch.Tensor
    """int64 ``[R, S]``: per row an open-addressing table keyed by ``(parent node, first edge
    token)``, 0 = empty slot; ``S`` a power of two."""
    vals: torch.Tensor
    """int32 ``[R, S]``: the node each key leads to."""
    nodes: torch.Tensor
    """int32 ``[R, 4, M]``: per node its count, deepest context length, the end of its latest
    occurrence and its most frequent continuation (-1: none); node 0 is the root."""
    num_nodes: torch.Tensor
    """int32 ``[R]``: nodes in use per row (the root included)."""
    length: torch.Tensor
    """int32 ``[R]``: how many tokens of each row are counted."""
    min_n: int
    max_n: int
    """Contexts of ``min_n .. max_n`` tokens are candidates; ``max_n`` (``D``) also bounds a
    context plus its drafts."""


def _no_output(token_ids, num_tokens, req_indices, index, *, min_n, max_n):
    return None


for _name in ("frequency_index_build", "frequency_index_extend"):
    define(
        f"{_name}(Tensor token_ids, Tensor num_tokens, Tensor? req_indices, "
        "Tensor(a!)[] index, *, int min_n, int max_n) -> ()",
        cpu=getattr(_cpu, _name),
        cuda=f"specdec_kernels.kernels.frequency:{_name}",
        fake=_no_output,
        cpu_checked=getattr(_cpu, f"{_name}_checked"),
    )


def _propose_fake(
    token_ids, num_tokens, req_indices, max_draft_tokens, index, *, min_n, max_n,
    num_speculative_tokens, max_model_len, min_token_prob, max_spec_factor, max_spec_offset,
):  # fmt: skip
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    k = num_speculative_tokens
    counts = token_ids.new_empty((B,), dtype=torch.int32)
    return (
        token_ids.new_empty((B, k), dtype=torch.int32),
        counts,
        torch.empty_like(counts),
        token_ids.new_empty((B,), dtype=torch.int8),
        token_ids.new_empty((B, k), dtype=torch.float32),
    )


define(
    "frequency_propose(Tensor token_ids, Tensor num_tokens, Tensor? req_indices, "
    "Tensor? max_draft_tokens, Tensor[] index, *, int min_n, int max_n, "
    "int num_speculative_tokens, int? max_model_len, float min_token_prob, "
    "float max_spec_factor, float max_spec_offset) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    cpu=_cpu.frequency_propose,
    cuda="specdec_kernels.kernels.frequency:frequency_propose",
    fake=_propose_fake,
    cpu_checked=_cpu.frequency_propose_checked,
)


def nodes_for(max_model_len: int) -> int:
    """Nodes a row of ``max_model_len`` tokens can need: at most two a position, the root."""
    return 2 * max_model_len + 1


def slots_for(max_model_len: int) -> int:
    """The default hash slots per row: the smallest power of two holding a full row's keys
    (one a node but the root) at most 3/4 full."""
    return 1 << max(4, math.ceil(math.log2(4 * (nodes_for(max_model_len) - 1) / 3 + 1)))


def new_frequency_index(
    num_rows: int, max_model_len: int, *, min_n: int, max_n: int, slots: int | None, device
) -> FrequencyIndex:
    """``new_ngram_index(..., scoring="frequency")`` (checked there)."""
    if max_n > FREQUENCY_MAX_DEPTH:
        raise ValueError(
            f"max_n of a frequency index (its depth D) must be <= {FREQUENCY_MAX_DEPTH}, got "
            f"{max_n}"
        )
    M = nodes_for(max_model_len)
    S = slots_for(max_model_len) if slots is None else slots
    if S & (S - 1) or S < M:
        raise ValueError(
            f"slots of a frequency index must be a power of two >= 2 * max_model_len + 1 "
            f"({M}) so that a full row always leaves an empty slot, got {S}"
        )
    nodes = torch.zeros((num_rows, 4, M), dtype=torch.int32, device=device)
    nodes[:, 3] = -1
    return FrequencyIndex(
        full((num_rows, S), 0, dtype=torch.int64, device=device),
        torch.zeros((num_rows, S), dtype=torch.int32, device=device),
        nodes,
        torch.ones((num_rows,), dtype=torch.int32, device=device),
        torch.zeros((num_rows,), dtype=torch.int32, device=device),
        min_n,
        max_n,
    )


def check_frequency_index(index: FrequencyIndex, token_ids: torch.Tensor) -> FrequencyIndex:
    """A :class:`FrequencyIndex` whose trie fits ``token_ids`` (rows, ``M >= 2 L_max + 1``
    nodes, ``S >= M`` slots, a power of two)."""
    R, L_max = token_ids.shape
    device = token_ids.device
    keys = check_state_tensor("index.keys", index.keys, dtype=torch.int64, ndim=2, device=device)
    vals = check_state_tensor("index.vals", index.vals, dtype=torch.int32, ndim=2, device=device)
    nodes = check_state_tensor("index.nodes", index.nodes, dtype=torch.int32, ndim=3, device=device)
    M = nodes_for(L_max)
    S = keys.shape[1]
    if keys.shape[0] != R or S & (S - 1) or S < max(M, nodes.shape[2]):
        raise ValueError(
            f"index.keys must have shape ({R}, S) with S a power of two >= index.nodes.shape[2] "
            f"(rows of token_ids), got {tuple(keys.shape)}"
        )
    check_shape("index.vals", vals, (R, S), "as index.keys")
    if nodes.shape[0] != R or nodes.shape[1] != 4 or nodes.shape[2] < M:
        raise ValueError(
            f"index.nodes must have shape ({R}, 4, M) with M >= 2 * token_ids.shape[1] + 1 "
            f"({M}) so that a full row never runs out of nodes, got {tuple(nodes.shape)}"
        )
    for name in ("num_nodes", "length"):
        t = check_state_tensor(
            f"index.{name}", getattr(index, name), dtype=torch.int32, ndim=1, device=device
        )
        check_shape(f"index.{name}", t, (R,), "one per row of token_ids")
    if not 1 <= index.max_n <= FREQUENCY_MAX_DEPTH:
        raise ValueError(f"index.max_n must be in [1, {FREQUENCY_MAX_DEPTH}], got {index.max_n}")
    return index


def check_proposal_args(scoring: str, index, corpus, args: dict) -> None:
    """``ngram_propose``'s scoring rules: ``"frequency"`` needs a :class:`FrequencyIndex`
    (and no corpus yet), ``"longest"`` refuses one and the frequency-only arguments."""
    frequency_only = {k: v for k, v in args.items() if v is not None}
    if scoring == "longest":
        if isinstance(index, FrequencyIndex):
            raise ValueError(
                'a FrequencyIndex serves scoring="frequency" only; pass scoring="frequency" '
                "or an NgramIndex"
            )
        if frequency_only:
            raise ValueError(
                f'{", ".join(sorted(frequency_only))} apply to scoring="frequency" only'
            )
        return
    if not isinstance(index, FrequencyIndex):
        raise ValueError(
            'scoring="frequency" needs index=new_ngram_index(..., scoring="frequency"), got '
            f"{'None' if index is None else type(index).__name__}"
        )
    if corpus is not None:
        raise ValueError('scoring="frequency" does not draft from a corpus yet (corpus=None)')
    prob = args["min_token_prob"]
    if prob is not None and not (isinstance(prob, (int, float)) and 0.0 <= prob <= 1.0):
        raise ValueError(f"min_token_prob must be in [0, 1], got {prob!r}")
    for name in ("max_spec_factor", "max_spec_offset"):
        v = args[name]
        if v is not None and not (isinstance(v, (int, float)) and v >= 0.0):
            raise ValueError(f"{name} must be >= 0, got {v!r}")
