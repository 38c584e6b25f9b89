"""The proposer built from a real ``VllmConfig``, loaded by vLLM's own loader.

The config comes from the README's ``vllm serve`` flags, parsed by vLLM's serve parser,
over a hand-written tiny Llama ``config.json`` (no tokenizer, no weights, no hub access);
``create_custom_proposer`` imports and constructs the class as ``GPUModelRunner`` does.
vLLM picks its platform once per process, so this runs in a subprocess on vLLM's CPU
platform (vllm_config_check.py).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def readme_serve_flags() -> list[str]:
    """The flags of the README's ``vllm serve`` command ("Inside vLLM")."""
    section = README.read_text().split("## Inside vLLM", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    words = shlex.split(block.replace("\\\n", " "))
    assert words[:4] == ["SPECDEC_VLLM_REJECTION=1", "vllm", "serve", "<model>"]
    return words[4:]


def test_proposer_from_a_real_vllm_config(tmp_path):
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1")
    script = Path(__file__).with_name("vllm_config_check.py")
    out = subprocess.run(
        [sys.executable, str(script), str(model), json.dumps(readme_serve_flags())],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])

    assert result["class"] == "specdec_kernels.integrations.vllm.proposer.NgramProposer"
    assert result["method"] == "custom_class"
    # vLLM 0.33.0 zeroes these for custom classes: the range comes from additional_config
    assert result["prompt_lookup"] == [0, 0]
    assert result["settings"][:5] == [2, 5, 4, 64, "first"]  # the README's range and k
    assert result["settings"][5:8] == [True, 0, "finished"]  # the index by default, no corpus
    assert result["settings"][8] == [2]  # the model's EOS (config.json) ends a request
    # the opt-in corpus from a real config: with an empty corpus, the same drafts
    assert result["corpus_settings"][6] == 512
    assert result["with_corpus"] == result["ours"]
    # custom_class runs on the V1 model runner, whose rejection sampler the plugin wraps
    assert result["use_v2_model_runner"] is False
    assert result["ours"] == result["theirs"]
    assert result["ours"][0] == [] and result["ours"][3] == []  # at max_model_len; skipped
    assert sum(map(len, result["ours"])) > 0


def test_readme_llm_example_passes_what_the_serve_example_passes():
    section = README.read_text().split("## Inside vLLM", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    (call,) = [
        node
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "LLM"
    ]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg != "model"}
    flags = readme_serve_flags()
    serve = {
        flags[i][2:].replace("-", "_"): json.loads(flags[i + 1]) for i in range(0, len(flags), 2)
    }
    assert kwargs == serve
    assert 'os.environ["SPECDEC_VLLM_REJECTION"] = "1"' in code
