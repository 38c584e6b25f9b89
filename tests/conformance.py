"""The conformance registry: a few named inputs for every op, run by tests/test_conformance.py.

Each :class:`OpCase` gives every argument of one op's schema by name (CPU tensors, lists of
tensors for state objects, Python values) and the typed wrapper's call on the same
arguments. ``tests/test_conformance.py`` runs every case through every tier that every op
must pass: reference == CPU path == Triton launcher (the interpreter without a GPU),
poisoned launcher outputs, ``torch.library.opcheck``, ``torch.compile(fullgraph=True)``
of the wrapper, and fake shapes. A new op joins by adding its cases to ``CASES`` (a test
fails while a registered op has none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdec_kernels import ops

I32 = torch.int32


def i32(x) -> torch.Tensor:
    return torch.tensor(x, dtype=I32)


def history(rows: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_ids [R, width]`` holding ``rows`` (poison past each length) and their lengths."""
    token_ids = torch.full((len(rows), width), 99999, dtype=I32)
    for i, r in enumerate(rows):
        token_ids[i, : len(r)] = i32(r)
    return token_ids, i32([len(r) for r in rows])


@dataclass(frozen=True)
class OpCase:
    op: str
    """The schema name (``torch.ops.specdec.<op>``)."""
    id: str
    make: Callable[[], dict]
    """Every schema argument by name; fresh tensors on each call."""
    public: Callable[[dict], tuple]
    """The typed wrapper on those arguments (state passed as its objects); its outputs."""
    mutated: tuple[str, ...] = ()
    """Arguments the op writes in place: compared after the call."""
    canon: dict[str, Callable] = field(default_factory=dict)
    """Per mutated argument, how to compare it (e.g. a hash table as a set of entries)."""

    @property
    def name(self) -> str:
        return f"{self.op}-{self.id}"


# ----------------------------------------------------------------------------- canonical forms


def index_entries(index: list[torch.Tensor]):
    """An own-history index as the set of its entries: slot positions depend on the order
    of the inserts (GPU atomics), the table's content does not (docs/design.md)."""
    table, length = (t.cpu() for t in index)
    occ = (table[..., 0] >= 0).nonzero().tolist()
    rows = sorted((r, j, int(table[r, j, s, 0]), int(table[r, j, s, 1])) for r, j, s in occ)
    return rows, length.tolist()


def corpus_live(corpus: list[torch.Tensor]):
    """A corpus as its live window: ring slots outside it are free."""
    tokens, meta, index, state = (t.cpu() for t in corpus)
    end, lo = state.tolist()
    slots = [p % tokens.shape[0] for p in range(lo, end)]
    return tokens[slots].tolist(), meta[slots].tolist(), index.tolist(), state.tolist()


# ----------------------------------------------------------------------------- n-gram family

MIN_N, MAX_N = 1, 3
NGRAM_ROWS = [
    [1, 2, 3, 1, 2, 3, 1],  # a match of every n
    [4, 5, 6],  # none
    [7, 7, 7, 7, 7],  # overlapping windows
    [8, 9, 8],  # a match of n = 1 only
]
DOCS = [[5, 6, 99, 8, 9, 10], [1, 2, 3, 1, 2, 40], [4, 5, 6, 7]]


def _index(tok, nt):
    index = ops.new_ngram_index(tok.shape[0], tok.shape[1], min_n=MIN_N, max_n=MAX_N)
    ops.ngram_index_build(tok, nt, index=index)
    return index


def _corpus(capacity=24):
    corpus = ops.new_corpus(capacity, min_n=MIN_N, max_n=MAX_N, index_slots=37)
    docs, lens = history(DOCS, 6)
    ops.corpus_append(docs, lens, corpus=corpus)
    return corpus


def _ngram_args(*, index: bool, corpus: bool, tie: str, batch: bool) -> dict:
    tok, nt = history(NGRAM_ROWS, 12)
    return dict(
        token_ids=tok,
        num_tokens=nt,
        req_indices=i32([3, 0, -1, 1, 2]) if batch else None,
        max_draft_tokens=i32([4, 4, 4, 4, 1]) if batch else None,
        index=list(_index(tok, nt)[:2]) if index else None,
        corpus=list(_corpus()[:4]) if corpus else None,
        min_n=MIN_N,
        max_n=MAX_N,
        num_speculative_tokens=4,
        max_model_len=11 if batch else None,
        tie_break=tie,
    )


