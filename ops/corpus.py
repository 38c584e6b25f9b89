"""The shared corpus: ``new_corpus`` and ``corpus_append``.

A ring of finished requests (and any text a caller adds) with an n-gram table that every
request can draft from through ``ngram_propose(..., corpus=...)``, as SuffixDecoding /
vLLM's ``suffix`` method and SGLang's shared n-gram trie do on the host. Contract:
``docs/design.md``, "Shared corpus".
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec_kernels.constants import SCORINGS
from specdec_kernels.cpu import corpus as _cpu
from specdec_kernels.ops._library import call, define
from specdec_kernels.ops._memory import full
from specdec_kernels.ops._validation import (
    check_int,
    check_n_range,
    check_req_indices,
    check_req_indices_values,
    check_rows_range,
    check_shape,
    check_state_tensor,
    check_tensor,
    should_check_values,
)
from specdec_kernels.ops.frequency import (
    FrequencyCorpus,
    check_frequency_corpus,
    new_frequency_corpus,
    no_append_output,
)


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


define(
    "corpus_append(Tensor doc_tokens, Tensor doc_lens, Tensor? req_indices, "
    "Tensor(a!)[] corpus, *, int min_n, int max_n) -> ()",
    cpu=_cpu.corpus_append,
    cuda="specdec_kernels.kernels.corpus:corpus_append",
    fake=no_append_output,
)


def new_corpus(
    capacity: int,
    *,
    min_n: int,
    max_n: int,
    index_slots: int | None = None,
    scoring: str = "longest",
    nodes: int | None = None,
    device: torch.device | str | None = None,
) -> Corpus | FrequencyCorpus:
    """An empty shared corpus of ``capacity`` (``C``) tokens with ``index_slots`` (``H``) per n.

    Default ``H = 4 * C``. Memory ``C x 20 + (max_n - min_n + 1) x H x 8`` bytes (1M tokens,
    4 n: 148 MiB). A lookup may miss, never errs; the loss rate is in the contract:
    ``docs/design.md``, "Shared corpus".

    ``scoring="frequency"`` (a :class:`FrequencyCorpus` for ``ngram_propose(...,
    scoring="frequency")``): a budget of ``C >= 8 (min_n + 2)`` slots (a document takes its
    tokens plus one), ``max_n`` the depth D; the oldest documents are evicted exactly, by
    rebuilding. ``nodes`` (``M``, default ``2 C + 1``: never short) is each store's node
    budget, in ``[16 (min_n + 2), 2 C + 1]``: a smaller one saves memory and, where the text
    needs more than ``M`` nodes for its ``C`` slots, evicts earlier (and empties the corpus
    if a store runs out). ``index_slots`` is then the tries' table size ``S``, a power of
    two ``>= M`` (default: ``M - 1`` keys at most 3/4 full). Memory ``2 (4.5 C + 16 M + 12 S)
    + 12 C`` bytes (~150-220 B a slot by default). Contract: ``docs/design.md``,
    "Frequency-scored drafting".

    Raises
    ------
    ValueError
        ``capacity < 1``, ``index_slots < 1``, a bad n range, an unknown ``scoring``,
        ``nodes`` with ``"longest"``; for ``"frequency"``: ``capacity < 8 (min_n + 2)``,
        ``min_n >= max_n``, ``max_n > FREQUENCY_MAX_DEPTH``, ``nodes`` outside its range,
        ``index_slots`` not a power of two ``>= nodes``.

    Examples
    --------
    >>> corpus = new_corpus(1000, min_n=2, max_n=4)
    >>> tuple(corpus.index.shape), corpus.state.tolist()
    ((3, 4000), [0, 0])
    """
    check_int("capacity", capacity, min_value=1)
    check_n_range(min_n, max_n)
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    if scoring == "frequency":
        if nodes is not None:
            check_int("nodes", nodes, min_value=1)
        if index_slots is not None:
            check_int("index_slots", index_slots, min_value=1)
        return new_frequency_corpus(capacity, min_n=min_n, max_n=max_n, nodes=nodes,
                                    slots=index_slots, device=device)  # fmt: skip
    if nodes is not None:
        raise ValueError('nodes sizes a corpus of scoring="frequency" only')
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


def check_corpus(corpus: object, device: torch.device) -> Corpus | FrequencyCorpus:
    """A well-formed :class:`Corpus` or :class:`FrequencyCorpus` on ``device``."""
    if isinstance(corpus, FrequencyCorpus):
        return check_frequency_corpus(corpus, device)
    if not isinstance(corpus, Corpus):
        raise ValueError(
            f"corpus must be a Corpus or FrequencyCorpus (new_corpus), got {type(corpus).__name__}"
        )
    check_n_range(corpus.min_n, corpus.max_n)
    tokens = check_state_tensor(
        "corpus.tokens", corpus.tokens, dtype=torch.int32, ndim=1, device=device
    )
    C = tokens.shape[0]
    if C < 1:
        raise ValueError("corpus.tokens must hold at least one token slot")
    meta = check_state_tensor("corpus.meta", corpus.meta, dtype=torch.int64, ndim=2, device=device)
    check_shape("corpus.meta", meta, (C, 2), "(start, end) per token slot")
    index = check_state_tensor(
        "corpus.index", corpus.index, dtype=torch.int64, ndim=2, device=device
    )
    N = corpus.max_n - corpus.min_n + 1
    if index.shape[0] != N or index.shape[1] < 1:
        raise ValueError(
            f"corpus.index must have shape ({N}, H >= 1) (max_n - min_n + 1), got "
            f"{tuple(index.shape)}"
        )
    state = check_state_tensor(
        "corpus.state", corpus.state, dtype=torch.int64, ndim=1, device=device
    )
    check_shape("corpus.state", state, (2,), "(end, lo)")
    return corpus


def corpus_append(
    doc_tokens: torch.Tensor,
    doc_lens: torch.Tensor,
    req_indices: torch.Tensor | None = None,
    *,
    corpus: Corpus | FrequencyCorpus,
    validate: bool | None = None,
) -> None:
    """Append one immutable document per batch row to the shared corpus, oldest first.

    Batch row ``b`` appends ``doc_tokens[r, :doc_lens[r]]`` (``r = req_indices[b]``; -1 or
    a zero length appends nothing): a finished request's prompt + output (pass the
    persistent ``token_ids``, ``num_tokens`` and ``where(finished, req_indices, -1)``), or
    any text. When the ring is full, whole documents are evicted, oldest first. In place,
    no host synchronisation (``torch.ops.specdec.corpus_append``). Contract:
    ``docs/design.md``, "Shared corpus". On a ``FrequencyCorpus`` a document enters as
    pieces of at most ``min(C // 8, M // 16) - 1`` tokens and the oldest pieces leave,
    exactly, by the rebuild that starts past ``6/8 C`` slots or ``6/8 M`` nodes (a store
    out of nodes empties the corpus; op ``frequency_corpus_append``; contract:
    ``docs/design.md``, "Frequency-scored drafting").

    Parameters
    ----------
    doc_tokens : torch.Tensor
        int32 ``[R, W]``, document tokens (e.g. the persistent ``token_ids``). Any strides.
    doc_lens : torch.Tensor
        int32 ``[R]``, document lengths, ``0 <= doc_lens[r] <= W``.
    req_indices : torch.Tensor, optional
        int32 ``[B]``, rows of ``doc_tokens`` to append, in order (oldest first); -1 =
        nothing. Default: every row.
    corpus : Corpus or FrequencyCorpus
        The shared corpus (:func:`new_corpus`), updated in place.
    validate : bool, optional
        Run the value checks. Default: only for CPU tensors.

    Raises
    ------
    ValueError
        Wrong dtype, device, ndim or shape; a malformed ``corpus``. With value checks:
        ``req_indices`` outside ``[-1, R)``; ``doc_lens`` of a batch row outside ``[0, W]``.

    Examples
    --------
    >>> corpus = new_corpus(100, min_n=2, max_n=2)
    >>> docs = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]], dtype=torch.int32)
    >>> corpus_append(docs, torch.tensor([3, 4], dtype=torch.int32), corpus=corpus)
    >>> corpus.state.tolist()  # (end, lo): 7 live tokens
    [7, 0]
    """
    doc_tokens = check_tensor("doc_tokens", doc_tokens, dtype=torch.int32, ndim=2)
    device = doc_tokens.device
    doc_lens = check_tensor("doc_lens", doc_lens, dtype=torch.int32, ndim=1, device=device)
    R, W = doc_tokens.shape
    check_shape("doc_lens", doc_lens, (R,), "one length per row of doc_tokens")
    corpus = check_corpus(corpus, device)
    B = check_req_indices(req_indices, "the batch", None, R, device)
    B = R if B is None else B
    if should_check_values([doc_tokens, doc_lens, req_indices, corpus.state], validate):
        check_req_indices_values(req_indices, R, what="rows of doc_tokens")
        what = "doc_tokens.shape[1], for the batch"
        check_rows_range("doc_lens", doc_lens, req_indices, B, 0, W, what)
    frequency = isinstance(corpus, FrequencyCorpus)
    call(
        "frequency_corpus_append" if frequency else "corpus_append",
        doc_tokens=doc_tokens,
        doc_lens=doc_lens.contiguous(),
        req_indices=None if req_indices is None else req_indices.contiguous(),
        corpus=corpus_tensors(corpus),
        min_n=corpus.min_n,
        max_n=corpus.max_n,
    )


def corpus_tensors(corpus: Corpus | FrequencyCorpus) -> list[torch.Tensor]:
    """The state's tensors in schema order (a ``Tensor[]`` argument)."""
    return list(corpus[:-2])
