"""The frequency index: the state of ``ngram_propose(scoring="frequency")``.

Made by ``new_ngram_index(..., scoring="frequency")`` and kept up to date by
``ngram_index_build`` / ``ngram_index_extend`` (their ops ``frequency_index_build`` /
``_extend``); read by ``ngram_propose`` (op ``frequency_propose``). Contract:
``docs/design.md``, "Frequency-scored drafting".
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch

from specdec_kernels.constants import (
    FREQUENCY_CORPUS_STATE,
    FREQUENCY_MAX_DEPTH,
    frequency_corpus_budget,
)
from specdec_kernels.cpu import frequency as _cpu
from specdec_kernels.cpu import frequency_corpus as _cpu_corpus
from specdec_kernels.ops._library import define, define_index_updates
from specdec_kernels.ops._memory import full
from specdec_kernels.ops._validation import check_n_range, check_shape, check_state_tensor


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


define_index_updates("frequency", _cpu, ("frequency_index_build", "frequency_index_extend"))


class FrequencyCorpus(NamedTuple):
    """Shared corpus for frequency scoring: two stores of a token array and a context trie,
    one active (``new_corpus(..., scoring="frequency")``)."""

    tokens: torch.Tensor
    """int32 ``[2, C + C // 8]``: each store's documents, back to back; ``C``, the budget in
    slots, is read from here."""
    keys: torch.Tensor
    """int64 ``[2, S]``: each store's trie table (as :class:`FrequencyIndex`'s rows)."""
    vals: torch.Tensor
    """int32 ``[2, S]``."""
    nodes: torch.Tensor
    """int32 ``[2, 4, M]``: each store's nodes, ``M`` its node budget (``2 C + 1``: never short)."""
    num_nodes: torch.Tensor
    """int32 ``[2]``."""
    docs: torch.Tensor
    """int64 ``[C // 2 + 2, 3]``: a ring of documents: length, start in store 0 and 1."""
    state: torch.Tensor
    """int64 ``[11]``: the fields of ``FREQUENCY_CORPUS_STATE``."""
    min_n: int
    max_n: int


def no_append_output(doc_tokens, doc_lens, req_indices, corpus, *, min_n, max_n):
    """The fake of both corpus appends (the n-gram corpus's and this one's): no outputs."""
    return None


define(
    "frequency_corpus_append(Tensor doc_tokens, Tensor doc_lens, Tensor? req_indices, "
    "Tensor(a!)[] corpus, *, int min_n, int max_n) -> ()",
    cpu=_cpu_corpus.frequency_corpus_append,
    cuda="specdec_kernels.kernels.frequency_corpus:frequency_corpus_append",
    fake=no_append_output,
)


