"""The drafting benchmark's parts (``bench/suffix_replay.py``): the frequency prototype
drafts exactly what its stated semantics say (a brute-force count over the history), the
oracle replay counts tokens per step right. (SuffixDecoding itself is compared in the
benchmark only: it breaks ties between once-seen continuations towards the oldest, the
stated rule towards the most recent, so their drafts differ by design.)"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np
import pytest

from bench import streams, suffix_replay
from bench.baselines import frequency_compact as fc
from bench.baselines import frequency_prototype as fp
from bench.baselines import frequency_trie as ft


def _brute_force(docs, seq, D, k, factor, min_prob, history_stored=True):
    """The semantics by counting occurrences: contexts lie inside one document (``docs``
    earlier documents, then ``seq``, the request's history, unless not
    ``history_stored``); returns the drafts."""
    L = len(seq)
    all_docs = [list(d) for d in docs] + ([list(seq)] if history_stored else [])

    def occurrences(c):  # (document, end position) of c, documents in append order
        m = len(c)
        return [
            (di, i + m - 1)
            for di, d in enumerate(all_docs)
            for i in range(len(d) - m + 1)
            if tuple(d[i : i + m]) == c
        ]

    def best_child(c):
        stats = {}
        for di, end in occurrences(c):
            d = all_docs[di]
            if end + 1 < len(d) and len(c) < D:
                n, _ = stats.get(d[end + 1], (0, None))
                stats[d[end + 1]] = (n + 1, (di, end + 1))  # count, the latest occurrence
        if not stats:
            return None, 0
        x = max(stats, key=lambda t: stats[t])
        return x, stats[x][0]

    best, best_score = [], 0.0
    for m in range(1, min(D, L)):
        c = tuple(seq[L - m :])
        if best_child(c)[0] is None:
            break
        max_len = min(k, int(m * factor + 1e-6), D - m)
        prob, score, drafts, node, node_count = 1.0, 0.0, [], c, len(occurrences(c))
        while len(drafts) < max_len:
            x, cx = best_child(node)
            if x is None:
                break
            prob *= cx / node_count
            if prob < min_prob:
                break
            drafts.append(x)
            score += prob
            node, node_count = node + (x,), cx
        if drafts and score >= best_score:
            best, best_score = drafts, score
    return best


def _prototype(docs, seq, D, k, factor, min_prob):
    """The prototype's drafts: every document appended to one table, then the history."""
    flat = np.concatenate([np.asarray(d, np.int32) for d in [*docs, seq]])
    table = fp.new_table(fp.capacity_for(len(flat), D))
    start = 0
    for d in [*docs, seq]:  # one buffer, each document counted from its own start
        fp.extend(*table, flat, start, start, start + len(d), D)
        start += len(d)
    hist = np.asarray(seq, np.int32)
    out, tmp = np.zeros(D, np.int32), np.zeros(D, np.int32)
    t, _ = fp.propose(*table, hist, len(seq), D, k, factor, min_prob, out, tmp)
    return out[:t].tolist()


def _random_case(rng, max_vocab: int, own_only: bool):
    """(earlier documents, history, D, k, factor, min_prob): the history alone if
    ``own_only``, else after 1-3 earlier documents (contexts never cross a boundary)."""
    V = int(rng.integers(1, max_vocab + 1))
    n_docs = 0 if own_only else int(rng.integers(1, 4))
    docs = [rng.integers(0, V, int(rng.integers(1, 25))).tolist() for _ in range(n_docs)]
    seq = rng.integers(0, V, int(rng.integers(1, 50))).tolist()
    D, k = int(rng.integers(1, 9)), int(rng.integers(1, 8))
    factor, min_prob = float(rng.choice([0.5, 1.0, 4.0])), float(rng.choice([0.0, 0.1, 0.4]))
    return docs, seq, D, k, factor, min_prob


@pytest.mark.parametrize("seed", range(60))
def test_frequency_prototype_equals_brute_force(seed):
    case = _random_case(np.random.default_rng(seed), 4, own_only=seed < 30)
    assert _prototype(*case) == _brute_force(*case)


STRUCTURES = {
    "compact": (fc, lambda: fc.new_store(12, 200)),
    "trie": (ft, lambda: ft.new_store(12, 200, 401)),  # 2 nodes a token and the root
}


