"""The botocore request stream of the drafting replay (``bench/suffix_replay.py``).

botocore's AWS API models as a stream of structured outputs: JSON documents of one
schema, written by other people, pinned by version and wheel sha256 and read from the
wheel without installing it (bench-only; ``make test`` never downloads it).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from examples.corpus_replay import _ids
from examples.engine.model import cache_root

BOTOCORE = "botocore==1.35.99"
BOTOCORE_WHEEL = "botocore-1.35.99-py3-none-any.whl"
BOTOCORE_SHA256 = "b22d27b6b617fc2d7342090d6129000af2efd20174215948c0d7ae2da0fab445"


def botocore_wheel() -> Path:
    """botocore's pinned wheel, downloaded once (``pip download --only-binary``, no install)
    into ``streams/`` of the project's cache (``cache_root()``: ``$SPECDEC_CACHE`` or
    ``~/.cache/specdec-kernels``); kept only if its sha256 is the pinned one."""
    cache = cache_root() / "streams"
    wheel = cache / BOTOCORE_WHEEL
    if wheel.exists():
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "-d", tmp, BOTOCORE],
            check=True,
        )  # fmt: skip
        got = Path(tmp) / BOTOCORE_WHEEL
        digest = hashlib.sha256(got.read_bytes()).hexdigest() if got.exists() else "missing"
        if digest != BOTOCORE_SHA256:
            raise SystemExit(f"{BOTOCORE} wheel: sha256 {digest}, expected {BOTOCORE_SHA256}")
        os.replace(got, wheel)
    return wheel


def botocore_requests(prompt_lines: int, max_output: int, count: int):
    """(name, prompt ids, output ids) for the first ``count`` AWS API models of botocore
    1.35.99 (``botocore/data/<service>/<version>/service-2.json.gz``, in path order: 436
    models of 403 services, the older API versions of a service, e.g. cloudfront's, next
    to its newest): the prompt is the first ``prompt_lines`` lines (the format version and
    the service's metadata, which for some models ends before them and for others runs
    into the first operation), the output the rest, cut to ``max_output`` tokens (so
    mostly the operations): one JSON schema written by other people for every service,
    the way structured outputs resemble each other. Tokenised as the other streams
    (``bench/data.py``)."""
    cache: dict[str, int] = {}
    reqs = []
    with zipfile.ZipFile(botocore_wheel()) as z:
        models = sorted(n for n in z.namelist() if n.endswith("/service-2.json.gz"))
        for name in models[:count]:
            lines = gzip.decompress(z.read(name)).decode("utf-8").splitlines(keepends=True)
            prompt = _ids("".join(lines[:prompt_lines]), cache)
            output = _ids("".join(lines[prompt_lines:]), cache)[:max_output]
            reqs.append(("/".join(name.split("/")[2:4]), prompt, output))
    return reqs
