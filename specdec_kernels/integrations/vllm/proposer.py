"""A vLLM ``custom_class`` proposer that drafts with :func:`specdec_kernels.ops.ngram_propose`.

vLLM (0.33.0) loads it from ``speculative_config={"method": "custom_class", "model":
"specdec_kernels.integrations.vllm.NgramProposer", "num_speculative_tokens": k}``
(``vllm/v1/spec_decode/custom_class_proposer.py``), constructs it with the ``VllmConfig``
and, on the V1 model runner, calls ``propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu, slot_mappings=...)`` after every step. Nothing here imports vLLM: the
config is read by attribute, and the arrays are vLLM's host-side numpy buffers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from specdec_kernels.ops import ngram_propose

CONFIG_KEY = "specdec_kernels"
"""Key of this library's section in vLLM's ``additional_config``."""

NGRAM_OPTIONS = ("prompt_lookup_min", "prompt_lookup_max", "tie_break")
"""Keys the proposer reads from ``additional_config["specdec_kernels"]``."""

DEFAULT_NGRAM = 5
"""vLLM's default ``prompt_lookup_min = prompt_lookup_max`` when neither is given."""


class NgramSettings(NamedTuple):
    """What :class:`NgramProposer` drafts with, resolved from a ``VllmConfig``."""

    min_n: int
    """Shortest n-gram matched (vLLM ``prompt_lookup_min``), ``>= 1``."""
    max_n: int
    """Longest n-gram matched (vLLM ``prompt_lookup_max``), ``>= min_n``."""
    num_speculative_tokens: int
    """``k``: at most this many drafts per request and step."""
    max_model_len: int
    """Drafts never take a request past this many tokens."""
    tie_break: str
    """``"first"`` (leftmost match: vLLM's CPU proposer) or ``"last"`` (most recent)."""


def _section(vllm_config: Any) -> Mapping[str, Any]:
    extra = getattr(vllm_config, "additional_config", None) or {}
    if not isinstance(extra, Mapping):
        return {}
    section = extra.get(CONFIG_KEY, {}) or {}
    if not isinstance(section, Mapping):
        raise ValueError(
            f"additional_config[{CONFIG_KEY!r}] must be a dict, got {type(section).__name__}"
        )
    unknown = sorted(set(section) - set(NGRAM_OPTIONS))
    if unknown:
        raise ValueError(
            f"additional_config[{CONFIG_KEY!r}] has unknown keys {unknown}; "
            f"the proposer reads {list(NGRAM_OPTIONS)}"
        )
    return section