def _compact(docs, seq, D, k, factor, min_prob, chunk=3, store_history=True, structure="compact"):
    """A structure's drafts (``compact`` or the path-compressed ``trie``): every document,
    then the history in chunks of ``chunk`` tokens (as commits arrive) unless not
    ``store_history`` (a shared store's view of a request whose tokens it does not hold)."""
    mod, new_store = STRUCTURES[structure]
    store = new_store()
    for d in [*docs, seq] if store_history else docs:
        d = np.asarray(d, np.int32)
        start = mod.reserve(store, len(d))
        for a in range(0, len(d), chunk):
            mod.append(*store, d, a, min(a + chunk, len(d)), start + a, D)
    hist = np.asarray(seq, np.int32)
    out, tmp = np.zeros(D, np.int32), np.zeros(D, np.int32)
    t, _ = mod.propose(*store, hist, len(seq), D, k, factor, min_prob, out, tmp)
    return out[:t].tolist()


@pytest.mark.parametrize("structure", sorted(STRUCTURES))
@pytest.mark.parametrize("seed", range(60))
def test_frequency_compact_equals_brute_force(seed, structure):
    """As the prototype's test, with small vocabularies (long repeats: leaves turn into
    nodes, nodes reach D, the trie splits nodes) and the history appended in chunks."""
    rng = np.random.default_rng(1000 + seed)
    case = _random_case(rng, 3, own_only=seed < 20)
    chunk = int(rng.integers(1, 5))
    assert _compact(*case, chunk=chunk, structure=structure) == _brute_force(*case)


@pytest.mark.parametrize("seed", range(40))
def test_frequency_trie_equals_brute_force_on_long_repetitive_documents(seed):
    """Documents of up to 60 tokens over 1-3 token ids, D up to 19: runs split at every
    depth, pointers to split nodes are re-pointed, contexts end at document starts."""
    rng = np.random.default_rng(2000 + seed)
    V = int(rng.integers(1, 4))
    docs = [rng.integers(0, V, int(rng.integers(1, 60))).tolist() for _ in range(seed % 4)]
    seq = rng.integers(0, V, int(rng.integers(1, 80))).tolist()
    D, k = int(rng.integers(1, 20)), int(rng.integers(1, 10))
    case = (docs, seq, D, k, float(rng.choice([0.5, 1.0, 4.0])), float(rng.choice([0.0, 0.4])))
    mod, store = ft, ft.new_store(12, 400, 801)
    for d in [*docs, seq]:
        d = np.asarray(d, np.int32)
        start = mod.reserve(store, len(d))
        for a in range(0, len(d), 3):
            mod.append(*store, d, a, min(a + 3, len(d)), start + a, D)
    out, tmp = np.zeros(D, np.int32), np.zeros(D, np.int32)
    t, _ = ft.propose(*store, np.asarray(seq, np.int32), len(seq), D, k, *case[4:], out, tmp)
    assert out[:t].tolist() == _brute_force(*case)
    used = int(store[-1][2])
    assert used <= 2 * sum(len(d) for d in [*docs, seq]) + 1  # two nodes a position at most
    assert int(store[-1][1]) == used - 1  # one key a node but the root


