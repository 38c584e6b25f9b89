"""Frequency-scored drafting (family ``frequency``): ``ngram_propose(scoring="frequency")``
and its index against the brute-force reference, on named and random histories; the trie
shared across paths and independent of how commits are chunked; bounds; errors.

The registration tiers (opcheck, compile, fakes, poisoned outputs) are
tests/test_conformance.py's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specdec_kernels import ops
from specdec_kernels.constants import FREQUENCY_MAX_DEPTH
from specdec_kernels.kernels import frequency as _triton
from specdec_kernels.reference import frequency as _ref
from tests.ngram_helpers import history

I32 = torch.int32
PARAMS = ("min_token_prob", "max_spec_factor", "max_spec_offset")


def _index(tok, nt, D, *, min_n=1, device=None):
    """A frequency index built from ``tok`` / ``nt``, on ``device`` (default: ``tok``'s)."""
    device = tok.device if device is None else device
    index = ops.new_ngram_index(tok.shape[0], tok.shape[1], min_n=min_n, max_n=D,
                                scoring="frequency", device=device)  # fmt: skip
    ops.ngram_index_build(tok.to(index.keys.device), nt.to(index.keys.device), index=index)
    return index


def _propose(impl, tok, nt, index, *, k, req=None, caps=None, max_model_len=None, corpus=None,
             **params):  # fmt: skip
    """One path's proposal as CPU lists: drafts, counts, match_len, source, probs."""
    params = {"min_token_prob": 0.1, "max_spec_factor": 1.0, "max_spec_offset": 0.0, **params}
    kw = dict(min_n=index.min_n, max_n=index.max_n, num_speculative_tokens=k,
              max_model_len=max_model_len, **params)  # fmt: skip
    if impl == "ops":
        out = ops.ngram_propose(tok, nt, req, max_draft_tokens=caps, index=index, corpus=corpus,
                                scoring="frequency", **kw)  # fmt: skip
    else:
        dev = index.keys.device
        on = [None if t is None else t.to(dev) for t in (tok, nt, req, caps)]
        fn = _ref.frequency_propose if impl == "reference" else _triton.frequency_propose
        c = None if corpus is None else [t.to(dev) for t in corpus[:7]]
        out = fn(*on, list(index[:5]), c, **kw)
    return [t.cpu().tolist() for t in out]


# ----------------------------------------------------------------------------- named cases

NAMED = [
    # (history, D, k, params, drafts, match_len, probs)
    ([1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2], 6, 3, {}, [4, 1, 2], 3, [0.5, 0.5, 0.5]),
    # two drafts: "1 2" -> 3 1 (the tail counts in count("1 2") = 4), "3 1 2" -> 4 1 and
    # "2 3 1 2" -> 4 1 all score 0.5 + 0.5: the longest match wins
    ([1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2], 6, 2, {}, [4, 1], 4, [0.5, 0.5]),
    # min_n = 1 context "2" (count 4) -> 3 (2 of 4), then "2 3" -> 1 (2 of 2): D = 3 caps
    # "1 2" at one draft, and the one-token context ties it at 0.5: the longer wins
    ([1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2], 3, 2, {}, [3], 2, [0.5]),
    # a tie of counts goes to the latest occurrence ("9" went on with 1, 2, 1, 2)
    ([9, 1, 9, 2, 9, 1, 9, 2, 9], 2, 1, {}, [2], 1, [0.4]),
    # below min_token_prob the chain stops: 0.4 < 0.5
    ([9, 1, 9, 2, 9, 1, 9, 2, 9], 2, 1, {"min_token_prob": 0.5}, [], 0, []),
    # max_spec_factor * m + offset caps the length: floor(0.5 * 3) = 1 draft for "3 1 2",
    # floor(0.5 * 4) = 2 for "2 3 1 2", which wins; factor 0 and offset 1.5: one draft for
    # every m, all at 0.5: the longest context with a continuation (m = 5) wins
    ([1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2], 6, 3, {"max_spec_factor": 0.5}, [4, 1], 4, [0.5, 0.5]),
    (
        [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2],
        6,
        3,
        {"max_spec_factor": 0.0, "max_spec_offset": 1.5},
        [4],
        5,
        [0.5],
    ),
    # one repeated token: m = 1 may draft 1 (7/8), m = 2 two (6/7 + 5/7: the best), m = 3
    # only one (m + t <= D = 4)
    ([5] * 8, 4, 4, {}, [5, 5], 2, [6 / 7, 5 / 7]),
    ([6, 7, 8], 4, 2, {}, [], 0, []),  # nothing repeats
    ([], 4, 2, {}, [], 0, []),
]


@pytest.mark.parametrize("impl", ["reference", "ops", "triton"])
@pytest.mark.parametrize("case", NAMED, ids=[str(i) for i in range(len(NAMED))])
def test_named_histories(impl, case, kernel_device):
    seq, D, k, params, drafts, m, probs = case
    tok, nt = history([seq], width=max(len(seq), 1) + 2)
    index = _index(tok, nt, D, device=kernel_device if impl == "triton" else None)
    if impl == "triton":  # the index built by the kernels too
        index = _index(tok.to(kernel_device), nt.to(kernel_device), D)
    d, c, ml, src, p = _propose(impl, tok, nt, index, k=k, **params)
    assert d[0][: c[0]] == drafts and all(x == -1 for x in d[0][c[0] :])
    assert ml[0] == m and src[0] == (1 if drafts else 0)
    assert p[0][: c[0]] == pytest.approx(probs, abs=1e-7) and p[0][c[0] :] == [0.0] * (k - c[0])


# ----------------------------------------------------------------------------- random cases


@st.composite
def _cases(draw):
    R = draw(st.integers(1, 4))
    W = draw(st.integers(1, 30))
    V = draw(st.integers(1, 4))
    rows = [draw(st.lists(st.integers(0, V - 1), max_size=W)) for _ in range(R)]
    D = draw(st.integers(2, 10))
    return dict(
        rows=rows, W=W, D=D, min_n=draw(st.integers(1, min(D - 1, 3))),
        k=draw(st.integers(0, 6)),
        params=dict(min_token_prob=draw(st.sampled_from([0.0, 0.1, 0.34, 1.0])),
                    max_spec_factor=draw(st.sampled_from([0.0, 0.5, 1.0, 4.0, math.inf])),
                    max_spec_offset=draw(st.sampled_from([0.0, 1.0, 2.5]))),
        caps=draw(st.booleans()), mml=draw(st.sampled_from([None, W, W + 3])),
    )  # fmt: skip


def _random_batch(case):
    tok, nt = history(case["rows"], width=case["W"])
    R = tok.shape[0]
    req = torch.tensor([R - 1 - i for i in range(R)] + [-1], dtype=I32)
    caps = torch.tensor([(3 * i) % 5 for i in range(R + 1)], dtype=I32) if case["caps"] else None
    return tok, nt, req, caps


@given(_cases())
def test_cpu_equals_the_reference_on_random_histories(case):
    tok, nt, req, caps = _random_batch(case)
    index = _index(tok, nt // 2, case["D"], min_n=case["min_n"])
    ops.ngram_index_extend(tok, nt, index=index)  # the rest as commits
    fresh = ops.new_ngram_index(*tok.shape, min_n=case["min_n"], max_n=case["D"],
                                scoring="frequency")  # fmt: skip
    state = [t.clone() for t in fresh[:5]]
    _ref.frequency_index_build(tok, nt // 2, None, state, min_n=case["min_n"], max_n=case["D"])
    _ref.frequency_index_extend(tok, nt, None, state, min_n=case["min_n"], max_n=case["D"])
    assert all(torch.equal(a, b) for a, b in zip(state, index[:5], strict=True))
    kw = dict(k=case["k"], req=req, caps=caps, max_model_len=case["mml"], **case["params"])
    assert _propose("ops", tok, nt, index, **kw) == _propose("reference", tok, nt, index, **kw)


@pytest.mark.parametrize("seed", range(6))
def test_triton_equals_the_cpu_bit_for_bit(seed, kernel_device):
    rng = np.random.default_rng(seed)
    W = int(rng.integers(8, 40))
    full = torch.tensor(rng.integers(0, 1 + seed % 3 + 1, (3, W + 2)), dtype=I32)
    tok = full[:, 1 : W + 1]  # strided rows
    nt = torch.tensor(rng.integers(0, W + 1, 3), dtype=I32)
    D, req = int(rng.integers(2, 12)), torch.tensor([2, -1, 0, 1], dtype=I32)
    cpu = _index(tok, nt // 3, D)
    ops.ngram_index_extend(tok, nt, index=cpu)
    dev = ops.new_ngram_index(3, W, min_n=1, max_n=D, scoring="frequency", device=kernel_device)
    g_tok, g_nt = tok.to(kernel_device), nt.to(kernel_device)
    ops.ngram_index_build(g_tok, g_nt // 3, req.to(kernel_device), index=dev)
    ops.ngram_index_extend(g_tok, g_nt, index=dev)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(dev[:5], cpu[:5], strict=True))
    kw = dict(k=int(rng.integers(1, 7)), req=req, max_model_len=W + 1, min_token_prob=0.05,
              max_spec_factor=2.0)  # fmt: skip
    assert _propose("triton", tok, nt, dev, **kw) == _propose("ops", tok, nt, cpu, **kw)


def test_the_trie_does_not_depend_on_how_commits_are_chunked():
    rng = np.random.default_rng(7)
    tok = torch.tensor(rng.integers(0, 3, (1, 60)), dtype=I32)
    whole = _index(tok, torch.tensor([60], dtype=I32), 9)
    steps = _index(tok, torch.tensor([0], dtype=I32), 9)
    n = 0
    while n < 60:
        n = min(60, n + int(rng.integers(1, 6)))
        ops.ngram_index_extend(tok, torch.tensor([n], dtype=I32), index=steps)
    assert all(torch.equal(a, b) for a, b in zip(whole[:5], steps[:5], strict=True))


def test_at_most_two_nodes_a_position_on_the_worst_histories():
    for seq in ([4] * 50, list(range(50)), [1, 2] * 25, [1, 1, 2] * 17):
        tok, nt = history([seq[:50]], width=50)
        index = _index(tok, nt, 50)
        assert int(index.num_nodes[0]) <= 2 * int(nt[0]) + 1 <= index.nodes.shape[2]


def test_drafts_equal_the_brute_force_of_the_design_prototype():
    """An older, independent oracle (tests/test_suffix_replay.py's) on own histories."""
    from tests.test_suffix_replay import _brute_force

    rng = np.random.default_rng(11)
    for _ in range(40):
        seq = rng.integers(0, 3, int(rng.integers(1, 40))).tolist()
        D, k = int(rng.integers(2, 10)), int(rng.integers(1, 6))
        tok, nt = history([seq], width=len(seq))
        d, c, *_ = _propose("ops", tok, nt, _index(tok, nt, D), k=k, min_token_prob=0.1)
        assert d[0][: c[0]] == _brute_force([], seq, D, k, 1.0, 0.1)


# ----------------------------------------------------------------------------- robustness


def test_unchecked_garbage_state_neither_hangs_nor_reads_outside_its_arrays():
    tok, nt = history([[1, 2, 1, 2, 1, 2, 1]], width=8)
    for fill in (0, 3, -5, 10**6):
        index = ops.new_ngram_index(1, 8, min_n=1, max_n=4, scoring="frequency")
        for t in index[:4]:
            t.fill_(fill)
        ops.ngram_index_extend(tok, nt, index=index, validate=False)
        out = ops.ngram_propose(tok, nt, min_n=1, max_n=4, num_speculative_tokens=3, index=index,
                                scoring="frequency", validate=False)  # fmt: skip
        assert out.draft_token_ids.shape == (1, 3)


@pytest.mark.parametrize("impl", ["ops", "triton"])
def test_a_corrupt_node_count_or_depth_stays_inside_the_arrays(impl, kernel_device):
    # found by review: a node count past M, and a negative depth whose path entry the
    # update walk then read unfilled (validate=False; the default checks do not read them)
    dev = kernel_device if impl == "triton" else torch.device("cpu")
    tok, nt = (t.to(dev) for t in history([[1, 2, 1, 2, 1]], width=5))
    index = _index(tok, nt, 4)
    index.num_nodes[0] = 2**31 - 1
    index.nodes[0, 3, 1:] = 10**8
    d, c, *_ = _propose(impl, tok, nt, index, k=3)
    assert len(d[0]) == 3
    tok, nt = (t.to(dev) for t in history([[2, 2, 2, 2]], width=4))
    index = _index(tok, nt - 1, 7)
    index.nodes[0, 1, 1:3] = -(10**6)
    if impl == "ops":
        ops.ngram_index_extend(tok, nt, index=index, validate=False)
    else:
        _triton.frequency_index_extend(tok, nt, None, list(index[:5]), min_n=1, max_n=7)
    assert int(index.length[0]) == 4


def test_k_zero_padding_rows_and_caps():
    tok, nt = history([[1, 2, 1, 2, 1], [3, 3, 3]], width=6)
    index = _index(tok, nt, 5)
    d, c, ml, src, p = _propose("ops", tok, nt, index, k=0, req=torch.tensor([1, -1], dtype=I32))
    assert d == [[], []] and c == [0, 0] and p == [[], []]
    caps = torch.tensor([0, 1], dtype=I32)
    d, c, ml, src, p = _propose("ops", tok, nt, index, k=3, caps=caps)
    assert c == [0, 1] and d[1] == [3, -1, -1] and src == [0, 1]


# ----------------------------------------------------------------------------- errors


def _call(**over):
    tok, nt = history([[1, 2, 1, 2, 1]], width=6)
    index = _index(tok, nt, 4)
    kw = dict(min_n=1, max_n=4, num_speculative_tokens=2, index=index, scoring="frequency")
    kw.update(over)
    return ops.ngram_propose(tok, nt, **kw)


@pytest.mark.parametrize(
    "over, match",
    [
        (dict(min_token_prob=-0.1), r"min_token_prob must be a real number in \[0, 1\]"),
        (dict(min_token_prob=1.5), r"min_token_prob must be a real number in \[0, 1\]"),
        (dict(min_token_prob=float("nan")), r"min_token_prob must be a real number in \[0, 1\]"),
        (dict(max_spec_factor=-1.0), "max_spec_factor must be a real number >= 0"),
        (dict(max_spec_offset=-0.5), "max_spec_offset must be a real number >= 0"),
        (dict(scoring="longest"), "a FrequencyIndex or FrequencyCorpus serves scoring"),
        (dict(scoring="best"), "scoring must be one of"),
        (dict(index=None), "needs index=new_ngram_index"),
        (dict(max_n=5), "index was made for n in"),
        (dict(corpus=ops.new_corpus(8, min_n=1, max_n=4)), "drafts from a FrequencyCorpus"),
        (
            dict(corpus=ops.new_corpus(24, min_n=1, max_n=5, scoring="frequency")),
            "corpus was made for n in",
        ),
    ],
)
def test_bad_proposal_arguments_raise(over, match):
    with pytest.raises(ValueError, match=match):
        _call(**over)


def test_frequency_arguments_with_longest_scoring_raise():
    tok, nt = history([[1, 2, 1]], width=4)
    with pytest.raises(ValueError, match='min_token_prob apply to scoring="frequency" only'):
        ops.ngram_propose(tok, nt, min_n=1, max_n=2, num_speculative_tokens=2,
                          min_token_prob=0.2)  # fmt: skip
    index = ops.new_ngram_index(1, 4, min_n=1, max_n=2)
    with pytest.raises(ValueError, match="needs index=new_ngram_index"):
        ops.ngram_propose(tok, nt, min_n=1, max_n=2, num_speculative_tokens=2, index=index,
                          scoring="frequency")  # fmt: skip


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(max_n=FREQUENCY_MAX_DEPTH + 1), "must be <= 1024"),
        (dict(slots=100), "a power of two >= 2 \\* max_model_len \\+ 1"),
        (dict(slots=16), "a power of two >= 2 \\* max_model_len \\+ 1"),
        (dict(scoring="often"), "scoring must be one of"),
        (dict(max_n=0), "max_n"),
    ],
)
def test_bad_constructor_arguments(kw, match):
    args = {"min_n": 1, "max_n": 4, "scoring": "frequency", **kw}
    with pytest.raises(ValueError, match=match):
        ops.new_ngram_index(2, 10, **args)


def test_a_rejected_extend_leaves_the_index_unchanged():
    tok, nt = history([[1, 2, 1, 2, 1], [3, 4]], width=6)
    index = _index(tok, nt, 4)
    before = [t.clone() for t in index[:5]]
    with pytest.raises(ValueError, match="num_tokens must be >= index.length"):
        ops.ngram_index_extend(tok, nt - 1, index=index)
    with pytest.raises(ValueError, match="req_indices must be unique"):
        ops.ngram_index_build(tok, nt, torch.tensor([0, 0], dtype=I32), index=index)
    assert all(torch.equal(a, b) for a, b in zip(before, index[:5], strict=True))


def test_an_index_that_does_not_fit_the_tokens_raises():
    tok, nt = history([[1, 2, 1, 2, 1]], width=6)
    small = ops.new_ngram_index(1, 4, min_n=1, max_n=4, scoring="frequency")
    with pytest.raises(ValueError, match="index.nodes must have shape|index.keys must have"):
        ops.ngram_index_build(tok, nt, index=small)
    with pytest.raises(ValueError, match="index.length must equal num_tokens"):
        index = _index(tok, nt - 1, 4)
        ops.ngram_propose(tok, nt, min_n=1, max_n=4, num_speculative_tokens=2, index=index,
                          scoring="frequency")  # fmt: skip