def _ngram_public(a: dict) -> tuple:
    index = corpus = None
    if a["index"] is not None:
        index = ops.NgramIndex(*a["index"], a["min_n"], a["max_n"])
    if a["corpus"] is not None:
        corpus = ops.Corpus(*a["corpus"], a["min_n"], a["max_n"])
    out = ops.ngram_propose(
        a["token_ids"], a["num_tokens"], a["req_indices"], min_n=a["min_n"], max_n=a["max_n"],
        num_speculative_tokens=a["num_speculative_tokens"], max_model_len=a["max_model_len"],
        max_draft_tokens=a["max_draft_tokens"], tie_break=a["tie_break"], index=index,
        corpus=corpus,
    )  # fmt: skip
    return tuple(out)


# ----------------------------------------------------------------------------- frequency family

FREQ_ROWS = [
    [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2],  # "1 2" went on with 3 twice, 4 once
    [5, 5, 5, 5, 5, 5],  # one token: every depth, splits
    [6, 7, 8],  # no repeat
    [9, 1, 9, 2, 9, 1, 9],  # a tie broken by the latest occurrence
    [],
]
FREQ_D = 6


def _frequency_index(tok, nt, lens=None):
    index = ops.new_ngram_index(tok.shape[0], tok.shape[1], min_n=1, max_n=FREQ_D,
                                scoring="frequency")  # fmt: skip
    ops.ngram_index_build(tok, nt if lens is None else lens, index=index)
    return index


FREQ_DOCS = [[9, 1, 9, 1, 9, 3], [1, 2, 3, 1, 2, 3, 1], [5, 5, 6], [7, 8, 9, 7, 8], [4, 4]]


def _frequency_corpus(capacity=24, nodes=None):
    """A corpus that has rebuilt and evicted already (24 slots: pieces of 2 tokens); with a
    short node budget, one whose rebuild started on nodes."""
    corpus = ops.new_corpus(capacity, min_n=1, max_n=FREQ_D, scoring="frequency", nodes=nodes)
    docs, lens = history(FREQ_DOCS, 7)
    ops.corpus_append(docs, lens, corpus=corpus)
    if nodes is not None:  # text of distinct tokens: a rebuild starts on nodes
        ops.corpus_append(*history([list(range(10, 30))], 20), corpus=corpus)
    return corpus


def _frequency_args(*, batch: bool) -> dict:
    tok, nt = history(FREQ_ROWS, 14)
    return dict(
        token_ids=tok, num_tokens=nt,
        req_indices=i32([3, 0, -1, 1, 4, 2]) if batch else None,
        max_draft_tokens=i32([4, 3, 4, 4, 4, 2]) if batch else None,
        index=list(_frequency_index(tok, nt)[:5]),
        corpus=list(_frequency_corpus(64 if batch else 24)[:7]),
        min_n=2 if batch else 1, max_n=FREQ_D,
        num_speculative_tokens=4, max_model_len=13 if batch else None,
        min_token_prob=0.3 if batch else 0.0, max_spec_factor=2.0 if batch else 1.0,
        max_spec_offset=0.5 if batch else 0.0,
    )  # fmt: skip


def _frequency_public(a: dict) -> tuple:
    index = ops.FrequencyIndex(*a["index"], a["min_n"], a["max_n"])
    corpus = None
    if a["corpus"] is not None:
        corpus = ops.FrequencyCorpus(*a["corpus"], a["min_n"], a["max_n"])
    return tuple(
        ops.ngram_propose(
            a["token_ids"], a["num_tokens"], a["req_indices"], min_n=a["min_n"],
            max_n=a["max_n"], num_speculative_tokens=a["num_speculative_tokens"],
            max_model_len=a["max_model_len"], max_draft_tokens=a["max_draft_tokens"],
            index=index, corpus=corpus, scoring="frequency", min_token_prob=a["min_token_prob"],
            max_spec_factor=a["max_spec_factor"], max_spec_offset=a["max_spec_offset"],
        )
    )  # fmt: skip


