"""Run by test_vllm_config.py in its own process: build real ``VllmConfig``s from local files
on vLLM's CPU platform, load the proposers as vLLM's model runner does, and print JSON.

``python vllm_config_check.py MODEL_DIR '["--speculative-config", ...]'``
(``VLLM_TARGET_DEVICE=cpu``): vLLM's CUDA wheel on
a machine without a GPU resolves no platform, and its config needs a device type; the
CPU platform gives one. It is a separate process because vLLM picks its platform once,
and the rejection-sampler tests need the other one (see conftest.py).
"""

from __future__ import annotations

import json
import sys

import numpy as np
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.spec_decode.custom_class_proposer import create_custom_proposer
from vllm.v1.spec_decode.ngram_proposer import NgramProposer as VllmNgramProposer


def main(model_dir: str, serve_flags: list[str]) -> None:
    # the README's `vllm serve` flags, parsed by vLLM's own serve parser
    argv = ["--model", model_dir, "--skip-tokenizer-init", "--max-model-len", "64"]
    argv += ["--max-num-seqs", "8", *serve_flags]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    ours_config = EngineArgs.from_cli_args(args).create_engine_config()
    ours = create_custom_proposer(ours_config)  # what GPUModelRunner.__init__ calls

    # vLLM's own n-gram method with the same range and k
    s = ours.settings
    theirs_config = EngineArgs(
        model=model_dir,
        skip_tokenizer_init=True,
        max_model_len=64,
        max_num_seqs=8,
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": s.num_speculative_tokens,
            "prompt_lookup_min": s.min_n,
            "prompt_lookup_max": s.max_n,
        },
    ).create_engine_config()
    theirs = VllmNgramProposer(theirs_config)

    rng = np.random.default_rng(0)
    token_ids = rng.integers(0, 4, size=(8, 64), dtype=np.int32)
    num_tokens = np.array([64, 63, 40, 17, 9, 5, 3, 2], dtype=np.int32)
    sampled = [[1], [1], [1], [], [1], [1], [1], [1]]
    # the opt-in corpus, through the same loader and a real config's additional_config
    with_corpus = EngineArgs(
        model=model_dir,
        skip_tokenizer_init=True,
        max_model_len=64,
        max_num_seqs=8,
        speculative_config={
            "method": "custom_class",
            "model": "specdec_kernels.integrations.vllm.NgramProposer",
            "num_speculative_tokens": s.num_speculative_tokens,
        },
        additional_config={
            "specdec_kernels": {
                "prompt_lookup_min": 2,
                "prompt_lookup_max": 5,
                "corpus_tokens": 512,
            }
        },
    ).create_engine_config()
    corpus_proposer = create_custom_proposer(with_corpus)
    spec = ours_config.speculative_config
    result = {
        "class": f"{type(ours).__module__}.{type(ours).__qualname__}",
        "settings": list(ours.settings),
        "method": spec.method,
        "prompt_lookup": [spec.prompt_lookup_min, spec.prompt_lookup_max],
        "use_v2_model_runner": ours_config.use_v2_model_runner,
        "ours": ours.propose(sampled, num_tokens, token_ids, slot_mappings=None),
        "theirs": theirs.propose(
            s.num_speculative_tokens, sampled, num_tokens, token_ids, slot_mappings=None
        ),
        "corpus_settings": list(corpus_proposer.settings),
        "with_corpus": corpus_proposer.propose(sampled, num_tokens, token_ids, slot_mappings=None),
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