def _propose_fake(
    token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, *, min_n, max_n,
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
    "Tensor? max_draft_tokens, Tensor[] index, Tensor[]? corpus, *, int min_n, int max_n, "
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
    """The default hash slots per row: :func:`table_for` a full row's nodes."""
    return table_for(nodes_for(max_model_len))


def table_for(nodes: int) -> int:
    """The smallest power of two holding the keys of ``nodes`` nodes (one a node but the
    root) at most 3/4 full."""
    return 1 << max(4, math.ceil(math.log2(4 * (nodes - 1) / 3)))


def _new_nodes(tries: int, M: int, device) -> torch.Tensor:
    """int32 ``[tries, 4, M]``: empty node arrays (no best continuation anywhere)."""
    nodes = torch.zeros((tries, 4, M), dtype=torch.int32, device=device)
    nodes[:, 3] = -1
    return nodes


def check_depth(min_n: int, max_n: int) -> None:
    """The context range of frequency scoring: ``max_n`` (D) bounds a context plus its
    drafts, so a context of ``m >= max_n`` tokens never drafts: ``min_n < max_n <= 1024``."""
    if max_n > FREQUENCY_MAX_DEPTH:
        raise ValueError(
            f"max_n of frequency scoring (the depth D) must be <= {FREQUENCY_MAX_DEPTH}, got "
            f"{max_n}"
        )
    if min_n >= max_n:
        raise ValueError(
            f"frequency scoring drafts max_n - m tokens after a context of m >= min_n tokens, "
            f"so min_n < max_n is needed (max_n is the depth D, e.g. 64), got min_n={min_n}, "
            f"max_n={max_n}"
        )


def check_frequency_params(min_token_prob, max_spec_factor, max_spec_offset):
    """The chain's stop rules as floats: ``min_token_prob`` in ``[0, 1]``, the others
    ``>= 0`` (``inf`` allowed); None: SuffixDecoding's defaults 0.1, 1.0, 0.0."""
    out = []
    for name, v, default in (("min_token_prob", min_token_prob, 0.1),
                             ("max_spec_factor", max_spec_factor, 1.0),
                             ("max_spec_offset", max_spec_offset, 0.0)):  # fmt: skip
        if v is None:
            out.append(default)
            continue
        ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and float(v) >= 0.0
        if not ok or (name == "min_token_prob" and float(v) > 1.0):
            what = "in [0, 1]" if name == "min_token_prob" else ">= 0"
            raise ValueError(f"{name} must be a real number {what}, got {v!r}")
        out.append(float(v))
    return tuple(out)


def new_frequency_index(
    num_rows: int, max_model_len: int, *, min_n: int, max_n: int, slots: int | None, device
) -> FrequencyIndex:
    """``new_ngram_index(..., scoring="frequency")`` (checked there)."""
    check_depth(min_n, max_n)
    M = nodes_for(max_model_len)
    S = slots_for(max_model_len) if slots is None else slots
    _check_table(S, M, "slots of a frequency index", "2 * max_model_len + 1")
    nodes = _new_nodes(num_rows, M, device)
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
            f"index.keys must have shape ({R}, S) with S a power of two >= 2 * "
            f"token_ids.shape[1] + 1 ({M}) and >= index.nodes.shape[2] ({nodes.shape[2]}): "
            f"made for shorter rows? got {tuple(keys.shape)}"
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
    check_n_range(index.min_n, index.max_n)
    check_depth(index.min_n, index.max_n)
    return index


def new_frequency_corpus(capacity: int, *, min_n: int, max_n: int, nodes: int | None,
                         slots: int | None, device) -> FrequencyCorpus:  # fmt: skip
    """``new_corpus(..., scoring="frequency")`` (checked there)."""
    if capacity < 8 * (min_n + 2):
        raise ValueError(
            f"capacity of a frequency corpus must be >= 8 (min_n + 2) = {8 * (min_n + 2)} slots "
            f"(a piece of at most C // 8 - 1 tokens holds a context of min_n and a continuation), "
            f"got {capacity}"
        )
    check_depth(min_n, max_n)
    C = capacity
    M = 2 * C + 1 if nodes is None else nodes
    _check_node_budget(M, C, min_n, "nodes")
    S = table_for(M) if slots is None else slots
    _check_table(S, M, "index_slots", "the node budget")
    docs = torch.full((C // 2 + 2, 3), -1, dtype=torch.int64, device=device)
    docs[:, 0] = 0
    return FrequencyCorpus(
        torch.zeros((2, C + C // 8), dtype=torch.int32, device=device),
        full((2, S), 0, dtype=torch.int64, device=device),
        torch.zeros((2, S), dtype=torch.int32, device=device),
        _new_nodes(2, M, device),
        torch.ones((2,), dtype=torch.int32, device=device),
        docs,
        torch.zeros((len(FREQUENCY_CORPUS_STATE),), dtype=torch.int64, device=device),
        min_n,
        max_n,
    )


def _check_node_budget(M: int, C: int, min_n: int, what: str) -> None:
    lo = 16 * (min_n + 2)
    if not lo <= M <= 2 * C + 1:
        raise ValueError(
            f"{what} (the node budget of each store) must be in [16 (min_n + 2), 2 C + 1] = "
            f"[{lo}, {2 * C + 1}] (an empty store holds a piece; 2 C + 1 is never short), "
            f"got {M}"
        )


def _check_table(S: int, M: int, what: str, bound: str) -> None:
    if S & (S - 1) or S < M:
        raise ValueError(
            f"{what} must be a power of two >= {bound} ({M}) so that a full trie always "
            f"leaves an empty slot, got {S}"
        )


def check_frequency_corpus(corpus: FrequencyCorpus, device: torch.device) -> FrequencyCorpus:
    """A :class:`FrequencyCorpus` whose shapes agree with its budget ``C`` (from ``tokens``)
    and its node budget ``M`` (from ``nodes``)."""
    tokens = check_state_tensor("corpus.tokens", corpus.tokens, dtype=torch.int32, ndim=2,
                                device=device)  # fmt: skip
    C = frequency_corpus_budget(tokens.shape[1])
    if tokens.shape[0] != 2 or C < 16 or tokens.shape[1] != C + C // 8:
        raise ValueError(
            f"corpus.tokens must have shape (2, C + C // 8) with C >= 16, got {tuple(tokens.shape)}"
        )
    check_n_range(corpus.min_n, corpus.max_n)
    check_depth(corpus.min_n, corpus.max_n)
    if C < 8 * (corpus.min_n + 2):
        raise ValueError(
            f"corpus.tokens holds a budget of C = {C} slots, below 8 (min_n + 2) = "
            f"{8 * (corpus.min_n + 2)} for min_n = {corpus.min_n}"
        )
    nodes = check_state_tensor(
        "corpus.nodes", corpus.nodes, dtype=torch.int32, ndim=3, device=device
    )
    if nodes.shape[0] != 2 or nodes.shape[1] != 4:
        raise ValueError(f"corpus.nodes must have shape (2, 4, M), got {tuple(nodes.shape)}")
    M = nodes.shape[2]
    _check_node_budget(M, C, corpus.min_n, "corpus.nodes.shape[2]")
    keys = check_state_tensor("corpus.keys", corpus.keys, dtype=torch.int64, ndim=2,
                              device=device)  # fmt: skip
    shapes = {"keys": ((2, -1), torch.int64), "vals": ((2, -1), torch.int32),
              "num_nodes": ((2,), torch.int32), "docs": ((C // 2 + 2, 3), torch.int64),
              "state": ((len(FREQUENCY_CORPUS_STATE),), torch.int64)}  # fmt: skip
    for name, (shape, dtype) in shapes.items():
        t = check_state_tensor(f"corpus.{name}", getattr(corpus, name), dtype=dtype,
                               ndim=len(shape), device=device)  # fmt: skip
        want = tuple(keys.shape[1] if n < 0 else n for n in shape)
        check_shape(f"corpus.{name}", t, want, f"a corpus of C = {C} slots")
    _check_table(keys.shape[1], M, "corpus.keys.shape[1]", "the node budget")
    return corpus


def check_proposal_args(scoring: str, index, corpus, args: dict) -> tuple | None:
    """``ngram_propose``'s scoring rules: ``"frequency"`` needs a :class:`FrequencyIndex`
    (and a :class:`FrequencyCorpus` if any), ``"longest"`` refuses them and the
    frequency-only arguments. Returns :func:`check_frequency_params`' floats (None for
    ``"longest"``)."""
    frequency_only = {k: v for k, v in args.items() if v is not None}
    if scoring == "longest":
        if isinstance(index, FrequencyIndex) or isinstance(corpus, FrequencyCorpus):
            raise ValueError(
                'a FrequencyIndex or FrequencyCorpus serves scoring="frequency" only; pass '
                'scoring="frequency", or an NgramIndex and a Corpus'
            )
        if frequency_only:
            raise ValueError(
                f'{", ".join(sorted(frequency_only))} apply to scoring="frequency" only'
            )
        return None
    if not isinstance(index, FrequencyIndex):
        raise ValueError(
            'scoring="frequency" needs index=new_ngram_index(..., scoring="frequency"), got '
            f"{'None' if index is None else type(index).__name__}"
        )
    if corpus is not None and not isinstance(corpus, FrequencyCorpus):
        raise ValueError(
            'scoring="frequency" drafts from a FrequencyCorpus (new_corpus(..., '
            f'scoring="frequency")), got {type(corpus).__name__}'
        )
    return check_frequency_params(**args)
