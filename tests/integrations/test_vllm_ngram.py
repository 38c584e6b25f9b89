"""The custom_class proposer drafts exactly what vLLM's own CPU ``NgramProposer`` drafts.

Both proposers get the same vLLM-shaped inputs: ``sampled_token_ids`` (a list per
request, empty = skip), ``num_tokens_no_spec`` and the persistent ``token_ids_cpu``
buffer with more rows than requests and stale tokens past each history. vLLM's proposer
is configured with ``method="ngram"`` (``prompt_lookup_min/max`` in the speculative
config), ours as vLLM 0.33.0 hands a ``custom_class`` its config: ``prompt_lookup_*``
zeroed, the n-gram range in ``additional_config["specdec_kernels"]``. The real
``VllmConfig`` path is in test_vllm_config.py; these stand-ins carry exactly the fields
both constructors read.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from vllm.v1.spec_decode.ngram_proposer import NgramProposer as VllmNgramProposer

from specdec_kernels.integrations.vllm import NgramProposer, NgramSettings, ngram_settings

pytestmark = pytest.mark.filterwarnings(  # raised while numba compiles vLLM's proposer
    "ignore::numba.core.errors.NumbaPendingDeprecationWarning"
)

ROOT = Path(__file__).resolve().parents[2]
MAX_NUM_SEQS = 16
CONFIGS = [(1, 1, 1), (1, 3, 4), (2, 5, 3), (3, 3, 2), (2, 2, 5)]  # (min_n, max_n, k)


def stand_in_config(min_n, max_n, k, max_model_len, *, custom_class, extra=None):
    """The fields of a ``VllmConfig`` that the two proposers read."""
    spec = SimpleNamespace(
        method="custom_class" if custom_class else "ngram",
        num_speculative_tokens=k,
        prompt_lookup_min=0 if custom_class else min_n,
        prompt_lookup_max=0 if custom_class else max_n,
    )
    section = {"prompt_lookup_min": min_n, "prompt_lookup_max": max_n} if custom_class else {}
    if extra is not None:
        section = extra
    return SimpleNamespace(
        speculative_config=spec,
        model_config=SimpleNamespace(max_model_len=max_model_len),
        scheduler_config=SimpleNamespace(max_num_seqs=MAX_NUM_SEQS),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
        additional_config={"specdec_kernels": section} if section else {},
    )


@functools.cache
def proposers(min_n, max_n, k, max_model_len):
    """(ours, vLLM's), built once per configuration (vLLM's constructor JITs with numba)."""
    ours = NgramProposer(stand_in_config(min_n, max_n, k, max_model_len, custom_class=True))
    theirs = VllmNgramProposer(stand_in_config(min_n, max_n, k, max_model_len, custom_class=False))
    return ours, theirs


def vllm_buffers(histories, max_model_len, rng):
    """vLLM's ``token_ids_cpu`` (MAX_NUM_SEQS rows, stale tokens past each history) and
    ``num_tokens_no_spec``."""
    token_ids = rng.integers(0, 1000, size=(MAX_NUM_SEQS, max_model_len), dtype=np.int32)
    num_tokens = np.zeros(MAX_NUM_SEQS, dtype=np.int32)
    for b, h in enumerate(histories):
        token_ids[b, : len(h)] = h
        num_tokens[b] = len(h)
    return token_ids, num_tokens


def both(config, histories, sampled, max_model_len, rng):
    ours, theirs = proposers(*config, max_model_len)
    token_ids, num_tokens = vllm_buffers(histories, max_model_len, rng)
    got = ours.propose(sampled, num_tokens, token_ids, slot_mappings=None)
    want = theirs.propose(config[2], sampled, num_tokens, token_ids, slot_mappings=None)
    return got, want


batches = st.lists(
    st.tuples(
        st.integers(1, 48),  # history length (max_model_len = 48 is reachable)
        st.sampled_from([2, 3, 4, 6, 50]),  # vocabulary: mostly small, so n-grams repeat
        st.booleans(),  # empty sampled list (vLLM skips the request)
    ),
    min_size=1,
    max_size=MAX_NUM_SEQS,
)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "min{}-max{}-k{}".format(*c))
@given(batch=batches, seed=st.integers(0, 2**31 - 1))
def test_random_streams_draft_like_vllm(config, batch, seed):
    rng = np.random.default_rng(seed)
    histories = [rng.integers(0, vocab, size=n, dtype=np.int32) for n, vocab, _ in batch]
    sampled = [
        [] if skip else [int(h[-1])] for h, (_, _, skip) in zip(histories, batch, strict=True)
    ]
    got, want = both(config, histories, sampled, 48, rng)
    assert got == want


def source_token_stream() -> np.ndarray:
    """This repository's Python source as word-level token ids: a real, repetitive stream."""
    text = "\n".join(
        p.read_text() for d in ("specdec_kernels", "ops") for p in sorted((ROOT / d).rglob("*.py"))
    )
    words = re.findall(r"\w+|[^\w\s]|\n", text)
    vocab: dict[str, int] = {}
    return np.array([vocab.setdefault(w, len(vocab)) for w in words], dtype=np.int32)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "min{}-max{}-k{}".format(*c))