def _frequency_index_args(*, extend: bool) -> dict:
    tok, nt = history(FREQ_ROWS, 14)
    index = _frequency_index(tok, nt, (nt - 3).clamp(min=0) if extend else nt // 2)
    req = None if extend else i32([2, -1, 0, 4])
    return dict(token_ids=tok, num_tokens=nt, req_indices=req, index=list(index[:5]), min_n=1,
                max_n=FREQ_D)  # fmt: skip


def _frequency_corpus_args(*, capacity: int, req, nodes=None) -> dict:
    corpus = _frequency_corpus(capacity, nodes)
    docs, lens = history([[3, 1, 2, 3, 1, 2, 3], [6, 6, 6, 6], [2, 9]], 7)
    return dict(doc_tokens=docs, doc_lens=lens, req_indices=req, corpus=list(corpus[:7]),
                min_n=1, max_n=FREQ_D)  # fmt: skip


def _frequency_corpus_public(a: dict) -> tuple:
    corpus = ops.FrequencyCorpus(*a["corpus"], a["min_n"], a["max_n"])
    ops.corpus_append(a["doc_tokens"], a["doc_lens"], a["req_indices"], corpus=corpus)
    return ()


def _frequency_index_public(fn):
    def call(a: dict) -> tuple:
        index = ops.FrequencyIndex(*a["index"], a["min_n"], a["max_n"])
        fn(a["token_ids"], a["num_tokens"], a["req_indices"], index=index)
        return ()

    return call


def _index_args(*, extend: bool) -> dict:
    tok, nt = history(NGRAM_ROWS, 12)
    index = ops.new_ngram_index(4, 12, min_n=MIN_N, max_n=MAX_N)
    if extend:  # the first tokens of each row are indexed already
        ops.ngram_index_build(tok, (nt - 2).clamp(min=0), index=index)
    req = i32([2, -1, 0, 3]) if not extend else None
    return dict(
        token_ids=tok, num_tokens=nt, req_indices=req, index=list(index[:2]), min_n=1, max_n=3
    )


def _index_public(fn):
    def call(a: dict) -> tuple:
        index = ops.NgramIndex(*a["index"], a["min_n"], a["max_n"])
        fn(a["token_ids"], a["num_tokens"], a["req_indices"], index=index)
        return ()

    return call


def _corpus_args(*, capacity: int, req) -> dict:
    corpus = ops.new_corpus(capacity, min_n=MIN_N, max_n=MAX_N, index_slots=29)
    docs, lens = history([[9, 9, 9, 1]], 4)
    ops.corpus_append(docs, lens, corpus=corpus)  # an older document to evict
    docs, lens = history(DOCS, 6)
    return dict(
        doc_tokens=docs, doc_lens=lens, req_indices=req, corpus=list(corpus[:4]), min_n=1, max_n=3
    )


def _corpus_public(a: dict) -> tuple:
    corpus = ops.Corpus(*a["corpus"], a["min_n"], a["max_n"])
    ops.corpus_append(a["doc_tokens"], a["doc_lens"], a["req_indices"], corpus=corpus)
    return ()


# ----------------------------------------------------------------------------- rejection


def _rejection_args(mode: str) -> dict:
    g = torch.Generator().manual_seed(len(mode))
    B, k, V = 4, 3, 11
    counts = i32([0, 3, 1, 2])
    cu = torch.cat([i32([0]), counts.cumsum(0).to(I32)])
    N = int(cu[-1])
    logits = torch.randn(N + B, V, generator=g) * 2.0
    owner = torch.repeat_interleave(torch.arange(B), counts.long())
    drafts = logits[torch.arange(N) + owner].argmax(-1).to(I32)
    drafts[1] = (drafts[1] + 1) % V  # one rejection
    drafts[-1] = -1  # an out-of-range draft
    a = dict(
        target_logits=logits, draft_token_ids=drafts, cu_num_draft_tokens=cu, draft_probs=None,
        temperature=None, top_k=None, top_p=None, min_p=None, seeds=None, offsets=None,
        num_speculative_tokens=k, return_logprobs=mode != "greedy",
    )  # fmt: skip
    if mode != "greedy":
        a.update(
            temperature=torch.tensor([0.0, 0.7, 1.0, 1.3]),
            seeds=torch.tensor([3, -5, 2**40, 11]),
            offsets=torch.tensor([0, 17, 4, 9]),
        )
    if mode == "filters":
        a.update(top_k=i32([0, 3, 5, 0]), top_p=torch.tensor([1.0, 0.9, 0.8, 0.95]))
        a.update(min_p=torch.tensor([0.0, 0.05, 0.0, 0.1]))
    if mode == "probs":
        a["draft_probs"] = torch.softmax(torch.randn(N, V, generator=g), -1)
    return a


def _rejection_public(a: dict) -> tuple:
    out = ops.rejection_sample(
        a["target_logits"], a["draft_token_ids"], a["cu_num_draft_tokens"],
        num_speculative_tokens=a["num_speculative_tokens"], draft_probs=a["draft_probs"],
        temperature=a["temperature"], top_k=a["top_k"], top_p=a["top_p"], min_p=a["min_p"],
        seeds=a["seeds"], offsets=a["offsets"], return_logprobs=a["return_logprobs"],
    )  # fmt: skip
    return tuple(out) if a["return_logprobs"] else tuple(out[:2])


# ----------------------------------------------------------------------------- logprobs


def _logprobs_args(mode: str) -> dict:
    g = torch.Generator().manual_seed(7)
    B, k, V = 4, 3, 13
    cu = i32([0, 3, 3, 4, 6])
    logits = torch.randn(6 + B + 1, V, generator=g).mul(2).round()  # ties; one row past
    logits[2, :] = float("-inf")  # a row without a finite maximum
    logits[4, 5] = float("nan")
    out = torch.randint(0, V, (B, k + 1), generator=g, dtype=I32)
    emitted = i32([4, 1, 2, 0])
    out[torch.arange(k + 1)[None, :] >= emitted[:, None]] = -1
    a = dict(
        target_logits=logits.to(torch.bfloat16) if mode.endswith("_logits") else logits,
        output_token_ids=out, num_emitted=emitted, cu_num_draft_tokens=cu, num_logprobs=5,
        logprobs_mode=mode,
    )  # fmt: skip
    a.update(temperature=None, top_k=None, top_p=None, min_p=None)
    if mode.startswith("processed"):  # sampled requests with filters, and a greedy one
        a.update(temperature=torch.tensor([0.7, 0.0, 1.3, 0.9]), top_k=i32([4, 0, 0, 9]),
                 top_p=torch.tensor([1.0, 0.6, 0.8, 0.5]),
                 min_p=torch.tensor([0.0, 0.0, 0.1, 0.0]))  # fmt: skip
    return a


def _logprobs_public(a: dict) -> tuple:
    return tuple(
        ops.top_logprobs(
            a["target_logits"],
            a["output_token_ids"],
            a["num_emitted"],
            a["cu_num_draft_tokens"],
            num_logprobs=a["num_logprobs"],
            logprobs_mode=a["logprobs_mode"],
            **{n: a[n] for n in ("temperature", "top_k", "top_p", "min_p")},
        )  # fmt: skip
    )


# ----------------------------------------------------------------------------- processing


def _processing_args(mode: str) -> dict:
    g = torch.Generator().manual_seed(len(mode))
    B, V, R, L = 4, 37, 5, 12
    cu = i32([0, 2, 2, 5, 6])
    logits = torch.randn(6 + B + 1, V, generator=g) * 3  # one row past the batch
    token_ids = torch.randint(0, 6, (R, L), generator=g, dtype=I32)
    a = dict(
        target_logits=logits.to(torch.bfloat16) if mode == "bare" else logits,
        draft_token_ids=torch.randint(0, 6, (7,), generator=g, dtype=I32),
        cu_num_draft_tokens=cu, token_ids=token_ids, num_tokens=i32([9, 12, 4, 7, 1]),
        num_prompt_tokens=i32([3, 5, 4, 2, 0]), req_indices=i32([3, -1, 0, 1]),
        repetition_penalty=None, frequency_penalty=None, presence_penalty=None,
        logit_bias_ids=None, logit_bias_values=None, allowed_token_mask=None, grammar_mask=None,
        bad_word_ids=None, min_tokens=None, stop_token_ids=None,
    )  # fmt: skip
    if mode == "penalties":
        a.update(
            repetition_penalty=torch.tensor([1.5, 1.0, 0.8, 1.0]),
            frequency_penalty=torch.tensor([0.5, 0.0, -0.25, 0.0]),
            presence_penalty=torch.tensor([0.0, 0.3, 1.0, 0.0]),
            logit_bias_ids=i32([[1, 1, -1], [2, 3, 4], [36, -1, -1], [0, 5, -1]]),
            logit_bias_values=torch.randn(B, 3, generator=g),
        )
    if mode == "masks":
        W = (V + 31) // 32
        words = torch.randint(0, 6, (B, 3, 3), generator=g, dtype=I32)
        words[:, 0, 1:] = -1  # one-token words: always banned
        words[:, 1, 2] = -1
        a.update(
            allowed_token_mask=torch.randint(-(2**31), 2**31 - 1, (B, W), generator=g, dtype=I32),
            grammar_mask=torch.randint(-(2**31), 2**31 - 1, (11, W), generator=g, dtype=I32),
            bad_word_ids=words, min_tokens=i32([8, 0, 3, 2]),
            stop_token_ids=i32([[1, -1], [2, 3], [4, 5], [0, 36]]),
        )  # fmt: skip
    return a


def _processing_public(a: dict) -> tuple:
    rest = {k: v for k, v in a.items() if k not in ("target_logits", "draft_token_ids",
            "cu_num_draft_tokens", "token_ids", "num_tokens", "num_prompt_tokens")}  # fmt: skip
    return (
        ops.process_logits(
            a["target_logits"], a["draft_token_ids"], a["cu_num_draft_tokens"], a["token_ids"],
            a["num_tokens"], a["num_prompt_tokens"], **rest,
        ),
    )  # fmt: skip


# ----------------------------------------------------------------------------- verify inputs

VERIFY_ROWS = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11, 12, 13, 14]]