@pytest.mark.parametrize("seed", range(120))
def test_frequency_trie_breaks_ties_by_position_when_documents_grow_out_of_order(seed):
    """Every document reserved first, then appended in chunks in a random order of
    documents (live responses in a shared store): ties go to the latest *position*, i.e.
    as if the documents had been appended whole in reservation order."""
    rng = np.random.default_rng(3000 + seed)
    V = int(rng.integers(1, 4))
    sizes = rng.choice([2, 6, 30], int(rng.integers(1, 7)))
    docs = [rng.integers(0, V, int(rng.integers(1, n))).tolist() for n in sizes]
    D, k = int(rng.integers(1, 9)), int(rng.integers(1, 6))
    stored = seed % 2 == 0  # else a shared store's view of a request it does not hold
    if stored:
        seq = rng.integers(0, V, int(rng.integers(1, 30))).tolist()
    else:  # a prefix of a stored document and a token or two: contexts that occur
        d = docs[int(rng.integers(0, len(docs)))]
        seq = (
            d[: int(rng.integers(1, len(d) + 1))]
            + rng.integers(0, V, int(rng.integers(0, 3))).tolist()
        )
    store = ft.new_store(12, 250, 501)
    arrays = [np.asarray(d, np.int32) for d in [*docs, seq][: len(docs) + stored]]
    starts = [ft.reserve(store, len(d)) for d in arrays]
    done = [0] * len(arrays)
    while any(n < len(d) for n, d in zip(done, arrays, strict=True)):
        i = int(rng.choice([j for j, d in enumerate(arrays) if done[j] < len(d)]))
        b = min(len(arrays[i]), done[i] + int(rng.integers(1, 4)))
        ft.append(*store, arrays[i], done[i], b, starts[i] + done[i], D)
        done[i] = b
    out, tmp = np.zeros(D, np.int32), np.zeros(D, np.int32)
    factor, min_prob = float(rng.choice([1.0, 4.0])), float(rng.choice([0.0, 0.4]))
    hist = np.asarray(seq, np.int32)
    t, _ = ft.propose(*store, hist, len(seq), D, k, factor, min_prob, out, tmp)
    assert out[:t].tolist() == _brute_force(docs, seq, D, k, factor, min_prob, stored)
    # every node's count and latest position, from the stored positions' paths
    keys, vals, nodes, toks, meta = store
    seen: dict[int, list[int]] = {}
    for start, d in zip(starts, arrays, strict=True):
        for p in range(start, start + len(d)):
            node = 0
            for m in range(1, min(D, p - start + 1) + 1):
                if m > nodes[1, node]:
                    node = int(ft._find(keys, vals, node, toks[p - m + 1]))
                if m == nodes[1, node]:  # each node once per position: at its deepest depth
                    seen.setdefault(node, []).append(p)
    for node, ends in seen.items():
        assert (nodes[0, node], nodes[3, node]) == (len(ends), max(ends))


@pytest.mark.parametrize("structure", sorted(STRUCTURES))
def test_frequency_compact_named_cases(structure):
    _compact = functools.partial(globals()["_compact"], structure=structure)
    # a node's once-seen child is read on from its occurrence: [5, 6] (twice: the document
    # and the live history) -> 7 (1 of 2), then 8, 9 at the same running product
    assert _compact([[5, 6, 7, 8, 9]], [1, 5, 6], 8, 3, 4.0, 0.1) == [7, 8, 9]
    # a context seen once (a leaf) of a history the store does not hold: read on too,
    # from the longest match ([5, 6], not the shorter [6]: ties go to the longer)
    assert _compact([[5, 6, 7, 8, 9]], [1, 5, 6], 8, 3, 4.0, 0.1, store_history=False) == [
        7, 8, 9,
    ]  # fmt: skip
    assert _compact([[5, 6, 7, 8, 9]], [1, 6], 8, 3, 4.0, 0.1, store_history=False) == [7, 8, 9]
    assert _compact([[5, 6, 7]], [1, 5, 6], 8, 3, 1.0, 0.1, store_history=False) == [7]
    # the same context twice: the leaf became a node; its continuations 7 and 4 tie,
    # the most recent (4) wins
    assert _compact([[5, 6, 7], [5, 6, 4]], [5, 6], 8, 1, 4.0, 0.0) == [4]
    assert _compact([[5, 6, 4, 4], [5, 6, 7]], [5, 6], 8, 1, 4.0, 0.0) == [7]
    # no context crosses a document boundary: [1, 2] only occurs across one
    assert _compact([[0, 1], [2, 3]], [1, 2], 8, 2, 4.0, 0.0) == [3]  # from [2] alone
    assert _compact([[0, 1], [9, 3]], [1, 2], 8, 2, 4.0, 0.0) == []
    # the live tail counts: [3] occurred before and is the tail: count 2, child 1 of 2
    assert _compact([], [3, 8, 3], 8, 1, 4.0, 0.6) == []
    assert _compact([], [3, 8, 3], 8, 1, 4.0, 0.5) == [8]
    # an empty store, an empty history, k = 0
    assert _compact([], [1], 8, 4, 4.0, 0.1) == []
    assert _compact([[1, 2]], [], 8, 4, 4.0, 0.1) == []
    assert _compact([[1, 2, 1, 2]], [1], 8, 0, 4.0, 0.1) == []


def test_frequency_compact_refuses_appends_outside_the_reserved_tokens_and_a_full_table():
    store = fc.new_store(12, 8)
    seq = np.arange(6, dtype=np.int32)
    start = fc.reserve(store, 3)
    with pytest.raises(ValueError, match="outside the reserved"):
        fc.append(*store, seq, 0, 4, start, 4)
    with pytest.raises(ValueError, match="token store is full"):
        fc.reserve(store, 5)  # 8 tokens: 3 reserved, a separator, 4 free
    assert fc.reserve(store, 4) == 4
    store = fc.new_store(2, 16)  # 4 slots: 3 entries at most
    with pytest.raises(ValueError, match="3/4 full"):
        fc.append(*store, seq, 0, 6, fc.reserve(store, 6), 4)


