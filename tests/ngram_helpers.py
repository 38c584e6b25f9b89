"""Helpers shared by the n-gram family's tests (test_ngram, test_ngram_index, test_corpus).

:class:`State` drives one implementation (reference, CPU path or Triton launchers) of the
three families through their raw functions, with the schema's arguments: an own-history
index and a corpus as the lists of tensors the ops take.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from specdec_kernels.cpu import corpus as cpu_corpus
from specdec_kernels.cpu import ngram as cpu_ngram
from specdec_kernels.cpu import ngram_index as cpu_ix
from specdec_kernels.kernels import corpus as triton_corpus
from specdec_kernels.kernels import ngram as triton_ngram
from specdec_kernels.kernels import ngram_index as triton_ix
from specdec_kernels.ops import new_corpus, new_ngram_index, ngram_propose
from specdec_kernels.reference import corpus as ref_corpus
from specdec_kernels.reference import ngram as ref_ngram
from specdec_kernels.reference import ngram_index as ref_ix

IMPLS = {
    "reference": (ref_ix, ref_corpus, ref_ngram),
    "cpu": (cpu_ix, cpu_corpus, cpu_ngram),
    "triton": (triton_ix, triton_corpus, triton_ngram),
}
RAW = list(IMPLS)


def history(rows: list[list[int]], width: int | None = None):
    """``token_ids [R, width]`` with ``rows`` (poison past each length) and the lengths."""
    width = width or max(1, max((len(r) for r in rows), default=1))
    token_ids = torch.full((len(rows), width), 99999, dtype=torch.int32)
    for i, r in enumerate(rows):
        token_ids[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
    return token_ids, torch.tensor([len(r) for r in rows], dtype=torch.int32)


def device_of(impl, device):
    if impl == "triton" and device is None and torch.cuda.is_available():
        return torch.device("cuda")
    return device if impl == "triton" and device is not None else torch.device("cpu")


def _to(x, device):
    return None if x is None else x.to(device)


def drafts_of(out, b=0):
    """Batch row ``b``'s drafts (and a check that the slots past its count hold -1)."""
    drafts, counts = out[0], out[1]
    n = int(counts[b])
    assert (drafts[b, n:] == -1).all(), "slots past num_draft_tokens must hold -1"
    return drafts[b, :n].tolist()


class State:
    """One implementation's own-history index and corpus, driven through the raw functions."""

    def __init__(self, impl, R, width, *, min_n, max_n, C=16, H=None, slots=None, device=None):
        self.impl = impl
        self.ix, self.cor, self.ng = IMPLS[impl]
        self.dev = device_of(impl, device)
        self.min_n, self.max_n = min_n, max_n
        ix = new_ngram_index(R, width, min_n=min_n, max_n=max_n, slots=slots, device=self.dev)
        self.table, self.length = ix.table, ix.length
        c = new_corpus(C, min_n=min_n, max_n=max_n, index_slots=H, device=self.dev)
        self.corpus = [c.tokens, c.meta, c.index, c.state]

    @property
    def nk(self):
        return {"min_n": self.min_n, "max_n": self.max_n}

    def build(self, tok, nt, req=None):
        self.ix.ngram_index_build(
            _to(tok, self.dev), _to(nt, self.dev), _to(req, self.dev), [self.table, self.length],
            **self.nk,
        )  # fmt: skip

    def extend(self, tok, nt, req=None):
        self.ix.ngram_index_extend(
            _to(tok, self.dev), _to(nt, self.dev), _to(req, self.dev), [self.table, self.length],
            **self.nk,
        )  # fmt: skip

    def append(self, docs, lens, req=None):
        self.cor.corpus_append(
            _to(docs, self.dev), _to(lens, self.dev), _to(req, self.dev), self.corpus, **self.nk
        )

    def propose(
        self, tok, nt, req=None, cap=None, *, k, corpus=True, index=True, mml=None, tie="first"
    ):
        out = self.ng.ngram_propose(
            _to(tok, self.dev), _to(nt, self.dev), _to(req, self.dev), _to(cap, self.dev),
            [self.table, self.length] if index else None, self.corpus if corpus else None,
            num_speculative_tokens=k, max_model_len=mml, tie_break=tie, **self.nk,
        )  # fmt: skip
        return tuple(o.cpu() for o in out)

    def content(self):
        """The index as a set: (row, n index, first, last) of every occupied slot."""
        t = self.table.cpu()
        occ = (t[..., 0] >= 0).nonzero()
        return sorted(
            (int(r), int(j), int(t[r, j, s, 0]), int(t[r, j, s, 1])) for r, j, s in occ.tolist()
        )

    def corpus_live(self):
        """Ring contents of the live window, tables and state (comparable across paths)."""
        tokens, meta, index, state = (x.cpu() for x in self.corpus)
        end, lo = state.tolist()
        C = tokens.shape[0]
        slots = [p % C for p in range(lo, end)]
        return tokens[slots].tolist(), meta[slots].tolist(), index, state