def _slot_args(*, paged: bool) -> dict:
    return dict(
        block_table=i32([[3, 4, -1], [6, 7, 8], [1, 0, 2]]) if paged else None,
        positions=torch.tensor([6, 3, 0, 9, 11, 2, 7]),
        query_start_loc=i32([0, 2, 2, 6]),
        req_indices=i32([2, -1, 0]) if paged else None,
        block_size=4 if paged else 1,
        max_model_len=10 if paged else 12,
    )


def _slot_public(a: dict) -> tuple:
    bs = a["block_size"] if a["block_table"] is not None else None
    return (
        ops.compute_slot_mapping(
            a["block_table"], a["positions"], a["query_start_loc"], a["req_indices"],
            block_size=bs, max_model_len=a["max_model_len"],
        ),
    )  # fmt: skip


def _verify_args(*, paged: bool) -> dict:
    tok, nt = history(VERIFY_ROWS, 16)
    return dict(
        token_ids=tok,
        num_tokens=nt,
        draft_token_ids=i32([[1, 2, -1], [-1, -1, -1], [5, 6, 7], [3, -1, -1]]),
        num_draft_tokens=i32([2, 0, 3, 1]),
        block_table=i32([[3, 4, 5, 6], [0, 1, 2, 7], [8, 9, 10, 11]]) if paged else None,
        req_indices=i32([2, -1, 0, 1]),
        block_size=4 if paged else 1,
        max_model_len=16,
    )