def test_frequency_trie_refuses_appends_outside_the_reserved_tokens_and_a_full_store():
    seq = np.arange(6, dtype=np.int32)
    store = ft.new_store(12, 8, 20)
    start = ft.reserve(store, 3)
    with pytest.raises(ValueError, match="outside the reserved"):
        ft.append(*store, seq, 0, 4, start, 4)
    with pytest.raises(ValueError, match="token store is full"):
        ft.reserve(store, 5)
    store = ft.new_store(2, 16, 20)  # 4 slots: 3 keys at most
    with pytest.raises(ValueError, match="3/4 full"):
        ft.append(*store, seq, 0, 6, ft.reserve(store, 6), 4)
    store = ft.new_store(12, 16, 4)  # the root and 3 nodes
    with pytest.raises(ValueError, match="no node left"):
        ft.append(*store, seq, 0, 6, ft.reserve(store, 6), 4)
    # refused before the position that does not fit is counted: the store stays whole
    assert int(store[-1][2]) == 3 and store[2][0, 1:3].tolist() == [1, 1]
    out = np.zeros(1, np.int32)
    with pytest.raises(ValueError, match="min"):
        ft.propose(*store, seq, 3, 4, 2, 4.0, 0.1, out, out)


def test_suffix_memory_counts_nodes_and_leaves():
    from bench import suffix_memory

    # [1, 2] in both documents: nodes [1], [2], [1, 2]; a leaf for the shortest context
    # seen once at each other position: [3], [0], [0, 1], [0, 1, 2] (positions 0 and 1
    # have none: every context ending there is seen twice)
    docs = [np.asarray(d, np.int32) for d in ([1, 2, 3], [0, 1, 2])]
    compact = suffix_memory.STRUCTURES["compact"]
    store, _ = suffix_memory.build(docs, 8, compact)
    assert compact.census(store) == (3, 4)
    assert compact.entries(store) == 7
    # alone, every context of a document is seen once: a leaf per position
    assert suffix_memory.per_document(docs, 8, compact) == "1.00 / 1.00 / 1.00"
    # the trie (contexts read backwards): [1] (positions 0 and 5; position 0's contexts
    # end there) and the run [2], [1, 2] (positions 1 and 6: same occurrences) are nodes
    # of count 2; leaves [0, 1] (below [1]), [0, 1, 2] (below the run), [3] .. [1, 2, 3]
    # (one run of depths 1-3) and [0]; best continuations: [1] -> the run [2] (its depth
    # 2), the run -> [3]'s run, [0, 1] -> [0, 1, 2]
    trie = suffix_memory.STRUCTURES["trie"]
    store, _ = suffix_memory.build(docs, 8, trie)
    assert trie.census(store) == (2, 4) and trie.entries(store) == 6
    cnt, hi, par, pos, best = store[2][:, : int(store[-1][2])].tolist()
    assert cnt == [0, 2, 2, 1, 1, 1, 1] and hi == [0, 1, 2, 3, 1, 2, 3]
    assert par == [0, 0, 0, 0, 0, 1, 2] and pos == [0, 5, 6, 2, 4, 5, 6]
    assert best == [-1, 2, 3, -1, 5, 6, -1]
    # sized by that count (as the benchmark sizes its timed builds), both build again
    for structure in (compact, trie):
        first, _ = suffix_memory.build(docs, 8, structure)
        again, _ = suffix_memory.build(docs, 8, structure, structure.entries(first))
        assert structure.census(again) == structure.census(first)
        assert structure.nbytes(again, False) <= structure.nbytes(first, False)


def test_a_full_prototype_table_raises():
    table = fp.new_table(2)  # 4 slots
    seq = np.arange(10, dtype=np.int32)
    with pytest.raises(ValueError, match="table is full"):
        for p in range(10):
            fp.append(*table, seq, 0, p, 1)


class _Truth:
    """Drafts the first ``right`` true tokens, then ``wrong`` wrong ones (past the end of
    the request too), and records the order of its calls."""

    def __init__(self, right, wrong):
        self.right, self.wrong, self.calls = right, wrong, []

    def admit(self, s, h, n):
        self.calls.append(("admit", s))

    def propose(self, s, h, n, k):
        self.calls.append(("propose", s))
        truth = h[n : n + self.right].tolist()
        return (truth + [-5] * self.wrong)[:k]

    def commit(self, s, h, n0, n1):
        self.calls.append(("commit", s))

    def finish(self, s, h):
        self.calls.append(("finish", s))