def full_scan(tok, nt, req=None, cap=None, *, min_n, max_n, k, mml=None, tie="first"):
    """``ngram_propose`` without index or corpus: the definition the index must meet."""
    out = ngram_propose(
        tok, nt, req, min_n=min_n, max_n=max_n, num_speculative_tokens=k, max_model_len=mml,
        max_draft_tokens=cap, tie_break=tie,
    )  # fmt: skip
    return tuple(out)


# ----------------------------------------------------------------------------- schedules


@st.composite
def schedules(draw, max_steps=6):
    """Admissions (a new request takes a row), commits and documents, in random order."""
    vocab = draw(st.integers(1, 4))
    R = draw(st.integers(1, 4))
    width = draw(st.integers(1, 24))
    min_n = draw(st.integers(1, 3))
    max_n = draw(st.integers(min_n, 5))
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(st.sampled_from(["admit", "commit", "commit", "doc"]))
        rows = draw(st.lists(st.integers(0, R - 1), min_size=1, max_size=R, unique=True))
        if draw(st.booleans()):
            rows = rows + [-1]
        toks = [draw(st.lists(st.integers(0, vocab - 1), max_size=width)) for _ in rows]
        k = draw(st.integers(0, 6))
        tie = draw(st.sampled_from(["first", "last"]))
        mml = draw(st.one_of(st.none(), st.integers(1, width + 6)))
        caps = draw(st.one_of(st.none(), st.lists(st.integers(0, 7), min_size=R, max_size=R)))
        steps.append((kind, rows, toks, k, tie, mml, caps))
    return vocab, R, width, min_n, max_n, steps


def replay(impl, case, device, *, with_corpus, with_index=True):
    """Run a schedule; after every step propose for all rows (random caps, padding).

    Returns the proposals and, without a corpus, the full scan's for the same histories.
    """
    _, R, width, min_n, max_n, steps = case
    s = State(impl, R, width, min_n=min_n, max_n=max_n, C=13, H=17, device=device)
    tok = torch.zeros((R, width), dtype=torch.int32)
    nt = torch.zeros((R,), dtype=torch.int32)
    s.build(tok, nt)
    got, want = [], []
    for kind, rows, toks, k, tie, mml, caps in steps:
        req = torch.tensor(rows, dtype=torch.int32)
        if kind == "doc":
            s.append(*history(toks, width))
        for r, new in zip(rows, toks, strict=True):
            if r < 0:
                continue
            if kind == "admit":  # a new request takes the row
                nt[r] = min(len(new), width)
                tok[r, : nt[r]] = torch.tensor(new[: nt[r]], dtype=torch.int32)
            elif kind == "commit":  # append (what commit_accepted_tokens does)
                m = min(len(new), width - int(nt[r]))
                tok[r, nt[r] : nt[r] + m] = torch.tensor(new[:m], dtype=torch.int32)
                nt[r] += m
        if kind == "admit":
            s.build(tok, nt, req)
        elif kind == "commit":
            s.extend(tok, nt, req)
        preq = torch.cat([torch.arange(R, dtype=torch.int32).flip(0), torch.tensor([-1]).int()])
        cap = None
        if caps is not None:
            cap = torch.tensor([*caps[::-1], 3], dtype=torch.int32)
        got.append(
            s.propose(
                tok, nt, preq, cap, k=k, mml=mml, tie=tie, corpus=with_corpus, index=with_index
            )
        )
        if not with_corpus:
            kw = dict(min_n=min_n, max_n=max_n, k=k, mml=mml, tie=tie)
            want.append(full_scan(tok, nt, preq, cap, **kw))
    return got, want
