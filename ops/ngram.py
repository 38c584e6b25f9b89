"""``ngram_propose``: batched n-gram (prompt lookup) drafting on the device.

One op for every source of drafts: a scan of each request's history, or its own-history
index (``ops/ngram_index.py``), and optionally the shared corpus (``ops/corpus.py``).
Contract: ``docs/design.md``, "``ngram_propose``".
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from specdec_kernels.constants import SCORINGS, TIE_BREAKS
from specdec_kernels.cpu import frequency as _cpu_frequency
from specdec_kernels.cpu import ngram as _cpu
from specdec_kernels.ops._library import call, calls_cpu_directly, define, refused
from specdec_kernels.ops._validation import (
    check_batch_lengths,
    check_int,
    check_n_range,
    check_optional_tensor,
    check_req_indices,
    check_req_indices_values,
    check_shape,
    check_token_state,
    should_check_values,
)
from specdec_kernels.ops.corpus import Corpus, check_corpus, corpus_tensors
from specdec_kernels.ops.frequency import (
    FrequencyCorpus,
    FrequencyIndex,
    check_proposal_args,
)
from specdec_kernels.ops.ngram_index import NgramIndex, check_index, ngram_index_extend
from specdec_kernels.ops.ngram_index import _check_values as _check_index_values


class NgramProposal(NamedTuple):
    """Draft tokens proposed by :func:`ngram_propose`."""

    draft_token_ids: torch.Tensor
    """int32 ``[B, k]``: the drafts of batch row ``b`` in ``[b, :num_draft_tokens[b]]``, then -1."""
    num_draft_tokens: torch.Tensor
    """int32 ``[B]``: how many drafts row ``b`` got, in ``[0, k]``."""
    match_len: torch.Tensor
    """int32 ``[B]``: the ``n`` of the n-gram whose continuation became the drafts, in
    ``[min_n, max_n]``; 0 for a row that got no draft."""
    draft_source: torch.Tensor
    """int8 ``[B]``: where the drafts come from: ``DRAFT_SOURCE_NONE`` (0, no drafts),
    ``DRAFT_SOURCE_OWN`` (1, the request's own history), ``DRAFT_SOURCE_CORPUS`` (2)."""


class FrequencyProposal(NamedTuple):
    """Draft tokens proposed by :func:`ngram_propose` with ``scoring="frequency"``: the
    fields of :class:`NgramProposal`, then ``draft_probs``."""

    draft_token_ids: torch.Tensor
    """int32 ``[B, k]``, as :class:`NgramProposal`'s."""
    num_draft_tokens: torch.Tensor
    """int32 ``[B]``, as :class:`NgramProposal`'s."""
    match_len: torch.Tensor
    """int32 ``[B]``: the length ``m`` of the context whose chain won, 0 without drafts."""
    draft_source: torch.Tensor
    """int8 ``[B]``: ``DRAFT_SOURCE_OWN`` (1) where the row got drafts, else 0."""
    draft_probs: torch.Tensor
    """float32 ``[B, k]``: each draft's running probability (the product of its chain's
    ``count(c + x) / count(c)`` ratios: an estimate of the chance that it and every draft
    before it are accepted), 0 past the drafts."""


def _fake(
    token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, *, min_n, max_n,
    num_speculative_tokens, max_model_len, tie_break,
):  # fmt: skip
    B = num_tokens.shape[0] if req_indices is None else req_indices.shape[0]
    counts = token_ids.new_empty((B,), dtype=torch.int32)
    return (
        token_ids.new_empty((B, num_speculative_tokens), dtype=torch.int32),
        counts,
        torch.empty_like(counts),
        token_ids.new_empty((B,), dtype=torch.int8),
    )


define(
    "ngram_propose(Tensor token_ids, Tensor num_tokens, Tensor? req_indices, "
    "Tensor? max_draft_tokens, Tensor[]? index, Tensor[]? corpus, *, int min_n, int max_n, "
    "int num_speculative_tokens, int? max_model_len, str tie_break) "
    "-> (Tensor, Tensor, Tensor, Tensor)",
    cpu=_cpu.ngram_propose,
    cuda="specdec_kernels.kernels.ngram:ngram_propose",
    fake=_fake,
    cpu_checked=_cpu.ngram_propose_checked,
)


def _check_same_n(what: str, state, min_n: int, max_n: int) -> None:
    if (state.min_n, state.max_n) != (min_n, max_n):
        raise ValueError(
            f"{what} was made for n in [{state.min_n}, {state.max_n}], but min_n={min_n}, "
            f"max_n={max_n} were given: they must be equal"
        )


def ngram_propose(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    min_n: int,
    max_n: int,
    num_speculative_tokens: int,
    max_model_len: int | None = None,
    max_draft_tokens: torch.Tensor | None = None,
    tie_break: str = "first",
    index: NgramIndex | FrequencyIndex | None = None,
    corpus: Corpus | FrequencyCorpus | None = None,
    scoring: str = "longest",
    min_token_prob: float | None = None,
    max_spec_factor: float | None = None,
    max_spec_offset: float | None = None,
    extend_index: bool = False,
    validate: bool | None = None,
) -> NgramProposal | FrequencyProposal:
    """Propose draft tokens by matching each request's newest n-gram against its history
    (and the shared corpus): prompt lookup decoding (Saxena, 2023), vLLM's n-gram proposer.

    For ``n = max_n .. min_n`` the first ``n`` whose suffix occurs earlier in the request
    (at its first or last start, ``tie_break``) or, if not there, in the corpus (its most
    recent occurrence) wins; the drafts are the tokens that follow, at most ``k``. Without
    an index every history is scanned; with one, one table lookup per request and n gives
    the same drafts. No host synchronisation, static shapes
    (``torch.ops.specdec.ngram_propose``). Contract: ``docs/design.md``, "``ngram_propose``".

    ``scoring="frequency"`` (SuffixDecoding's rule, ``torch.ops.specdec.frequency_propose``)
    counts instead: per context length, the chain of most frequent continuations; the
    best-scoring chain wins. Contract: ``docs/design.md``, "Frequency-scored drafting".

    Parameters
    ----------
    token_ids : torch.Tensor
        int32 ``[R, L_max]``, the persistent token history (prompt + committed output) of
        every state row; entries at or past ``num_tokens[r]`` and rows outside the batch
        are never read. Any strides.
    num_tokens : torch.Tensor
        int32 ``[R]``, the history length ``L`` of each state row, ``0 <= L <= L_max``.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, the state row of each batch row; -1 = padding row (0 drafts).
        Default ``arange(R)``.
    min_n, max_n : int
        The n-gram lengths tried, ``1 <= min_n <= max_n`` (an index's or corpus's own).
    num_speculative_tokens : int
        ``k >= 0``, draft slots per request (static); ``k = 0`` returns ``[B, 0]`` drafts.
    max_model_len : int, optional
        Drafts never take a request past this many tokens. None: no such cap.
    max_draft_tokens : torch.Tensor, optional
        int32 ``[B]``, a per-request cap on the drafts; 0 disables the row.
    tie_break : {"first", "last"}
        Which own-history start of the winning n gives the drafts.
    index : NgramIndex or FrequencyIndex, optional
        The own-history index of ``token_ids`` (``new_ngram_index``), up to date:
        ``index.length == num_tokens`` for the batch rows. None: scan the histories. A
        ``FrequencyIndex`` (required) with ``scoring="frequency"``.
    corpus : Corpus or FrequencyCorpus, optional
        The shared corpus (``new_corpus``) to draft from too. None: own history only. A
        ``FrequencyCorpus`` with ``scoring="frequency"`` (its chain wins on a higher
        score; ties: the own history).
    scoring : {"longest", "frequency"}
        The rule above; ``"longest"`` is vLLM's.
    min_token_prob, max_spec_factor, max_spec_offset : float, optional
        ``"frequency"`` only: the chain's stop rules (defaults 0.1, 1.0, 0.0, as
        SuffixDecoding's); ``min_token_prob`` in ``[0, 1]``, the others ``>= 0``.
    extend_index : bool
        First :func:`ngram_index_extend` on the batch rows (in place), then propose.
    validate : bool, optional
        Run the value checks (see Raises). Default: only for CPU tensors; never while
        compiling or capturing a CUDA graph.

    Returns
    -------
    NgramProposal or FrequencyProposal
        ``draft_token_ids`` int32 ``[B, k]`` (-1 padded), ``num_draft_tokens`` int32
        ``[B]``, ``match_len`` int32 ``[B]`` (the winning n, 0 without drafts),
        ``draft_source`` int8 ``[B]`` (0 none, 1 own history, 2 corpus); with
        ``"frequency"`` a ``FrequencyProposal``, also ``draft_probs`` float32 ``[B, k]``.

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape of any tensor; ``min_n < 1``, ``min_n > max_n``,
        ``num_speculative_tokens < 0``, ``max_model_len < 1``, an unknown ``tie_break`` or
        ``scoring``; an ``index`` or ``corpus`` malformed or made for another n range; a
        ``FrequencyIndex`` with ``"longest"`` or its absence with ``"frequency"``, a
        frequency argument with ``"longest"`` or out of its range; ``extend_index``
        without an index. Value checks: ``req_indices`` outside ``[-1, R)``, ``num_tokens``
        of a batch row outside ``[0, L_max]`` or (index) not ``index.length`` (with
        ``extend_index``: ``ngram_index_extend``'s checks instead), ``max_draft_tokens < 0``.

    Examples
    --------
    >>> tokens = torch.tensor([[7, 8, 9, 10, 7, 8]], dtype=torch.int32)
    >>> p = ngram_propose(tokens, torch.tensor([6], dtype=torch.int32),
    ...                   min_n=1, max_n=2, num_speculative_tokens=3)
    >>> p.draft_token_ids.tolist(), p.match_len.tolist()
    ([[9, 10, 7]], [2])
    >>> from specdec_kernels.ops import new_ngram_index, ngram_index_build
    >>> tokens = torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2]], dtype=torch.int32)
    >>> n = torch.tensor([11], dtype=torch.int32)
    >>> index = new_ngram_index(1, 11, min_n=1, max_n=6, scoring="frequency")
    >>> ngram_index_build(tokens, n, index=index)
    >>> p = ngram_propose(tokens, n, min_n=1, max_n=6, num_speculative_tokens=3,
    ...                   index=index, scoring="frequency")
    >>> p.draft_token_ids.tolist(), p.match_len.tolist(), p.draft_probs.tolist()
    ([[4, 1, 2]], [3], [[0.5, 0.5, 0.5]])
    """
    token_ids, num_tokens = check_token_state(token_ids, num_tokens)
    device = token_ids.device
    R, L_max = token_ids.shape
    B = check_req_indices(req_indices, "the batch", None, R, device)
    B = R if B is None else B
    max_draft_tokens = check_optional_tensor(
        "max_draft_tokens", max_draft_tokens, dtype=torch.int32, ndim=1, device=device
    )
    if max_draft_tokens is not None:
        check_shape("max_draft_tokens", max_draft_tokens, (B,), "one cap per batch row")
    check_n_range(min_n, max_n)
    check_int("num_speculative_tokens", num_speculative_tokens, min_value=0)
    if max_model_len is not None:
        check_int("max_model_len", max_model_len, min_value=1)
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break must be one of {TIE_BREAKS}, got {tie_break!r}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    frequency_args = dict(min_token_prob=min_token_prob, max_spec_factor=max_spec_factor,
                          max_spec_offset=max_spec_offset)  # fmt: skip
    frequency_params = check_proposal_args(scoring, index, corpus, frequency_args)
    if scoring == "frequency" and tie_break != "first":
        raise ValueError(
            f"tie_break={tie_break!r} picks among n-gram occurrences (scoring='longest'); "
            "frequency scoring counts them all"
        )
    if index is not None:
        _check_same_n("index", check_index(index, token_ids), min_n, max_n)
    if corpus is not None:
        _check_same_n("corpus", check_corpus(corpus, device), min_n, max_n)
    if type(extend_index) is not bool:
        raise ValueError(f"extend_index must be a bool, got {type(extend_index).__name__}")
    if extend_index:
        if index is None:
            raise ValueError("extend_index=True brings an index up to date: pass index=")
        kw = dict(min_n=min_n, max_n=max_n, num_speculative_tokens=num_speculative_tokens,
                  max_model_len=max_model_len)  # fmt: skip
        if isinstance(index, NgramIndex):
            kw["tie_break"] = tie_break
        else:
            kw.update(zip(("min_token_prob", "max_spec_factor", "max_spec_offset"),
                          frequency_params, strict=True))  # fmt: skip
        fused = _extend_and_propose(
            token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus, validate, kw
        )
        if fused is not None:
            return fused
        tensors = [token_ids, num_tokens, req_indices, max_draft_tokens, index.length]
        if should_check_values(tensors, validate):  # all of them before the extend writes
            _check_index_values(num_tokens, req_indices, index, B, R, L_max, True)
            _check_caps(max_draft_tokens)
        ngram_index_extend(token_ids, num_tokens, req_indices, index=index, validate=False)

    value_checks = None
    if should_check_values([token_ids, num_tokens, req_indices, max_draft_tokens], validate):
        value_checks = functools.partial(
            _check_values, num_tokens, req_indices, max_draft_tokens, index, B, R, L_max
        )
    if scoring == "frequency":
        prob, factor, offset = frequency_params
        return FrequencyProposal(*call(
            "frequency_propose",
            token_ids=token_ids,
            num_tokens=num_tokens.contiguous(),
            req_indices=None if req_indices is None else req_indices.contiguous(),
            max_draft_tokens=None if max_draft_tokens is None else max_draft_tokens.contiguous(),
            index=[index.keys, index.vals, index.nodes, index.num_nodes, index.length],
            corpus=None if corpus is None else corpus_tensors(corpus),
            min_n=min_n,
            max_n=max_n,
            num_speculative_tokens=num_speculative_tokens,
            max_model_len=max_model_len,
            min_token_prob=prob,
            max_spec_factor=factor,
            max_spec_offset=offset,
            value_checks=value_checks,
        ))  # fmt: skip
    drafts, counts, match_len, source = call(
        "ngram_propose",
        token_ids=token_ids,
        num_tokens=num_tokens.contiguous(),
        req_indices=None if req_indices is None else req_indices.contiguous(),
        max_draft_tokens=None if max_draft_tokens is None else max_draft_tokens.contiguous(),
        index=None if index is None else [index.table, index.length],
        corpus=None if corpus is None else corpus_tensors(corpus),
        min_n=min_n,
        max_n=max_n,
        num_speculative_tokens=num_speculative_tokens,
        max_model_len=max_model_len,
        tie_break=tie_break,
        value_checks=value_checks,
    )
    return NgramProposal(drafts, counts, match_len, source)


def _check_values(num_tokens, req_indices, max_draft_tokens, index, B, R, L_max) -> None:
    """The value checks of :func:`ngram_propose` (see Raises there)."""
    check_req_indices_values(req_indices, R, what="rows of token_ids")
    other = None if index is None else index.length
    if check_batch_lengths(num_tokens, req_indices, B, L_max, other=other) != (0, 0):
        raise ValueError(
            "index.length must equal num_tokens for the rows in the batch (call "
            "ngram_index_extend after every commit, ngram_index_build at admission)"
        )
    _check_caps(max_draft_tokens)


def _check_caps(max_draft_tokens) -> None:
    if max_draft_tokens is not None and max_draft_tokens.numel():
        if int(max_draft_tokens.min()) < 0:
            raise ValueError(f"max_draft_tokens must be >= 0, got {int(max_draft_tokens.min())}")


def _extend_and_propose(token_ids, num_tokens, req_indices, max_draft_tokens, index, corpus,
                        validate, kw):  # fmt: skip
    """``extend_index=True`` on plain CPU tensors (the case where :func:`call` would run the
    CPU functions itself): the extend and the proposal as one kernel call
    (``cpu/ngram.py``, or ``cpu/frequency.py`` for a :class:`FrequencyIndex`), the value
    checks of both inside it. None: another route (the two ops in turn)."""
    frequency = not isinstance(index, NgramIndex)
    kwargs = dict(
        token_ids=token_ids,
        num_tokens=num_tokens.contiguous(),
        req_indices=None if req_indices is None else req_indices.contiguous(),
        max_draft_tokens=None if max_draft_tokens is None else max_draft_tokens.contiguous(),
        index=[index.keys, index.vals, index.nodes, index.num_nodes, index.length]
        if frequency else [index.table, index.length],
        corpus=None if corpus is None else corpus_tensors(corpus),
    )  # fmt: skip
    if not calls_cpu_directly(kwargs):
        return None
    tensors = [token_ids, num_tokens, req_indices, max_draft_tokens, index.length]
    check = should_check_values(tensors, validate)
    cpu = _cpu_frequency if frequency else _cpu
    out = cpu.extend_and_propose(**kwargs, **kw, check=check)
    if out is None:
        R, L_max = token_ids.shape
        B = R if req_indices is None else req_indices.shape[0]

        def value_checks():
            _check_index_values(num_tokens, req_indices, index, B, R, L_max, True)
            _check_caps(max_draft_tokens)

        refused("ngram_index_extend + ngram_propose", value_checks)
    return FrequencyProposal(*out) if frequency else NgramProposal(*out)
