"""The one ``torch.library.Library`` of this project and its registration helpers.

Every op family module (``ops/<family>.py``) defines its schema here with
:func:`define`, registers a CPU impl (``specdec_kernels/cpu``), a CUDA impl
(``specdec_kernels/kernels``) and a fake (shape-only, built with ``new_empty``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

NAMESPACE = "specdec"

lib = torch.library.Library(NAMESPACE, "DEF")


def define(schema: str, *, cpu: Callable, cuda: Callable, fake: Callable) -> None:
    """Define ``specdec::<name>`` from ``schema`` and register its CPU, CUDA and fake impls."""
    name = schema.split("(", 1)[0]
    lib.define(schema)
    lib.impl(name, cpu, "CPU")
    lib.impl(name, cuda, "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