def _positive_or_none(name: str, value: Any) -> int | None:
    # vLLM 0.33.0 sets prompt_lookup_min/max to 0 for method="custom_class": 0 means unset
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 0):
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def ngram_settings(vllm_config: Any) -> NgramSettings:
    """Resolve the n-gram drafting parameters from a vLLM ``VllmConfig``.

    ``prompt_lookup_min`` / ``prompt_lookup_max`` come from ``speculative_config`` when set
    there (>= 1), else from ``additional_config["specdec_kernels"]``: vLLM 0.33.0 resets
    both to 0 for ``method="custom_class"`` (``vllm/config/speculative.py``), so with that
    version they must be passed in ``additional_config``. Missing values follow vLLM's
    n-gram method: neither given means 5 and 5, one given sets both. ``k`` is
    ``speculative_config.num_speculative_tokens`` and the length cap is
    ``model_config.max_model_len``, as vLLM's own ``NgramProposer`` reads them.

    Parameters
    ----------
    vllm_config : vllm.config.VllmConfig
        The engine's configuration (any object with the same attributes).

    Returns
    -------
    NgramSettings

    Raises
    ------
    ValueError
        No ``speculative_config``; ``num_speculative_tokens`` or ``max_model_len`` not an
        int >= 1; a ``prompt_lookup_*`` value not an int >= 1 or given differently in both
        places; ``prompt_lookup_min > prompt_lookup_max``; ``additional_config
        ["specdec_kernels"]`` not a dict or with keys other than ``prompt_lookup_min``,
        ``prompt_lookup_max``, ``tie_break``; ``tie_break`` not ``"first"`` or ``"last"``.
    """
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None:
        raise ValueError("vllm_config.speculative_config is None: speculative decoding is off")
    section = _section(vllm_config)
    bounds = {}
    for name in ("prompt_lookup_min", "prompt_lookup_max"):
        from_spec = _positive_or_none(f"speculative_config.{name}", getattr(spec, name, None))
        from_extra = _positive_or_none(
            f"additional_config[{CONFIG_KEY!r}][{name!r}]", section.get(name)
        )
        if from_spec is not None and from_extra is not None and from_spec != from_extra:
            raise ValueError(
                f"{name} is {from_spec} in speculative_config but {from_extra} in "
                f"additional_config[{CONFIG_KEY!r}]; give it once"
            )
        bounds[name] = from_spec if from_spec is not None else from_extra
    lo, hi = bounds["prompt_lookup_min"], bounds["prompt_lookup_max"]
    if lo is None and hi is None:
        lo = hi = DEFAULT_NGRAM
    elif lo is None:
        lo = hi
    elif hi is None:
        hi = lo
    if lo > hi:
        raise ValueError(f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
    k = spec.num_speculative_tokens
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"speculative_config.num_speculative_tokens must be >= 1, got {k!r}")
    max_model_len = vllm_config.model_config.max_model_len
    if not isinstance(max_model_len, int) or max_model_len < 1:
        raise ValueError(f"model_config.max_model_len must be an int >= 1, got {max_model_len!r}")
    tie_break = section.get("tie_break", "first")
    if tie_break not in ("first", "last"):
        raise ValueError(f"tie_break must be 'first' or 'last', got {tie_break!r}")
    return NgramSettings(lo, hi, k, max_model_len, tie_break)


def _as_int32(name: str, array: Any, ndim: int) -> torch.Tensor:
    a = array.numpy(force=True) if isinstance(array, torch.Tensor) else np.asarray(array)
    if a.ndim != ndim or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} must be a {ndim}-D integer array, got {a.dtype} {a.shape}")
    if a.dtype != np.int32:
        a = a.astype(np.int32)
    return torch.from_numpy(a)


class NgramProposer:
    """vLLM ``custom_class`` proposer: own-history n-gram drafts from ``ngram_propose``.

    Drafts exactly what vLLM's CPU ``NgramProposer`` drafts (``tie_break="first"``, the
    default: the longest n in ``[prompt_lookup_min, prompt_lookup_max]``, then the leftmost
    earlier occurrence), with the same skips: a request whose ``sampled_token_ids`` entry
    is empty (a partial prefill, or a discarded sample) and a request with
    ``num_tokens_no_spec >= max_model_len`` get no drafts, and no draft takes a request
    past ``max_model_len``. Runs the CPU path of ``ngram_propose`` on vLLM's host buffers
    (no copy of ``token_ids_cpu``, no device transfer), like vLLM's numba proposer.

    Parameters
    ----------
    vllm_config : vllm.config.VllmConfig
        Read by :func:`ngram_settings` (see there for the ``additional_config`` keys).

    Raises
    ------
    ValueError
        From :func:`ngram_settings`.
    """

    def __init__(self, vllm_config: Any):
        self.settings = ngram_settings(vllm_config)

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
        s = self.settings
        caps = torch.tensor(
            [s.num_speculative_tokens if len(ids) else 0 for ids in sampled_token_ids],
            dtype=torch.int32,
        )
        proposal = ngram_propose(
            token_ids[:B],
            num_tokens[:B],
            min_n=s.min_n,
            max_n=s.max_n,
            num_speculative_tokens=s.num_speculative_tokens,
            max_model_len=s.max_model_len,
            max_draft_tokens=caps,
            tie_break=s.tie_break,
        )
        drafts, counts = proposal.draft_token_ids.tolist(), proposal.num_draft_tokens.tolist()
        return [row[:c] for row, c in zip(drafts, counts, strict=True)]

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model to load (vLLM calls this with the target model when present)."""