def test_replay_counts_accepted_drafts_and_steps():
    reqs = [("a", [1, 2], list(range(10))), ("b", [3], list(range(7)))]
    # never drafts: one token a step; always right: k + 1 a step, the last step what is left
    assert suffix_replay.replay(reqs, _Truth(0, 0), batch=2, k=4) == 1.0
    assert suffix_replay.replay(reqs, _Truth(9, 0), batch=1, k=4) == 17 / (2 + 2)
    # two right, then wrong: 3 tokens a step (10 -> 3+3+3+1, 7 -> 3+3+1)
    assert suffix_replay.replay(reqs, _Truth(2, 3), batch=2, k=4) == 17 / (4 + 3)


def test_replay_steps_are_propose_all_then_commit_all():
    """As an engine steps: every live request proposes, then each commits; finished ones
    leave (and free slots take the next request) after all commits of the step."""
    reqs = [("a", [1], [2, 3]), ("b", [1], [2, 3]), ("c", [1], [2])]
    d = _Truth(0, 0)
    suffix_replay.replay(reqs, d, batch=2, k=2)
    step = [("propose", 0), ("propose", 1), ("commit", 0), ("commit", 1)]
    assert d.calls == [
        ("admit", 0), ("admit", 1), *step, *step,
        ("finish", 0), ("admit", 0), ("finish", 1),
        ("propose", 0), ("commit", 0), ("finish", 0),
    ]  # fmt: skip


def test_botocore_stream_splits_each_model_into_metadata_prompt_and_body(tmp_path, monkeypatch):
    import gzip
    import zipfile

    wheel = tmp_path / "fake.whl"
    docs = {
        "botocore/data/b-svc/2020-01-01/service-2.json.gz": "l1\nl2\nbody b\n",
        "botocore/data/a-svc/2019-01-01/service-2.json.gz": "m1\nm2\nbody a is longer\n",
        "botocore/data/a-svc/2019-01-01/paginators-1.json": "not a model\n",
    }
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in docs.items():
            z.writestr(name, gzip.compress(text.encode()) if name.endswith(".gz") else text)
    monkeypatch.setattr(streams, "botocore_wheel", lambda: wheel)

    reqs = streams.botocore_requests(2, 3, 10)
    # path order, models only
    assert [name for name, _, _ in reqs] == ["a-svc/2019-01-01", "b-svc/2020-01-01"]
    cache: dict[str, int] = {}
    models = sorted(name for name in docs if name.endswith(".gz"))
    for (_, prompt, output), key in zip(reqs, models, strict=True):
        lines = docs[key].splitlines(keepends=True)
        assert prompt == streams._ids("".join(lines[:2]), cache)
        assert output == streams._ids("".join(lines[2:]), cache)[:3]
    assert len(streams.botocore_requests(2, 3, 1)) == 1


def _stream(seed, count=6):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 6, 40).tolist()  # requests that repeat each other, edited
    reqs = []
    for i in range(count):
        out = [t if rng.random() > 0.15 else int(rng.integers(0, 6)) for t in base]
        reqs.append((str(i), rng.integers(0, 6, 3).tolist(), out[: 20 + 3 * i]))
    return reqs


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("factor", [0.5, 2.0])
@pytest.mark.parametrize(
    "other", ["adaptive with that one factor", "compact structure", "trie structure"]
)
def test_replays_exactly_as_the_prototype_at_that_factor(seed, factor, other):
    reqs = _stream(seed)
    n = sum(len(p) + len(o) for _, p, o in reqs)
    settings = [(False, "native"), (True, "native"), (True, "finished")]
    if other == "trie structure":
        # not the native store: its live responses sit in slots reserved at admission,
        # so "latest by position" (the trie's tie rule) is not "latest counted"
        settings.remove((True, "native"))
    for shared, store in settings:
        fixed = suffix_replay.Frequency(shared, store, factor=factor, shared_positions=n)
        if other != "adaptive with that one factor":
            cls = suffix_replay.Compact if other == "compact structure" else suffix_replay.Trie
            d = cls(shared, store, factor=factor, shared_positions=n)
        else:
            d = suffix_replay.Adaptive(shared, store, factors=(factor,), shared_positions=n)
        want = suffix_replay.replay(reqs, fixed, batch=3, k=4)
        assert suffix_replay.replay(reqs, d, batch=3, k=4) == want