def test_real_token_streams_draft_like_vllm(config):
    stream = source_token_stream()
    max_model_len = 512
    rng = np.random.default_rng(sum(config))
    drafted = 0
    for _ in range(20):
        B = int(rng.integers(1, MAX_NUM_SEQS + 1))
        lengths = rng.integers(1, max_model_len + 1, size=B)
        starts = rng.integers(0, len(stream) - max_model_len, size=B)
        histories = [stream[s : s + n] for s, n in zip(starts, lengths, strict=True)]
        sampled = [[int(h[-1])] if rng.random() > 0.1 else [] for h in histories]
        got, want = both(config, histories, sampled, max_model_len, rng)
        assert got == want
        drafted += sum(map(len, got))
    assert drafted > 0  # the comparison covered real drafts, not only empty lists


def test_requests_at_max_model_len_get_capped_like_vllm():
    # "1 2 3 1 2 3 ..." always matches; the cap leaves max_model_len - L drafts
    max_model_len, k = 30, 4
    pattern = np.tile(np.array([1, 2, 3], dtype=np.int32), 20)
    lengths = [30, 29, 28, 27, 26, 12]
    histories = [pattern[:n] for n in lengths]
    sampled = [[int(h[-1])] for h in histories]
    got, want = both((1, 3, k), histories, sampled, max_model_len, np.random.default_rng(0))
    assert got == want
    assert [len(d) for d in got] == [0, 1, 2, 3, 4, 4]


def test_empty_sampled_lists_get_no_drafts_like_vllm():
    histories = [np.array([5, 6, 7, 5, 6], dtype=np.int32)] * 3
    sampled = [[6], [], [6]]
    got, want = both((2, 2, 3), histories, sampled, 48, np.random.default_rng(0))
    assert got == want == [[7, 5, 6], [], [7, 5, 6]]


def test_leftmost_match_wins_like_vllm():
    # "4 9" occurs at 0 (followed by 1) and at 3 (followed by 2): vLLM's CPU proposer and
    # tie_break="first" take the leftmost
    history = np.array([4, 9, 1, 4, 9, 2, 4, 9], dtype=np.int32)
    got, want = both((2, 2, 2), [history], [[9]], 48, np.random.default_rng(0))
    assert got == want == [[1, 4]]


def test_other_integer_dtypes_are_converted():
    ours, _ = proposers(1, 3, 4, 48)
    token_ids = np.array([[1, 2, 3, 1, 2] + [0] * 43], dtype=np.int64)
    assert ours.propose([[2]], np.array([5]), token_ids) == [[3, 1, 2]]


def test_empty_batch_proposes_nothing():
    ours, _ = proposers(1, 3, 4, 48)
    assert ours.propose([], np.zeros(4, np.int32), np.zeros((4, 48), np.int32)) == []


def test_bad_buffers_raise():
    ours, _ = proposers(1, 3, 4, 48)
    with pytest.raises(ValueError, match="token_ids_cpu must be a 2-D integer array"):
        ours.propose([[1]], np.array([1], np.int32), np.zeros(48, np.int32))
    with pytest.raises(ValueError, match="must have a row for each of the 2 requests"):
        ours.propose([[1], [1]], np.array([1], np.int32), np.zeros((1, 48), np.int32))
    with pytest.raises(ValueError, match="num_tokens"):
        ours.propose([[1]], np.array([49], np.int32), np.zeros((1, 48), np.int32))


def test_settings_from_additional_config_and_speculative_config():
    cfg = stand_in_config(2, 4, 3, 64, custom_class=True)
    assert ngram_settings(cfg) == NgramSettings(2, 4, 3, 64, "first")
    # a vLLM that keeps prompt_lookup_* for custom classes: read from there
    cfg = stand_in_config(1, 5, 2, 64, custom_class=False)
    assert ngram_settings(cfg) == NgramSettings(1, 5, 2, 64, "first")
    # vLLM's n-gram defaults: neither given -> 5/5; one given -> both
    assert ngram_settings(stand_in_config(0, 0, 3, 64, custom_class=True, extra={}))[:2] == (5, 5)
    one = stand_in_config(0, 0, 3, 64, custom_class=True, extra={"prompt_lookup_max": 3})
    assert ngram_settings(one)[:2] == (3, 3)
    last = stand_in_config(0, 0, 3, 64, custom_class=True, extra={"tie_break": "last"})
    assert ngram_settings(last).tie_break == "last"


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min=4 must be <="),
        ({"prompt_lookup_min": -1}, r"prompt_lookup_min'\] must be an int >= 1, got -1"),
        ({"prompt_lookup_max": 2.5}, "must be an int >= 1, got 2.5"),
        ({"prompt_lookup_mni": 2}, r"unknown keys \['prompt_lookup_mni'\]"),
        ({"tie_break": "middle"}, "tie_break must be 'first' or 'last'"),
    ],
)
def test_bad_settings_raise(extra, match):
    with pytest.raises(ValueError, match=match):
        NgramProposer(stand_in_config(0, 0, 3, 64, custom_class=True, extra=extra))


def test_conflicting_settings_raise():
    cfg = stand_in_config(2, 4, 3, 64, custom_class=False)
    cfg.additional_config = {"specdec_kernels": {"prompt_lookup_min": 3}}
    with pytest.raises(ValueError, match="prompt_lookup_min is 2 in speculative_config but 3"):
        ngram_settings(cfg)
    cfg.speculative_config = None
    with pytest.raises(ValueError, match="speculative decoding is off"):
        ngram_settings(cfg)