def _verify_public(a: dict) -> tuple:
    bs = a["block_size"] if a["block_table"] is not None else None
    return tuple(
        ops.prepare_verify_inputs(
            a["token_ids"], a["num_tokens"], a["draft_token_ids"], a["num_draft_tokens"],
            a["block_table"], a["req_indices"], block_size=bs, max_model_len=a["max_model_len"],
        )
    )  # fmt: skip


# ----------------------------------------------------------------------------- commit


def _commit_args(*, full: bool) -> dict:
    tok, nt = history([[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11]], 8)
    out = i32([[20, 21, 22, -1], [2, 30, 31, 32], [40, 41, 42, 43], [50, -1, -1, -1]])
    a = dict(
        token_ids=tok, num_tokens=nt, output_token_ids=out, num_emitted=i32([3, 4, 4, 1]),
        req_indices=i32([1, 0, -1, 3]), stop_token_ids=None, num_prompt_tokens=None,
        min_tokens=None, max_tokens=None, num_computed_tokens=None, max_model_len=8,
    )  # fmt: skip
    if full:
        a.update(
            stop_token_ids=i32([[31, -1], [21, 99], [-1, -1], [50, -1]]),
            num_prompt_tokens=i32([2, 4, 1, 2]),
            min_tokens=i32([0, 3, 0, 1]),
            max_tokens=i32([3, 5, 2, 6]),
            num_computed_tokens=nt - 1,
        )
    return a