def test_adaptive_credits_each_factor_once_its_draft_is_decided():
    d = suffix_replay.Adaptive(False, "native", factors=(0.5, 1.0), decay=1.0)
    h = np.asarray([1, 2, 3, 1, 2, 3, 1, 2, 9, 9], np.int32)
    d.admit(0, h, 5)
    drafts = []
    for f in (0.5, 1.0):
        d.factor = f
        drafts.append(suffix_replay.Frequency.propose(d, 0, h, 5, 4))
    assert len(drafts[0]) < len(drafts[1])  # the factor caps the length
    assert d.propose(0, h, 5, 4) == drafts[1]  # no credit yet: factors[1]
    d.commit(0, h, 5, 6)  # one token known: not enough to score the longer draft
    assert d.credit[0].tolist() == [0, 0] and len(d.pending[0]) == 1
    d.commit(0, h, 6, 10)
    want = [suffix_replay.accepted(x, h, 5, 10) for x in drafts]
    assert d.credit[0].tolist() == want and not d.pending[0]
    assert suffix_replay.accepted([3, 1, 7], h, 5, 10) == 2
    assert suffix_replay.accepted([3, 1, 2], h, 5, 7) == 2  # only committed tokens count


def test_adaptive_scores_mid_request_and_drafts_with_the_most_credited_factor():
    d = suffix_replay.Adaptive(False, "native", factors=(0.5, 1.0), decay=1.0)
    h = np.asarray([1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 7, 7, 7, 7], np.int32)
    d.admit(0, h, 5)
    d.propose(0, h, 5, 4)
    drafts = d.pending[0][0][1]
    assert len(drafts[0]) < len(drafts[1])
    n1 = 5 + max(map(len, drafts))
    d.commit(0, h, 5, n1)  # decided before the request ends: scored now
    assert n1 < len(h) and not d.pending[0]
    assert d.credit[0].tolist() == [suffix_replay.accepted(x, h, 5, n1) for x in drafts]
    d.credit[0][:] = [5.0, 1.0]  # the first factor leads: its draft is the one proposed
    got = d.propose(0, h, n1, 4)
    first, second = d.pending[0][-1][1]
    assert got == first != second


