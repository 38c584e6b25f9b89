"""What the vLLM proposer drafts with, read from ``additional_config["specdec_kernels"]``.

Nothing here imports vLLM: the config is read by attribute (a ``VllmConfig`` or anything
with the same fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from specdec_kernels.ops import SCORINGS, TIE_BREAKS
from specdec_kernels.ops.frequency import check_depth, check_frequency_params

CONFIG_KEY = "specdec_kernels"
"""Key of this library's section in vLLM's ``additional_config``."""

NGRAM_OPTIONS = (
    "prompt_lookup_min",
    "prompt_lookup_max",
    "tie_break",
    "index",
    "max_index_bytes",
    "corpus_tokens",
    "corpus_documents",
    "stop_token_ids",
    "scoring",
    "min_token_prob",
    "max_spec_factor",
    "max_spec_offset",
)
"""Keys the proposer reads from ``additional_config["specdec_kernels"]``."""

DEFAULT_MAX_INDEX_BYTES = 4 << 30
"""The default cap on the own-history index (``max_index_bytes``)."""

CORPUS_DOCUMENTS = ("finished", "departed")
"""Which requests join the corpus when they leave vLLM's batch (``corpus_documents``)."""

DEFAULT_NGRAM = 5
"""vLLM's default ``prompt_lookup_min = prompt_lookup_max`` when neither is given."""

DEFAULT_DEPTH = 64
"""With ``scoring="frequency"``, the default ``prompt_lookup_max`` (the depth ``D``: context
plus drafts), SuffixDecoding's default tree depth; ``prompt_lookup_min`` defaults to 1."""

FREQUENCY_DEFAULTS = {"min_token_prob": 0.1, "max_spec_factor": 1.0, "max_spec_offset": 0.0}
"""SuffixDecoding's (vLLM's ``suffix`` method's) defaults of the frequency stop rules."""


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
    index: bool = True
    """Draft from an own-history index kept across steps (no rescan); False: rescan."""
    corpus_tokens: int = 0
    """Capacity of the shared corpus of earlier requests (0: no corpus)."""
    corpus_documents: str = "finished"
    """``"finished"``: a request that left the batch joins the corpus iff its last token is
    a stop token or it reached ``max_model_len``; ``"departed"``: every request that left
    (like vLLM's ``suffix`` method, which caches every response), a preempted one too. A
    request that only moved to another row has not left."""
    stop_token_ids: tuple[int, ...] = ()
    """The tokens that end a request (the ``eos_token_id`` of the model's config unless
    given; end-of-turn tokens only in ``generation_config.json`` must be given)."""
    max_index_bytes: int = DEFAULT_MAX_INDEX_BYTES
    """Cap on the index's memory; a larger index is a ``ValueError`` at construction."""
    scoring: str = "longest"
    """``ngram_propose``'s rule: ``"longest"`` (vLLM's n-gram drafts) or ``"frequency"``
    (SuffixDecoding's counts over each request's own history; ``max_n`` is the depth)."""
    frequency: tuple[float, float, float] = (0.1, 1.0, 0.0)
    """``(min_token_prob, max_spec_factor, max_spec_offset)`` of ``"frequency"``."""


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
        ``prompt_lookup_max``, ``tie_break``, ``index``, ``max_index_bytes``,
        ``corpus_tokens``, ``corpus_documents``, ``stop_token_ids``, ``scoring``,
        ``min_token_prob``, ``max_spec_factor``, ``max_spec_offset``; ``tie_break`` not
        ``"first"`` or ``"last"``; a bad value of one of the others; with ``scoring=
        "frequency"``: ``index: false``, ``tie_break``, ``prompt_lookup_min >=
        prompt_lookup_max``, a depth over ``FREQUENCY_MAX_DEPTH``, a corpus under 16 tokens;
        the frequency options with ``"longest"``.

    ``scoring="frequency"`` (SuffixDecoding's rule on a frequency index): the n range is
    the context lengths and ``prompt_lookup_max`` the depth ``D`` (defaults 1 and 64);
    ``min_token_prob``, ``max_spec_factor``, ``max_spec_offset`` default to 0.1, 1.0, 0.0.
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
    scoring = section.get("scoring", "longest")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    if scoring == "frequency":
        lo, hi = lo or 1, hi or DEFAULT_DEPTH
        check_depth(lo, hi)
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
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break must be 'first' or 'last', got {tie_break!r}")
    index = section.get("index", True)
    if not isinstance(index, bool):
        raise ValueError(f"index must be a bool, got {index!r}")
    corpus = _int_option(section, "corpus_tokens", 0, min_value=0)
    if corpus and not index:
        raise ValueError("corpus_tokens needs the own-history index (index: true)")
    documents = section.get("corpus_documents", "finished")
    if documents not in CORPUS_DOCUMENTS:
        raise ValueError(f"corpus_documents must be one of {CORPUS_DOCUMENTS}, got {documents!r}")
    stops = section.get("stop_token_ids")
    if stops is None:
        stops = _eos_token_ids(vllm_config)
    if not isinstance(stops, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in stops):
        raise ValueError(f"stop_token_ids must be a list of token ids >= 0, got {stops!r}")
    cap = _int_option(section, "max_index_bytes", DEFAULT_MAX_INDEX_BYTES, min_value=0)
    frequency = _frequency_options(section, scoring, index, corpus, lo)
    return NgramSettings(
        lo, hi, k, max_model_len, tie_break, index, corpus, documents, tuple(stops), cap,
        scoring, frequency,
    )  # fmt: skip


def _frequency_options(section, scoring, index, corpus, lo) -> tuple[float, float, float]:
    given = [name for name in FREQUENCY_DEFAULTS if name in section]
    if scoring == "longest":
        if given:
            raise ValueError(f"{', '.join(given)}: options of scoring='frequency' only")
        return tuple(FREQUENCY_DEFAULTS.values())
    if not index:
        raise ValueError("scoring='frequency' needs the own-history index (index: true)")
    if "tie_break" in section:
        raise ValueError("tie_break is an option of scoring='longest' only")
    if 0 < corpus < 8 * (lo + 2):
        raise ValueError(
            f"corpus_tokens with scoring='frequency' must be >= 8 (prompt_lookup_min + 2) = "
            f"{8 * (lo + 2)} slots, got {corpus}"
        )
    return check_frequency_params(*(section.get(name) for name in FREQUENCY_DEFAULTS))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_option(section: Mapping[str, Any], name: str, default: int, *, min_value: int) -> int:
    value = section.get(name, default)
    if not _is_int(value) or value < min_value:
        raise ValueError(f"{name} must be an int >= {min_value}, got {value!r}")
    return value


def _eos_token_ids(vllm_config: Any) -> list[int]:
    """The model's EOS token id(s) from its Hugging Face config, [] if it has none."""
    hf = getattr(getattr(vllm_config, "model_config", None), "hf_config", None)
    eos = getattr(hf, "eos_token_id", None)
    if eos is None:
        return []
    return [eos] if _is_int(eos) else [t for t in eos if _is_int(t)]