def _commit_public(a: dict) -> tuple:
    return tuple(
        ops.commit_accepted_tokens(
            a["token_ids"], a["num_tokens"], a["output_token_ids"], a["num_emitted"],
            a["req_indices"], stop_token_ids=a["stop_token_ids"],
            num_prompt_tokens=a["num_prompt_tokens"], min_tokens=a["min_tokens"],
            max_tokens=a["max_tokens"], max_model_len=a["max_model_len"],
            num_computed_tokens=a["num_computed_tokens"],
        )
    )  # fmt: skip


# ----------------------------------------------------------------------------- draft plan


def _plan_args(*, capped: bool) -> dict:
    g = torch.Generator().manual_seed(7)
    return dict(
        num_draft_tokens=i32([4, 0, 2, 3, 4]),
        match_len=i32([3, 0, 1, 2, 5]),
        verify_cost=1.0 + 0.08 * torch.arange(26, dtype=torch.float32),
        req_indices=i32([5, 0, -1, 2, 3]),
        acceptance=torch.rand((6, 3, 4), generator=g),
        max_num_tokens=9 if capped else None,
    )


def _plan_public(a: dict) -> tuple:
    return tuple(
        ops.plan_draft_lengths(
            a["num_draft_tokens"], a["match_len"], a["verify_cost"], a["req_indices"],
            acceptance=a["acceptance"], max_num_tokens=a["max_num_tokens"],
        )
    )  # fmt: skip


def _update_args() -> dict:
    g = torch.Generator().manual_seed(9)
    return dict(
        draft_token_ids=i32([[1, 2, 3, 4], [5, -1, -1, -1], [1, 1, -1, -1], [7, 8, 9, -1]]),
        num_draft_tokens=i32([4, 1, 2, 3]),
        match_len=i32([3, 1, 0, 2]),
        output_token_ids=i32([[1, 2, 0, 0, 0], [6, 0, 0, 0, 0], [1, 1, 1, 0, 0], [7, 8, 9, 3, 0]]),
        num_emitted=i32([3, 1, 3, 4]),
        req_indices=i32([4, -1, 0, 2]),
        acceptance=torch.rand((5, 3, 4), generator=g),
        decay=0.8,
    )


def _update_public(a: dict) -> tuple:
    ops.update_acceptance_stats(
        a["draft_token_ids"], a["num_draft_tokens"], a["match_len"], a["output_token_ids"],
        a["num_emitted"], a["req_indices"], acceptance=a["acceptance"], decay=a["decay"],
    )  # fmt: skip
    return ()


# ----------------------------------------------------------------------------- the registry


def _ngram_case(id_, **kw):
    return OpCase("ngram_propose", id_, lambda: _ngram_args(**kw), _ngram_public)


