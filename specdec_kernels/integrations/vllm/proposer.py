"""A vLLM ``custom_class`` proposer that drafts with :func:`specdec_kernels.ops.ngram_propose`.

vLLM (0.33.0) loads it from ``speculative_config={"method": "custom_class", "model":
"specdec_kernels.integrations.vllm.NgramProposer", "num_speculative_tokens": k}``
(``vllm/v1/spec_decode/custom_class_proposer.py``), constructs it with the ``VllmConfig``
and, on the V1 model runner, calls ``propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu, slot_mappings=...)`` after every step. Nothing here imports vLLM: the
config is read by attribute, and the arrays are vLLM's host-side numpy buffers.

By default the proposer keeps an own-history n-gram index of vLLM's rows (built when a
request appears in a row, extended with each step's new tokens: ``rows.py`` says how a
new, moved or resumed request is told from a continuing one), so a step costs
O(new tokens) per request instead of a rescan of every history; with ``corpus_tokens``
it also drafts from a shared corpus of the requests that finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from specdec_kernels.integrations.vllm.rows import RowTracker
from specdec_kernels.integrations.vllm.settings import NgramSettings, ngram_settings
from specdec_kernels.ops import (
    FrequencyIndex,
    NgramIndex,
    corpus_append,
    new_corpus,
    new_ngram_index,
    ngram_index_build,
    ngram_propose,
)
from specdec_kernels.ops.frequency import nodes_for, slots_for

__all__ = ["NgramProposer", "NgramSettings", "ngram_settings"]


def _as_int32(name: str, array: Any, ndim: int) -> torch.Tensor:
    a = array.numpy(force=True) if isinstance(array, torch.Tensor) else np.asarray(array)
    if a.ndim != ndim or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} must be a {ndim}-D integer array, got {a.dtype} {a.shape}")
    if a.dtype != np.int32:
        a = a.astype(np.int32)
    return torch.from_numpy(a)


def index_bytes(settings: NgramSettings, rows: int) -> int:
    """Memory of the own-history index of ``rows`` rows: ``R x N x S x 8`` (``S = 2L``), or
    with ``scoring="frequency"`` ``R x (12 S + 16 M)`` (``docs/design.md``)."""
    L = settings.max_model_len
    if settings.scoring == "frequency":
        return rows * (12 * slots_for(L) + 16 * nodes_for(L))
    return rows * (settings.max_n - settings.min_n + 1) * 2 * L * 8


class NgramProposer:
    """vLLM ``custom_class`` proposer: n-gram drafts from ``ngram_propose``.

    Without a corpus it drafts exactly what vLLM's CPU ``NgramProposer`` drafts
    (``tie_break="first"``, the default: the longest n in ``[prompt_lookup_min,
    prompt_lookup_max]``, then the leftmost earlier occurrence), with the same skips: a
    request whose ``sampled_token_ids`` entry is empty (a partial prefill, or a discarded
    sample) and a request with ``num_tokens_no_spec >= max_model_len`` get no drafts, and
    no draft takes a request past ``max_model_len``. Runs on vLLM's host buffers (no copy
    of ``token_ids_cpu``, no device transfer). Options in
    ``additional_config["specdec_kernels"]``: :func:`ngram_settings`; the index takes
    ``max_num_seqs x (max_n - min_n + 1) x 2 max_model_len x 8`` bytes (``max_index_bytes``
    caps it), the corpus ``corpus_tokens x 20 + (max_n - min_n + 1) x 4 corpus_tokens x 8``
    and a copy of vLLM's token buffer. ``scoring: "frequency"`` drafts by SuffixDecoding's
    rule over each request's own history instead (a frequency index, ~80 B a token of
    ``max_model_len`` per row; a corpus of ``corpus_tokens`` slots takes two stores of
    ~(36 + 12 S / C) B a slot, ``docs/design.md``).

    Parameters
    ----------
    vllm_config : vllm.config.VllmConfig
        Read by :func:`ngram_settings` (see there for the ``additional_config`` keys).

    Raises
    ------
    ValueError
        From :func:`ngram_settings`; an index over ``max_num_seqs`` rows larger than
        ``max_index_bytes``.
    """

    def __init__(self, vllm_config: Any):
        self.settings = s = ngram_settings(vllm_config)
        rows = getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", 1) or 1
        if s.index and index_bytes(s, rows) > s.max_index_bytes:
            raise ValueError(
                f"the own-history index of {rows} rows x {s.max_model_len} tokens x n in "
                f"[{s.min_n}, {s.max_n}] takes {index_bytes(s, rows) / 2**30:.1f} GiB, over "
                f"max_index_bytes ({s.max_index_bytes}): raise it, or set index: false"
            )
        self._shape = None  # the state follows vLLM's buffer, made at the first call
        self._stops = np.array(s.stop_token_ids, dtype=np.int64)

    def _state(self, shape: tuple[int, int]) -> None:
        if self._shape == shape:
            return
        s, (R, W) = self.settings, shape
        self._index = new_ngram_index(R, W, min_n=s.min_n, max_n=s.max_n, scoring=s.scoring)
        self._corpus = None
        if s.corpus_tokens:
            self._corpus = new_corpus(s.corpus_tokens, min_n=s.min_n, max_n=s.max_n,
                                      scoring=s.scoring)  # fmt: skip
        self._rows = RowTracker(R, W, keep_histories=self._corpus is not None)
        self._batch_views: dict[int, NgramIndex | FrequencyIndex] = {}
        self._shape = shape

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """Draft tokens for every request of the batch (vLLM's ``custom_class`` signature).

        Parameters
        ----------
        sampled_token_ids : list of list of int
            ``[B]`` lists, the tokens each request got this step (vLLM's
            ``valid_sampled_token_ids``); an empty list means: no drafts for this request.
        num_tokens_no_spec : numpy.ndarray
            int32 ``[>= B]``, tokens (prompt + output, drafts excluded) of each request,
            row ``b`` for batch entry ``b``; only the first ``B`` entries are read.
        token_ids_cpu : numpy.ndarray
            int32 ``[>= B, max_model_len]``, vLLM's persistent token buffer; row ``b`` holds
            request ``b``'s history in its first ``num_tokens_no_spec[b]`` entries (later
            entries are ignored). Other integer dtypes are converted (a copy).
        slot_mappings : optional
            Ignored (as by vLLM's n-gram proposer).

        Returns
        -------
        list of list of int
            ``[B]`` lists of 0 .. ``num_speculative_tokens`` draft ids each.

        Raises
        ------
        ValueError
            ``token_ids_cpu`` not 2-D or ``num_tokens_no_spec`` not 1-D integer arrays,
            either with fewer than ``B`` rows, or a length outside
            ``[0, token_ids_cpu.shape[1]]``.
        """
        B = len(sampled_token_ids)
        if B == 0:
            return []
        token_ids = _as_int32("token_ids_cpu", token_ids_cpu, 2)
        num_tokens = _as_int32("num_tokens_no_spec", num_tokens_no_spec, 1)
        if token_ids.shape[0] < B or num_tokens.shape[0] < B:
            raise ValueError(
                f"token_ids_cpu {tuple(token_ids.shape)} and num_tokens_no_spec "
                f"{tuple(num_tokens.shape)} must have a row for each of the {B} requests"
            )
        lengths = num_tokens.numpy()[:B]
        W = token_ids.shape[1]
        if lengths.min() < 0 or lengths.max() > W:
            raise ValueError(
                f"num_tokens_no_spec must lie in [0, {W}] (token_ids_cpu.shape[1]), got values "
                f"in [{lengths.min()}, {lengths.max()}]"
            )
        s = self.settings
        caps = None  # every request drafts (the common step), else 0 for those that do not
        if not all(len(ids) for ids in sampled_token_ids):
            caps = torch.tensor(
                [s.num_speculative_tokens if len(ids) else 0 for ids in sampled_token_ids],
                dtype=torch.int32,
            )
        kw = dict(min_n=s.min_n, max_n=s.max_n, num_speculative_tokens=s.num_speculative_tokens)
        kw.update(max_model_len=s.max_model_len, max_draft_tokens=caps, tie_break=s.tie_break)
        if s.scoring == "frequency":
            p, f, o = s.frequency
            kw.update(scoring="frequency", min_token_prob=p, max_spec_factor=f, max_spec_offset=o)
        if not s.index:  # a rescan of every history
            proposal = ngram_propose(token_ids[:B], num_tokens[:B], **kw, validate=False)
        else:
            proposal = self._from_index(token_ids, num_tokens, B, kw)
        drafts, counts = proposal.draft_token_ids.tolist(), proposal.num_draft_tokens.tolist()
        return [row[:c] for row, c in zip(drafts, counts, strict=True)]

    def _from_index(self, token_ids, num_tokens, B, kw):
        R = token_ids.shape[0]
        if num_tokens.shape[0] != R:  # allowed ([>= B] each): rows past B are never read
            lengths = torch.zeros(R, dtype=torch.int32)
            n = min(R, num_tokens.shape[0])
            lengths[:n] = num_tokens[:n]
            num_tokens = lengths
        self._state(tuple(token_ids.shape))
        index = self._index
        rebuild, extend, left = self._rows.update(token_ids.numpy(), num_tokens.numpy(), B)
        if rebuild.size:
            rows = torch.from_numpy(rebuild)
            ngram_index_build(token_ids, num_tokens, rows, index=index, validate=False)
        if self._corpus is not None and left:
            self._add_documents(left)
        batch = self._batch_views.get(B)
        if batch is None:  # views of the first B rows, made once per batch size
            batch = type(index)(*(t[:B] for t in index[:-2]), index.min_n, index.max_n)
            self._batch_views[B] = batch
        # the rows that grew (``extend``, all among the first B) are extended in the same call
        return ngram_propose(
            token_ids[:B], num_tokens[:B], **kw, index=batch, corpus=self._corpus,
            extend_index=bool(extend.size), validate=False,
        )  # fmt: skip

    def _add_documents(self, histories: list[np.ndarray]) -> None:
        """The requests that left the batch and finished join the corpus (``corpus_documents``
        says which: a preempted request, which will come back, never does by default)."""
        s = self.settings
        if s.corpus_documents == "finished":
            histories = [
                h for h in histories
                if h.shape[0] >= s.max_model_len or np.isin(h[-1], self._stops)
            ]  # fmt: skip
        if not histories:
            return
        width = max(h.shape[0] for h in histories)
        docs = np.zeros((len(histories), width), dtype=np.int32)
        for i, h in enumerate(histories):
            docs[i, : h.shape[0]] = h
        lens = torch.tensor([h.shape[0] for h in histories], dtype=torch.int32)
        corpus_append(torch.from_numpy(docs), lens, corpus=self._corpus, validate=False)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model to load (vLLM calls this with the target model when present)."""
