"""The drafting benchmark's parts (``bench/suffix_replay.py``): the frequency prototype
drafts exactly what its stated semantics say (a brute-force count over the history), the
oracle replay counts tokens per step right. (SuffixDecoding itself is compared in the
benchmark only: it breaks ties between once-seen continuations towards the oldest, the
stated rule towards the most recent, so their drafts differ by design.)"""

from __future__ import annotations

import numpy as np
import pytest

from bench import suffix_replay
from bench.baselines import frequency_prototype as fp


def _brute_force(seq, D, k, factor, min_prob):
    """The semantics by counting occurrences in ``seq``: returns the drafts."""
    L = len(seq)

    def occurrences(c):  # end positions of c in seq
        m = len(c)
        return [i + m - 1 for i in range(L - m + 1) if tuple(seq[i : i + m]) == c]

    def best_child(c):
        stats = {}
        for end in occurrences(c):
            if end + 1 < L and len(c) < D:
                x = seq[end + 1]
                n, _ = stats.get(x, (0, -1))
                stats[x] = (n + 1, end + 1)  # count, end of the most recent occurrence
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


@pytest.mark.parametrize("seed", range(40))
def test_frequency_prototype_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    L, V = int(rng.integers(1, 60)), int(rng.integers(1, 5))
    D, k = int(rng.integers(1, 9)), int(rng.integers(1, 8))
    factor, min_prob = float(rng.choice([0.5, 1.0, 4.0])), float(rng.choice([0.0, 0.1, 0.4]))
    seq = rng.integers(0, V, L).astype(np.int32)
    table = fp.new_table(fp.capacity_for(L, D))
    for p in range(L):
        fp.append(*table, seq, 0, p, D, 1.0)
    out, tmp = np.zeros(16, np.int32), np.zeros(16, np.int32)
    t, _, _ = fp.propose((table,), np.ones(1), seq, L, D, k, factor, 0.0, min_prob, out, tmp)
    assert out[:t].tolist() == _brute_force(seq.tolist(), D, k, factor, min_prob)


def test_replay_counts_tokens_per_step():
    """A drafter that always proposes the truth emits k + 1 tokens a step (the last step
    of a request: what is left); one that never drafts, one."""

    class Perfect:
        def admit(self, s, h, n):
            pass

        def propose(self, s, h, n, k):
            return h[n : n + k].tolist()

        def commit(self, s, h, n0, n1):
            pass

        def finish(self, s, h):
            pass

    class Empty(Perfect):
        def propose(self, s, h, n, k):
            return []

    reqs = [("a", [1, 2], list(range(10))), ("b", [3], list(range(7)))]
    assert suffix_replay.replay(reqs, Empty(), batch=2, k=4) == 1.0
    assert suffix_replay.replay(reqs, Perfect(), batch=1, k=4) == 17 / (2 + 2)