CASES: list[OpCase] = [
    _ngram_case("scan", index=False, corpus=False, tie="first", batch=True),
    _ngram_case("scan-last", index=False, corpus=False, tie="last", batch=False),
    _ngram_case("index", index=True, corpus=False, tie="last", batch=True),
    _ngram_case("corpus", index=False, corpus=True, tie="first", batch=True),
    _ngram_case("index-corpus", index=True, corpus=True, tie="first", batch=False),
    OpCase(
        "ngram_index_build",
        "padding",
        lambda: _index_args(extend=False),
        _index_public(ops.ngram_index_build),
        ("index",),
        {"index": index_entries},
    ),  # fmt: skip
    OpCase(
        "ngram_index_extend",
        "after-build",
        lambda: _index_args(extend=True),
        _index_public(ops.ngram_index_extend),
        ("index",),
        {"index": index_entries},
    ),  # fmt: skip
    OpCase("frequency_propose", "batch", lambda: _frequency_args(batch=True), _frequency_public),
    OpCase("frequency_propose", "plain", lambda: _frequency_args(batch=False), _frequency_public),
    OpCase(
        "frequency_propose",
        "no-corpus",
        lambda: {**_frequency_args(batch=True), "corpus": None},
        _frequency_public,
    ),  # fmt: skip
    *(
        OpCase(
            "frequency_corpus_append",
            name,
            lambda c=c, req=req, m=m: _frequency_corpus_args(capacity=c, req=req, nodes=m),
            _frequency_corpus_public,
            ("corpus",),
        )  # fmt: skip
        for name, c, req, m in (
            ("rebuilds", 24, None, None),
            ("padding", 64, i32([2, -1, 0]), None),
            ("short-of-nodes", 256, None, 48),
        )  # fmt: skip
    ),
    *(
        OpCase(
            f"frequency_index_{fn}",
            "after-half" if fn == "extend" else "padding",
            lambda fn=fn: _frequency_index_args(extend=fn == "extend"),
            _frequency_index_public(getattr(ops, f"ngram_index_{fn}")),
            ("index",),
        )  # fmt: skip
        for fn in ("build", "extend")
    ),
    OpCase(
        "corpus_append",
        "evicts",
        lambda: _corpus_args(capacity=20, req=None),
        _corpus_public,
        ("corpus",),
        {"corpus": corpus_live},
    ),  # fmt: skip
    OpCase(
        "corpus_append",
        "order",
        lambda: _corpus_args(capacity=64, req=i32([2, -1, 0])),
        _corpus_public,
        ("corpus",),
        {"corpus": corpus_live},
    ),  # fmt: skip
    *(
        OpCase("rejection_sample", m, lambda m=m: _rejection_args(m), _rejection_public)
        for m in ("greedy", "sampled", "filters", "probs")
    ),
    *(
        OpCase("top_logprobs", m, lambda m=m: _logprobs_args(m), _logprobs_public)
        for m in ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
    ),
    *(
        OpCase("process_logits", m, lambda m=m: _processing_args(m), _processing_public)
        for m in ("bare", "penalties", "masks")
    ),
    OpCase("compute_slot_mapping", "paged", lambda: _slot_args(paged=True), _slot_public),
    OpCase("compute_slot_mapping", "contiguous", lambda: _slot_args(paged=False), _slot_public),
    OpCase("prepare_verify_inputs", "paged", lambda: _verify_args(paged=True), _verify_public),
    OpCase(
        "prepare_verify_inputs", "contiguous", lambda: _verify_args(paged=False), _verify_public
    ),
    *(
        OpCase(
            "commit_accepted_tokens",
            "full" if full else "bare",
            lambda full=full: _commit_args(full=full),
            _commit_public,
            ("token_ids", "num_tokens") + (("num_computed_tokens",) if full else ()),
        )  # fmt: skip
        for full in (True, False)
    ),
    OpCase("plan_draft_lengths", "capped", lambda: _plan_args(capped=True), _plan_public),
    OpCase("plan_draft_lengths", "uncapped", lambda: _plan_args(capped=False), _plan_public),
    OpCase("update_acceptance_stats", "classes", _update_args, _update_public, ("acceptance",)),
]
