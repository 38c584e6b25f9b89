"""The ``ngram_index`` family: an exact own-history n-gram index and a shared corpus.

``ngram_propose`` rescans every history each step (O(L) per request). These ops keep the
lookup structures on the device instead, updated with the tokens each step commits, so a
step costs O(new tokens x n range) per request whatever the history length; and they add
a shared corpus of finished requests (and any text the caller adds) that every request can
draft from, as SuffixDecoding / vLLM's ``suffix`` method and SGLang's shared n-gram trie
do on the host. Contracts: ``docs/design-ngram-index.md``.

A step::

    commit_accepted_tokens(token_ids, num_tokens, ...)          # as before
    ngram_index_extend(token_ids, num_tokens, index, req_indices)  # the new n-grams
    ngram_index_propose(token_ids, num_tokens, index, req_indices,
                        num_speculative_tokens=k, corpus=corpus)
    corpus_append(corpus, token_ids, num_tokens, where(finished, req_indices, -1))
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec_kernels.cpu import ngram_index as _cpu
from specdec_kernels.ops._library import define
from specdec_kernels.ops._memory import full
from specdec_kernels.ops._validation import (
    batch_state_rows,
    check_int,
    check_optional_tensor,
    check_req_indices,
    check_req_indices_values,
    check_shape,
    check_tensor,
    check_value_range,
    should_check_values,
)

TIE_BREAKS = ("first", "last")


class NgramIndex(NamedTuple):
    """Per-request own-history n-gram index (made by :func:`new_ngram_index`)."""

    table: torch.Tensor
    """int32 ``[R, N, S, 2]``: per state row and ``n = min_n + j`` a linear-probing table of
    ``(first, last)`` starts, -1 = empty slot. Contiguous."""
    length: torch.Tensor
    """int32 ``[R]``: how many tokens of each row are indexed."""
    min_n: int
    max_n: int


class Corpus(NamedTuple):
    """Shared corpus: a ring of documents and its n-gram table (made by :func:`new_corpus`)."""

    tokens: torch.Tensor
    """int32 ``[C]``: token at absolute position ``p`` lives in slot ``p % C``."""
    meta: torch.Tensor
    """int64 ``[C, 2]``: absolute ``(start, end)`` of the document holding each slot."""
    index: torch.Tensor
    """int64 ``[N, H]``: per n, the largest start hashed to each slot (-1 = none)."""
    state: torch.Tensor
    """int64 ``[2]``: ``(end, lo)``, the live window ``[lo, end)`` in absolute positions."""
    min_n: int
    max_n: int


class IndexProposal(NamedTuple):
    """Draft tokens proposed by :func:`ngram_index_propose`."""

    draft_token_ids: torch.Tensor
    """int32 ``[B, k]``: the drafts of batch row ``b`` in ``[b, :num_draft_tokens[b]]``, then -1."""
    num_draft_tokens: torch.Tensor
    """int32 ``[B]``: how many drafts row ``b`` got, in ``[0, k]``."""
    match_len: torch.Tensor
    """int32 ``[B]``: the ``n`` of the n-gram whose continuation became the drafts, in
    ``[min_n, max_n]``; 0 for a row that got no draft (as ``ngram_propose``'s)."""
    draft_source: torch.Tensor
    """int8 ``[B]``: 0 no drafts, 1 own history, 2 shared corpus."""


# ----------------------------------------------------------------------------- registration


def _no_output(*args, **kwargs):
    return None


define(
    "ngram_index_build(Tensor token_ids, Tensor num_tokens, Tensor? req_indices, "
    "Tensor(a!) index, Tensor(b!) index_len, *, int min_n, int max_n) -> ()",
    cpu=_cpu.ngram_index_build,
    cuda="specdec_kernels.kernels.ngram_index:ngram_index_build",
    fake=_no_output,
)
define(
    "ngram_index_extend(Tensor token_ids, Tensor num_tokens, Tensor? req_indices, "
    "Tensor(a!) index, Tensor(b!) index_len, *, int min_n, int max_n) -> ()",
    cpu=_cpu.ngram_index_extend,
    cuda="specdec_kernels.kernels.ngram_index:ngram_index_extend",
    fake=_no_output,
)
define(
    "corpus_append(Tensor doc_tokens, Tensor doc_lens, Tensor? req_indices, "
    "Tensor(a!) corpus_tokens, Tensor(b!) corpus_meta, Tensor(c!) corpus_index, "
    "Tensor(d!) corpus_state, *, int min_n, int max_n) -> ()",
    cpu=_cpu.corpus_append,
    cuda="specdec_kernels.kernels.ngram_index:corpus_append",
    fake=_no_output,
)


def _propose_fake(
    token_ids,
    num_tokens,
    index,
    index_len,
    req_indices,
    max_draft_tokens,
    corpus_tokens,
    corpus_meta,
    corpus_index,
    corpus_state,
    *,
    min_n,
    max_n,
    num_speculative_tokens,
    max_model_len,
    tie_break,
):
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    return (
        token_ids.new_empty((B, num_speculative_tokens), dtype=torch.int32),
        token_ids.new_empty((B,), dtype=torch.int32),
        token_ids.new_empty((B,), dtype=torch.int32),
        token_ids.new_empty((B,), dtype=torch.int8),
    )


define(
    "ngram_index_propose(Tensor token_ids, Tensor num_tokens, Tensor index, Tensor index_len, "
    "Tensor? req_indices, Tensor? max_draft_tokens, Tensor? corpus_tokens, "
    "Tensor? corpus_meta, Tensor? corpus_index, Tensor? corpus_state, *, int min_n, "
    "int max_n, int num_speculative_tokens, int? max_model_len, str tie_break) "
    "-> (Tensor, Tensor, Tensor, Tensor)",
    cpu=_cpu.ngram_index_propose,
    cuda="specdec_kernels.kernels.ngram_index:ngram_index_propose",
    fake=_propose_fake,
)


# ----------------------------------------------------------------------------- constructors


def _check_n_range(min_n, max_n):
    check_int("min_n", min_n, min_value=1)
    check_int("max_n", max_n, min_value=1)
    if min_n > max_n:
        raise ValueError(f"min_n must be <= max_n, got min_n={min_n}, max_n={max_n}")


def new_ngram_index(
    num_rows: int,
    max_model_len: int,
    *,
    min_n: int,
    max_n: int,
    slots: int | None = None,
    device: torch.device | str | None = None,
) -> NgramIndex:
    """An empty own-history index for ``num_rows`` state rows of ``max_model_len`` tokens.

    Size: ``slots`` (``S``) per row and n, ``S >= max_model_len`` (a row has fewer distinct
    n-grams than tokens, so a probe always ends at an empty slot: the index is exact at any
    fill); default ``S = 2 * max_model_len`` (load <= 1/2, short probes). Memory:
    ``R x (max_n - min_n + 1) x S x 8`` bytes, e.g. 256 rows x 4 n x 2 x 32k tokens = 512 MiB.
    On a Linux CPU a table of 16 MiB or more is advised onto transparent huge pages before
    its first touch (``madvise(MADV_HUGEPAGE)``; advice only): probes land at random, and
    with 4 KiB pages a step at 128k tokens cost ~2x the step at 1k in TLB misses alone.

    Raises
    ------
    ValueError
        ``num_rows < 0``, ``max_model_len < 1``, a bad n range, ``slots < max_model_len``.
    """
    check_int("num_rows", num_rows, min_value=0)
    check_int("max_model_len", max_model_len, min_value=1)
    _check_n_range(min_n, max_n)
    S = 2 * max_model_len if slots is None else check_int("slots", slots, min_value=1)
    if S < max_model_len:
        raise ValueError(f"slots must be >= max_model_len ({max_model_len}), got {S}")
    N = max_n - min_n + 1
    return NgramIndex(
        full((num_rows, N, S, 2), -1, dtype=torch.int32, device=device),
        torch.zeros((num_rows,), dtype=torch.int32, device=device),
        min_n,
        max_n,
    )


def new_corpus(
    capacity: int,
    *,
    min_n: int,
    max_n: int,
    index_slots: int | None = None,
    device: torch.device | str | None = None,
) -> Corpus:
    """An empty shared corpus of ``capacity`` (``C``) tokens with ``index_slots`` (``H``) per n.

    Default ``H = 4 * C``. Memory ``C x 20 + (max_n - min_n + 1) x H x 8`` bytes (1M tokens,
    4 n: 148 MiB). Loss rate (a lookup may miss, never errs): an n-gram whose most recent
    occurrence is followed by ``a`` later n-gram occurrences (of the same n) is kept by a
    slot with probability ``(1 - 1/H)^(2a)`` and missed iff both of its slots lost it:
    ``P(miss) ~= (1 - exp(-2a/H))^2``; ``a <= C``, so at ``H = 4C`` at most 15% for the
    oldest n-grams in the corpus, 0.25% for those in its newest tenth.

    Raises
    ------
    ValueError
        ``capacity < 1``, ``index_slots < 1``, a bad n range.
    """
    check_int("capacity", capacity, min_value=1)
    _check_n_range(min_n, max_n)
    H = 4 * capacity if index_slots is None else check_int("index_slots", index_slots, min_value=1)
    N = max_n - min_n + 1
    return Corpus(
        torch.zeros((capacity,), dtype=torch.int32, device=device),
        torch.zeros((capacity, 2), dtype=torch.int64, device=device),
        full((N, H), -1, dtype=torch.int64, device=device),
        torch.zeros((2,), dtype=torch.int64, device=device),
        min_n,
        max_n,
    )


# ----------------------------------------------------------------------------- validation


def _check_state_tensor(name, t, *, dtype, ndim, device):
    check_tensor(name, t, dtype=dtype, ndim=ndim, device=device)
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (it is state updated in place)")
    return t


def _check_index(index, token_ids, device):
    if not isinstance(index, NgramIndex):
        raise ValueError(
            f"index must be an NgramIndex (new_ngram_index), got {type(index).__name__}"
        )
    _check_n_range(index.min_n, index.max_n)
    R, L_max = token_ids.shape
    table = _check_state_tensor(
        "index.table", index.table, dtype=torch.int32, ndim=4, device=device
    )
    N = index.max_n - index.min_n + 1
    if table.shape[0] != R or table.shape[1] != N or table.shape[3] != 2:
        raise ValueError(
            f"index.table must have shape ({R}, {N}, S, 2) (rows of token_ids, max_n - min_n + 1), "
            f"got {tuple(table.shape)}"
        )
    if table.shape[2] < max(L_max, 1):
        raise ValueError(
            f"index.table must have S >= token_ids.shape[1] ({L_max}) slots per row and n so "
            f"that it stays exact when full, got S = {table.shape[2]}"
        )
    length = _check_state_tensor(
        "index.length", index.length, dtype=torch.int32, ndim=1, device=device
    )
    check_shape("index.length", length, (R,), "one length per row of token_ids")


def _check_history(token_ids, num_tokens):
    token_ids = check_tensor("token_ids", token_ids, dtype=torch.int32, ndim=2)
    device = token_ids.device
    num_tokens = check_tensor("num_tokens", num_tokens, dtype=torch.int32, ndim=1, device=device)
    check_shape("num_tokens", num_tokens, (token_ids.shape[0],), "one length per row of token_ids")
    return token_ids, num_tokens, device


def _check_corpus(corpus, device):
    if not isinstance(corpus, Corpus):
        raise ValueError(f"corpus must be a Corpus (new_corpus), got {type(corpus).__name__}")
    _check_n_range(corpus.min_n, corpus.max_n)
    tokens = _check_state_tensor(
        "corpus.tokens", corpus.tokens, dtype=torch.int32, ndim=1, device=device
    )
    C = tokens.shape[0]
    if C < 1:
        raise ValueError("corpus.tokens must hold at least one token slot")
    meta = _check_state_tensor("corpus.meta", corpus.meta, dtype=torch.int64, ndim=2, device=device)
    check_shape("corpus.meta", meta, (C, 2), "(start, end) per token slot")
    index = _check_state_tensor(
        "corpus.index", corpus.index, dtype=torch.int64, ndim=2, device=device
    )
    N = corpus.max_n - corpus.min_n + 1
    if index.shape[0] != N or index.shape[1] < 1:
        raise ValueError(
            f"corpus.index must have shape ({N}, H >= 1) (max_n - min_n + 1), got "
            f"{tuple(index.shape)}"
        )
    state = _check_state_tensor(
        "corpus.state", corpus.state, dtype=torch.int64, ndim=1, device=device
    )
    check_shape("corpus.state", state, (2,), "(end, lo)")


def _index_rows_op(op, token_ids, num_tokens, index, req_indices, validate, *, extend):
    token_ids, num_tokens, device = _check_history(token_ids, num_tokens)
    _check_index(index, token_ids, device)
    R, L_max = token_ids.shape
    B = check_req_indices(req_indices, "the batch", None, R, device)
    B = R if B is None else B
    if should_check_values([token_ids, num_tokens, req_indices, index.length], validate):
        check_req_indices_values(req_indices, R, unique=True, what="rows of token_ids")
        rows = batch_state_rows(req_indices, B)
        check_value_range(
            "num_tokens",
            num_tokens[rows],
            0,
            L_max,
            "token_ids.shape[1], for the rows in the batch",
        )
        if extend and bool((num_tokens[rows] < index.length[rows]).any()):
            raise ValueError(
                "num_tokens must be >= index.length for the rows in the batch (histories only "
                "grow; rebuild a row with ngram_index_build when its tokens change)"
            )
    op(
        token_ids,
        num_tokens.contiguous(),
        None if req_indices is None else req_indices.contiguous(),
        index.table,
        index.length,
        min_n=index.min_n,
        max_n=index.max_n,
    )


# ----------------------------------------------------------------------------- public ops


def ngram_index_build(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    index: NgramIndex,
    req_indices: torch.Tensor | None = None,
    *,
    validate: bool | None = None,
) -> None:
    """Index rows from scratch: every n-gram of ``token_ids[r, :num_tokens[r]]`` that has a
    following token, for ``r = req_indices[b]`` (admission / after prefill).

    The rows' tables are emptied, then for each ``n`` in ``[min_n, max_n]`` and each start
    ``0 <= i <= L - n - 1`` the n-gram ``token_ids[r, i:i+n]`` is inserted, keeping its
    smallest and largest ``i``; ``index.length[r] = L``. O(L x n range) work per row, in
    parallel on the GPU (lock-free linear probing, ``kernels/ngram_index.py``). No host
    synchronisation. Calls ``torch.ops.specdec.ngram_index_build`` (``index.table`` and
    ``index.length`` are ``Tensor(a!)``/``Tensor(b!)``).

    Parameters
    ----------
    token_ids : torch.Tensor
        int32 ``[R, L_max]``, the persistent token histories. Any strides.
    num_tokens : torch.Tensor
        int32 ``[R]``, history lengths, ``0 <= L <= L_max``.
    index : NgramIndex
        The state (``new_ngram_index(R, L_max, ...)``), updated in place.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, the unique state rows to index; -1 = padding row (skipped). Default:
        every row.
    validate : bool, optional
        Run the value checks (see Raises). Default: only for CPU tensors.

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape; ``index`` not matching ``token_ids`` (rows,
        n range, ``S < L_max``) or not contiguous. With value checks: ``req_indices``
        outside ``[-1, R)`` or repeated; ``num_tokens`` of a batch row outside ``[0, L_max]``.
    """
    _index_rows_op(
        torch.ops.specdec.ngram_index_build,
        token_ids,
        num_tokens,
        index,
        req_indices,
        validate,
        extend=False,
    )


def ngram_index_extend(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    index: NgramIndex,
    req_indices: torch.Tensor | None = None,
    *,
    validate: bool | None = None,
) -> None:
    """Add the n-grams completed by the tokens committed since the last call (after commit).

    For each row ``r = req_indices[b]`` with ``old = index.length[r]`` and
    ``L = num_tokens[r]``: inserts the n-grams at the starts ``i`` with
    ``old <= i + n < L`` (each gains its following token now), then
    ``index.length[r] = L``. O((L - old) x n range) per row, independent of ``L``: call it
    right after ``commit_accepted_tokens`` each step (rows that committed nothing cost a
    few loads). No host synchronisation; ``torch.ops.specdec.ngram_index_extend``.

    Parameters
    ----------
    token_ids, num_tokens, index, req_indices, validate
        As :func:`ngram_index_build`; ``num_tokens[r] >= index.length[r]`` (histories only
        grow: a row whose tokens change is rebuilt).

    Raises
    ------
    ValueError
        As :func:`ngram_index_build`; with value checks also ``num_tokens < index.length``
        for a batch row.
    """
    _index_rows_op(
        torch.ops.specdec.ngram_index_extend,
        token_ids,
        num_tokens,
        index,
        req_indices,
        validate,
        extend=True,
    )


def corpus_append(
    corpus: Corpus,
    doc_tokens: torch.Tensor,
    doc_lens: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    validate: bool | None = None,
) -> None:
    """Append one immutable document per batch row to the shared corpus.

    Batch row ``b`` appends ``doc_tokens[r, :doc_lens[r]]`` (``r = req_indices[b]``; -1 or
    a zero length appends nothing): a finished request's prompt + output (pass the
    persistent ``token_ids``, ``num_tokens`` and ``where(finished, req_indices, -1)``), or
    any text (a file being edited, a predicted output). Within one call row ``b`` is more
    recent than row ``b - 1``; later calls are more recent still.

    The corpus is a ring of ``C`` token slots: documents take consecutive absolute
    positions (slot ``p % C``); when they do not fit, whole documents are evicted, oldest
    first (a document longer than ``C`` keeps its last ``C`` tokens, and documents of the
    same call can evict each other). Every occurrence of an n-gram (``n`` in
    ``[min_n, max_n]``) that has a following token inside its document goes into the
    corpus table: per n, its start ``p`` is ``max``-ed into two hashed slots. An evicted
    occurrence is older than every live one, so its entry loses to any live one and is
    recognised as stale (``p < lo``), never returned. No host synchronisation;
    ``torch.ops.specdec.corpus_append`` (every corpus tensor is ``Tensor(x!)``).

    Parameters
    ----------
    corpus : Corpus
        The shared corpus (:func:`new_corpus`), updated in place.
    doc_tokens : torch.Tensor
        int32 ``[R, W]``, document tokens (e.g. the persistent ``token_ids``). Any strides.
    doc_lens : torch.Tensor
        int32 ``[R]``, document lengths, ``0 <= doc_lens[r] <= W``.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, rows of ``doc_tokens`` to append, in order (oldest first); -1 =
        nothing. Default: every row.
    validate : bool, optional
        Run the value checks. Default: only for CPU tensors.

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape; a malformed ``corpus``. With value checks:
        ``req_indices`` outside ``[-1, R)``; ``doc_lens`` of a batch row outside ``[0, W]``.
    """
    doc_tokens = check_tensor("doc_tokens", doc_tokens, dtype=torch.int32, ndim=2)
    device = doc_tokens.device
    doc_lens = check_tensor("doc_lens", doc_lens, dtype=torch.int32, ndim=1, device=device)
    R, W = doc_tokens.shape
    check_shape("doc_lens", doc_lens, (R,), "one length per row of doc_tokens")
    _check_corpus(corpus, device)
    B = check_req_indices(req_indices, "the batch", None, R, device)
    B = R if B is None else B
    if should_check_values([doc_tokens, doc_lens, req_indices, corpus.state], validate):
        check_req_indices_values(req_indices, R, what="rows of doc_tokens")
        rows = batch_state_rows(req_indices, B)
        check_value_range("doc_lens", doc_lens[rows], 0, W, "doc_tokens.shape[1], for the batch")
    torch.ops.specdec.corpus_append(
        doc_tokens,
        doc_lens.contiguous(),
        None if req_indices is None else req_indices.contiguous(),
        corpus.tokens,
        corpus.meta,
        corpus.index,
        corpus.state,
        min_n=corpus.min_n,
        max_n=corpus.max_n,
    )


def ngram_index_propose(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    index: NgramIndex,
    req_indices: torch.Tensor | None = None,
    *,
    num_speculative_tokens: int,
    corpus: Corpus | None = None,
    max_model_len: int | None = None,
    max_draft_tokens: torch.Tensor | None = None,
    tie_break: str = "first",
    validate: bool | None = None,
) -> IndexProposal:
    """Propose drafts from the own-history index and (optionally) the shared corpus.

    For request ``b`` (``r = req_indices[b]``, ``seq = token_ids[r, :L]``) try
    ``n = max_n, ..., min_n``; the first ``n`` whose suffix ``seq[L-n:L]`` occurs in the
    request's own history (an earlier start ``i <= L-n-1``) or in the corpus wins. On the
    same ``n`` the own history wins, with ``tie_break`` choosing its smallest
    (``"first"``) or largest (``"last"``) ``i``; in the corpus the most recent occurrence
    wins. Drafts are the tokens that follow, ``m = min(k, max_draft_tokens[b],
    available, max_model_len - L)`` clamped at 0, where ``available`` is ``L - (i+n)``
    (own) or the rest of the corpus document (drafts never cross a document's end).

    Without a corpus the proposals equal :func:`~specdec_kernels.ops.ngram_propose`'s
    exactly (both tie-breaks, every cap, padding rows), at a per-row cost of
    ``(max_n - min_n + 1)`` hash probes instead of a scan of the history (tested under
    random schedules of admissions and commits). The corpus may miss an n-gram (see
    :func:`new_corpus`) but a corpus draft is always the continuation of a live
    occurrence of the suffix. No host synchronisation, static shapes;
    ``torch.ops.specdec.ngram_index_propose``.

    Parameters
    ----------
    token_ids : torch.Tensor
        int32 ``[R, L_max]``, the persistent token histories. Any strides.
    num_tokens : torch.Tensor
        int32 ``[R]``, history lengths; ``index.length`` must equal them for the batch
        rows (call :func:`ngram_index_extend` after each commit).
    index : NgramIndex
        The own-history index of ``token_ids``.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, state row of each batch row; -1 = padding row (0 drafts). Default
        ``arange(R)``.
    num_speculative_tokens : int
        ``k >= 0``, draft slots per request (static).
    corpus : Corpus, optional
        The shared corpus (same ``min_n``, ``max_n`` as ``index``); None: own history only.
    max_model_len : int, optional
        Drafts never take a request past this many tokens. None: no such cap.
    max_draft_tokens : torch.Tensor, optional
        int32 ``[B]``, a per-request cap (0 disables the row).
    tie_break : {"first", "last"}
        Which own-history start wins among those of the longest ``n``.
    validate : bool, optional
        Run the value checks. Default: only for CPU tensors; never while compiling or
        capturing.

    Returns
    -------
    IndexProposal
        ``draft_token_ids`` int32 ``[B, k]`` (-1 padded), ``num_draft_tokens`` int32
        ``[B]``, ``match_len`` int32 ``[B]`` (the winning n, 0 without drafts; equal to
        ``ngram_propose``'s without a corpus), ``draft_source`` int8 ``[B]`` (0 none, 1 own
        history, 2 corpus).

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape; ``index``/``corpus`` malformed or with another
        n range; ``num_speculative_tokens < 0``, ``max_model_len < 1``, unknown
        ``tie_break``. With value checks: ``req_indices`` outside ``[-1, R)``;
        ``num_tokens`` of a batch row outside ``[0, L_max]`` or not equal to
        ``index.length``; ``max_draft_tokens < 0``.
    """
    token_ids, num_tokens, device = _check_history(token_ids, num_tokens)
    _check_index(index, token_ids, device)
    R, L_max = token_ids.shape
    B = check_req_indices(req_indices, "the batch", None, R, device)
    B = R if B is None else B
    max_draft_tokens = check_optional_tensor(
        "max_draft_tokens", max_draft_tokens, dtype=torch.int32, ndim=1, device=device
    )
    if max_draft_tokens is not None:
        check_shape("max_draft_tokens", max_draft_tokens, (B,), "one cap per batch row")
    check_int("num_speculative_tokens", num_speculative_tokens, min_value=0)
    if max_model_len is not None:
        check_int("max_model_len", max_model_len, min_value=1)
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break must be one of {TIE_BREAKS}, got {tie_break!r}")
    ctensors = (None, None, None, None)
    if corpus is not None:
        _check_corpus(corpus, device)
        if (corpus.min_n, corpus.max_n) != (index.min_n, index.max_n):
            raise ValueError(
                f"corpus n range ({corpus.min_n}, {corpus.max_n}) must equal the index's "
                f"({index.min_n}, {index.max_n})"
            )
        ctensors = (corpus.tokens, corpus.meta, corpus.index, corpus.state)
    if should_check_values([token_ids, num_tokens, req_indices, max_draft_tokens], validate):
        check_req_indices_values(req_indices, R, what="rows of token_ids")
        rows = batch_state_rows(req_indices, B)
        check_value_range(
            "num_tokens",
            num_tokens[rows],
            0,
            L_max,
            "token_ids.shape[1], for the rows in the batch",
        )
        if not torch.equal(num_tokens[rows], index.length[rows]):
            raise ValueError(
                "index.length must equal num_tokens for the rows in the batch (call "
                "ngram_index_extend after every commit, ngram_index_build at admission)"
            )
        if max_draft_tokens is not None and max_draft_tokens.numel():
            if int(max_draft_tokens.min()) < 0:
                raise ValueError(
                    f"max_draft_tokens must be >= 0, got {int(max_draft_tokens.min())}"
                )
    drafts, counts, match_len, source = torch.ops.specdec.ngram_index_propose(
        token_ids,
        num_tokens.contiguous(),
        index.table,
        index.length,
        None if req_indices is None else req_indices.contiguous(),
        None if max_draft_tokens is None else max_draft_tokens.contiguous(),
        *ctensors,
        min_n=index.min_n,
        max_n=index.max_n,
        num_speculative_tokens=num_speculative_tokens,
        max_model_len=max_model_len,
        tie_break=tie_break,
    )
    return IndexProposal(drafts, counts, match_len, source)