def test_botocore_wheel_keeps_only_a_download_with_the_pinned_sha256(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    payload = [b"not the wheel"]

    def fake_pip(cmd, check):
        (Path(cmd[cmd.index("-d") + 1]) / streams.BOTOCORE_WHEEL).write_bytes(payload[0])

    monkeypatch.setattr(streams.subprocess, "run", fake_pip)
    with pytest.raises(SystemExit, match="sha256"):
        streams.botocore_wheel()
    assert list((tmp_path / "streams").iterdir()) == []  # nothing kept: the next run retries
    monkeypatch.setattr(streams, "BOTOCORE_SHA256", hashlib.sha256(payload[0]).hexdigest())
    wheel = streams.botocore_wheel()
    assert wheel.read_bytes() == payload[0] and wheel.parent == tmp_path / "streams"


def test_summary_divides_by_the_peers_best_factor_per_setting(tmp_path):
    from bench import suffix_summary

    runs = tmp_path / "runs.md"
    runs.write_text(
        "### code edits, git a..b: 2 requests\n\n"
        "| drafter | k | own history | + earlier, native store | + earlier, finished store |\n"
        "|---|---|---|---|---|\n"
        "| longest | 4 | 1.5000 | n/a | 2.0000 |\n"
        "| suffix f=1 | 4 | 2.0000 | 3.0000 | 4.0000 |\n"
        "| suffix f=4 | 4 | 3.0000 | 2.0000 | 2.0000 |\n"
        "| frequency f=4 | 4 | 3.3000 | 2.4000 | 1.0000 |\n"
    )
    lines, worst = suffix_summary.summarize(suffix_summary.read([runs]), factors=2)
    assert (
        lines[0] == "code edits k=4: SuffixDecoding best 3.0000 (f=4) / 3.0000 (f=1) / 4.0000 (f=1)"
    )
    assert worst == {"longest": 0.5, "frequency f=4": 0.25}
    assert lines[1].split() == ["longest", "0.500", "/", "n/a", "/", "0.500"]
    assert suffix_summary.summarize(suffix_summary.read([runs]), factors=4)[1] == {}


@pytest.mark.parametrize("seed", range(60))
def test_budget_corpus_keeps_the_newest_documents_exactly_within_its_budget(seed):
    """Random documents (empty, short, longer than a piece, longer than the budget) into
    a small budget: after every add the live pieces are the newest pieces in order, their
    slots at most the budget, the cost at most (1 + work) appends per added slot, and the
    drafts those of the brute force over exactly the live pieces."""
    from bench.baselines.frequency_budget import BudgetCorpus

    rng = np.random.default_rng(4000 + seed)
    C, D, V = int(rng.choice([16, 24, 40, 64])), int(rng.integers(1, 8)), int(rng.integers(1, 4))
    corpus, pieces, evicted = BudgetCorpus(C, D), [], False
    r = corpus.r
    for _ in range(int(rng.integers(1, 40))):
        gone = len(pieces) - len(corpus.docs)
        n = int(rng.choice([0, 1, 2, 5, 12, int(1.5 * C)]))
        doc = rng.integers(0, V, n).astype(np.int32)
        before = corpus.appended
        corpus.add(doc)
        new = [doc[a : a + corpus.max_piece].tolist() for a in range(0, n, corpus.max_piece)]
        pieces += new
        live = [p.tolist() for p in corpus.docs]
        assert corpus.appended - before <= (1 + corpus.work) * (n + len(new))
        assert corpus.size == sum(len(p) + 1 for p in live) <= C
        assert live == pieces[len(pieces) - len(live) :] and (live or not new)
        if len(pieces) - len(live) > gone and len(new) == 1:  # this piece made the switch
            assert (1 - 4 * r) * C <= corpus.size <= (1 - r) * C
        evicted |= len(live) < len(pieces)
        d = live[int(rng.integers(0, len(live)))] if live else [0]
        seq = d[: int(rng.integers(1, len(d) + 1))] or [0]  # a context that occurs
        k, factor, min_prob = int(rng.integers(1, 6)), float(rng.choice([1.0, 4.0])), 0.0
        out, tmp = np.zeros(D, np.int32), np.zeros(D, np.int32)
        t, _ = corpus.propose(np.asarray(seq, np.int32), len(seq), k, factor, min_prob, out, tmp)
        want = _brute_force(live, seq, D, k, factor, min_prob, history_stored=False)
        assert out[:t].tolist() == want
    assert evicted or sum(len(p) + 1 for p in pieces) <= C


def test_budget_corpus_refuses_a_budget_too_small_for_its_slack():
    from bench.baselines.frequency_budget import BudgetCorpus

    with pytest.raises(ValueError, match="budget must be >= 16"):
        BudgetCorpus(15, 4)
    with pytest.raises(ValueError, match="slack"):
        BudgetCorpus(64, 4, slack=0.25)
    assert BudgetCorpus(16, 4).max_piece == 1


@pytest.mark.parametrize("seed", range(2))
def test_a_budget_above_the_stream_replays_exactly_as_the_unbounded_trie(seed):
    reqs = _stream(seed)
    n = sum(len(p) + len(o) for _, p, o in reqs)
    want = suffix_replay.replay(reqs, suffix_replay.Trie(True, "finished"), batch=3, k=4)
    budget = suffix_replay.TrieBudget(True, "finished", budget=8 * (n + len(reqs)))
    assert suffix_replay.replay(reqs, budget, batch=3, k=4) == want
    small = suffix_replay.TrieBudget(True, "finished", budget=64)  # evicts: fewer matches
    assert suffix_replay.replay(reqs, small, batch=3, k=4) != want


@pytest.mark.parametrize("seed", range(18))
def test_the_frequency_op_equals_the_trie_prototype(seed):
    """``ngram_propose(scoring="frequency")`` and its index (the op) against the design
    prototype it came from: rows counted in two extends (admission, then a commit of 0-5
    tokens), then one proposal per row (k up to 2 D + 1, factors up to 50): every node's
    count, depth, latest position and best continuation, and the drafts, are the same."""
    import torch

    from specdec_kernels import ops

    rng = np.random.default_rng(5000 + seed)
    R, L_max = int(rng.integers(1, 4)), int(rng.integers(1, 40))
    D, V = int(rng.integers(2, 10)), int(rng.integers(1, 4))
    rows = rng.integers(0, V, (R, L_max))
    if seed % 3 == 0:  # periodic rows: runs that reach depth D, chains that could pass it
        period = rng.integers(0, V + 1, (R, int(rng.integers(1, 4))))
        rows = np.tile(period, (1, L_max))[:, :L_max]
    tokens = torch.tensor(rows, dtype=torch.int32)
    n0 = torch.tensor(rng.integers(0, L_max + 1, R), dtype=torch.int32)
    n1 = torch.clamp(n0 + torch.tensor(rng.integers(0, 6, R), dtype=torch.int32), max=L_max)
    index = ops.new_ngram_index(R, L_max, min_n=1, max_n=D, scoring="frequency")
    ops.ngram_index_build(tokens, n0, index=index)
    ops.ngram_index_extend(tokens, n1, index=index)
    k, factor = int(rng.integers(0, 2 * D + 2)), float(rng.choice([0.5, 1.0, 4.0, 50.0]))
    min_prob = float(rng.choice([0.0, 0.1, 0.4]))
    out = ops.ngram_propose(tokens, n1, min_n=1, max_n=D, num_speculative_tokens=k, index=index,
                            scoring="frequency", min_token_prob=min_prob,
                            max_spec_factor=factor)  # fmt: skip
    for r in range(R):
        row, n = tokens[r].numpy(), int(n1[r])
        store = ft.store_for(L_max, L_max)
        start = ft.reserve(store, L_max)
        if n:
            ft.append(*store, row, 0, n, start, D)
        used = int(store[4][2])
        assert int(index.num_nodes[r]) == used
        assert np.array_equal(index.nodes[r, :, :used].numpy(), store[2][[0, 1, 3, 4], :used])
        buf, tmp = np.zeros(max(k, D), np.int32), np.zeros(max(k, D), np.int32)
        t, _ = ft.propose(*store, row, n, D, k, factor, min_prob, buf, tmp)
        assert out.draft_token_ids[r].tolist() == buf[:t].tolist() + [-1] * (k - t)


def test_budget_corpus_keeps_its_own_copy_of_each_document():
    """An engine reuses its token buffers: a rebuild must count what was added."""
    from bench.baselines.frequency_budget import BudgetCorpus

    corpus, buf = BudgetCorpus(16, 4), np.zeros(1, np.int32)
    for t in [2, 9, 9, 9, 9, 9, 9, 9]:  # 8 one-token documents of 2 slots: past 3/4 of 16
        buf[0] = t
        corpus.add(buf)
    buf[0] = 5
    assert [p.tolist() for p in corpus.docs][-3:] == [[9], [9], [9]]
    assert all(p.tolist() != [5] for p in corpus.docs)


@pytest.mark.parametrize("seed", range(40))
def test_the_oracle_accepts_at_least_what_the_rule_does_at_any_setting(seed):
    """``frequency_trie.oracle`` is a per-step bound: from the same history, no setting of
    the rule (factor, ``min_token_prob``) drafts a chain the truth accepts more of. The
    truth is random, or half the time one setting's draft (which it then accepts whole)."""
    rng = np.random.default_rng(3000 + seed)
    V = int(rng.integers(1, 4))
    docs = [rng.integers(0, V, int(rng.integers(1, 40))).tolist() for _ in range(seed % 3)]
    seq = rng.integers(0, V, int(rng.integers(2, 60))).tolist()
    D, k = int(rng.integers(2, 12)), int(rng.integers(1, 8))
    truth = rng.integers(0, V, k).tolist()
    if seed % 2:
        factor, min_prob = float(rng.choice([0.5, 1.0, 4.0])), float(rng.choice([0.0, 0.4]))
        draft = _brute_force(docs, seq, D, k, factor, min_prob)
        truth = draft + truth[len(draft) :]
    truth = np.asarray(truth, np.int32)
    store = ft.new_store(12, 400, 801)
    for d in [*docs, seq]:
        d = np.asarray(d, np.int32)
        ft.append(*store, d, 0, len(d), ft.reserve(store, len(d)), D)
    hist, out = np.asarray(seq, np.int32), np.zeros(D, np.int32)
    t = ft.oracle(*store, hist, len(seq), D, k, truth, out)
    bound = suffix_replay.accepted(out[:t].tolist(), truth, 0, k)
    for factor in (0.5, 1.0, 4.0, 64.0):
        for min_prob in (0.0, 0.1, 0.4):
            rule = _brute_force(docs, seq, D, k, factor, min_prob)
            assert suffix_replay.accepted(rule, truth, 0, k) <= bound
    assert t <= min(k, D - 1)
