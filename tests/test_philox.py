"""Philox4x32-10: known-answer vectors, Triton == torch == Python ints, the uniform mapping."""

from __future__ import annotations

import pytest
import torch

from specdec_kernels.cpu import philox as cpu_philox
from specdec_kernels.kernels import philox as triton_philox
from specdec_kernels.reference import rejection as ref

# Random123's kat_vectors for philox4x32_10: (counter words, key words, output words).
KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    (
        [0xFFFFFFFF] * 4,
        [0xFFFFFFFF] * 2,
        [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD],
    ),
    (
        [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
        [0xA4093822, 0x299F31D0],
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
    ),
]
KAT_IDS = ["zeros", "all-ones", "pi-digits"]


@pytest.mark.parametrize("ctr,key,want", KAT, ids=KAT_IDS)
def test_python_int_philox_matches_known_answers(ctr, key, want):
    assert ref.philox4x32_10(ctr, key) == want


@pytest.mark.parametrize("ctr,key,want", KAT, ids=KAT_IDS)
def test_torch_philox_matches_known_answers(ctr, key, want):
    words = [torch.tensor([w]) for w in ctr + key]
    got = cpu_philox.philox4x32_10(*words)
    assert [int(g) for g in got] == want
    assert all(g.dtype == torch.int64 for g in got)


def test_triton_philox_matches_known_answers(kernel_device):
    ctr = torch.tensor([c for c, _, _ in KAT], dtype=torch.int64, device=kernel_device)
    key = torch.tensor([k for _, k, _ in KAT], dtype=torch.int64, device=kernel_device)
    want = torch.tensor([w for _, _, w in KAT], dtype=torch.int64)
    assert torch.equal(triton_philox.philox4x32(ctr, key).cpu(), want)


def _random_words(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2**32, (n, 6), generator=g, dtype=torch.int64)


def test_triton_and_torch_philox_words_bit_identical(kernel_device):
    words = _random_words(300, 1)
    want = torch.stack(cpu_philox.philox4x32_10(*words.T), dim=1)
    got = triton_philox.philox4x32(
        words[:, :4].to(kernel_device), words[:, 4:].to(kernel_device)
    ).cpu()
    assert torch.equal(got, want)


def _seeds_and_counters(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    seeds = torch.randint(-(2**63), 2**63 - 1, (n,), generator=g, dtype=torch.int64)
    counters = torch.randint(-(2**63), 2**63 - 1, (n,), generator=g, dtype=torch.int64)
    # Edge values: 0, -1 (all bits set), counters crossing the 32-bit boundary.
    edge = torch.tensor([0, -1, 2**32 - 1, 2**32, 2**63 - 1, -(2**63)], dtype=torch.int64)
    return torch.cat([seeds, edge, edge.flip(0)]), torch.cat([counters, edge, edge])


@pytest.mark.parametrize("stream", [0, 1])
def test_triton_and_torch_uniforms_bit_identical(stream, kernel_device):
    seeds, counters = _seeds_and_counters(500)
    want = cpu_philox.philox_uniform(seeds, counters, stream)
    got = triton_philox.philox_uniform_tensor(
        seeds.to(kernel_device), counters.to(kernel_device), stream
    ).cpu()
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_uniform_mapping_is_the_documented_one():
    """key = seed's low/high 32 bits, counter = (value low, value high, stream, 0), u = w0>>8."""
    seeds, counters = _seeds_and_counters(40)
    for stream in (0, 1):
        got = cpu_philox.philox_uniform(seeds, counters, stream)
        for s, c, u in zip(seeds.tolist(), counters.tolist(), got.tolist(), strict=True):
            s64, c64 = s & (2**64 - 1), c & (2**64 - 1)
            w0 = ref.philox4x32_10(
                [c64 & 0xFFFFFFFF, c64 >> 32, stream, 0], [s64 & 0xFFFFFFFF, s64 >> 32]
            )[0]
            assert u == (w0 >> 8) / 2**24 == ref.uniform(s, c, stream)


def test_uniforms_lie_on_the_24_bit_grid_in_unit_interval():
    seeds = torch.arange(20000, dtype=torch.int64)
    u = cpu_philox.philox_uniform(seeds, torch.zeros_like(seeds), 0).double()
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    scaled = u * 2**24
    assert torch.equal(scaled, scaled.floor())


def test_streams_and_counters_give_different_numbers():
    seeds = torch.full((1000,), 7, dtype=torch.int64)
    counters = torch.arange(1000, dtype=torch.int64)
    u0 = cpu_philox.philox_uniform(seeds, counters, 0)
    u1 = cpu_philox.philox_uniform(seeds, counters, 1)
    assert u0.unique().numel() > 990 and u1.unique().numel() > 990
    assert (u0 != u1).float().mean() > 0.99


def test_uniforms_are_uniform_chi_square():
    """20 equal bins, 100k draws over consecutive counters; false-failure rate 1e-6."""
    n, bins = 100_000, 20
    counters = torch.arange(n, dtype=torch.int64)
    u = cpu_philox.philox_uniform(torch.full((n,), 12345, dtype=torch.int64), counters, 1)
    counts = torch.bincount((u * bins).long(), minlength=bins).double()
    expected = n / bins
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    p_value = float(torch.special.gammaincc(torch.tensor((bins - 1) / 2), torch.tensor(chi2 / 2)))
    assert p_value > 1e-6, (chi2, p_value)
