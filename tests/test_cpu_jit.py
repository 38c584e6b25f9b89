"""The numba CPU path as a process sees it: two threads at once, a forked worker, one thread
per call, the on-disk cache, and its Philox against the torch one bit for bit."""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from specdec_kernels.cpu import philox as torch_philox
from specdec_kernels.cpu import sampling
from specdec_kernels.cpu._jit import borrowed, jit
from specdec_kernels.ops import ngram_propose, rejection_sample


def _work(seed: int):
    """A sampled verification and an n-gram proposal on inputs made from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    B, k, V = 4, 3, 700
    logits = torch.randn(B * (k + 1), V, generator=g) * 3
    drafts = torch.randint(0, V, (B * k,), generator=g, dtype=torch.int32)
    cu = torch.arange(0, B * k + 1, k, dtype=torch.int32)
    rs = rejection_sample(
        logits, drafts, cu, num_speculative_tokens=k, temperature=torch.full((B,), 0.9),
        seeds=torch.arange(B) + seed, offsets=torch.zeros(B, dtype=torch.int64),
        return_logprobs=True,
    )  # fmt: skip
    tok = torch.randint(0, 5, (B, 300), generator=g, dtype=torch.int32)
    prop = ngram_propose(
        tok, torch.full((B,), 300, dtype=torch.int32), min_n=1, max_n=4, num_speculative_tokens=4
    )
    return [t.clone() for t in (*rs, *prop)]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_two_threads_at_once_get_what_one_thread_gets():
    want = {s: _work(s) for s in range(6)}
    got: dict[int, list] = {}
    errors: list[BaseException] = []

    def run(seeds):
        try:
            for _ in range(5):
                for s in seeds:
                    got[s] = _work(s)
                    assert _same(got[s], want[s])
        except BaseException as e:  # noqa: BLE001 (reported by the main thread)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(range(i, 6, 2),)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def _in_child(queue):
    queue.put([t.numpy() for t in _work(3)])


@pytest.mark.skipif(sys.platform == "win32", reason="no fork on Windows")
def test_a_forked_worker_gets_what_the_parent_gets():
    want = _work(3)  # the parent has compiled and run the kernels before forking
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_in_child, args=(queue,))
    proc.start()
    got = queue.get(timeout=120)
    proc.join(timeout=120)
    assert proc.exitcode == 0
    assert _same([torch.from_numpy(a) for a in got], want)


def test_every_cpu_kernel_is_serial_cached_and_releases_the_gil():
    # no numba thread pool (parallel=False: one thread per call, nothing to break in a fork),
    # compiled once per machine (cache=True), and callable from several threads (nogil)
    import importlib
    import pkgutil

    from numba.core.registry import CPUDispatcher

    import specdec_kernels.cpu as cpu

    kernels = []
    for info in pkgutil.iter_modules(cpu.__path__):
        module = importlib.import_module(f"specdec_kernels.cpu.{info.name}")
        kernels += [f for f in vars(module).values() if isinstance(f, CPUDispatcher)]
    assert len(kernels) > 20
    for f in kernels:
        opts = f.targetoptions
        assert not opts.get("parallel") and opts.get("nogil"), f
        assert type(f._cache).__name__ != "NullCache", f  # cache=True


def test_compiled_kernels_are_cached_on_disk(tmp_path):
    # a fresh process with an empty cache compiles and writes it; a second one loads it
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    code = "import torch, specdec_kernels.ops as o; o.ngram_propose(torch.zeros((1, 4), dtype=torch.int32), torch.ones(1, dtype=torch.int32), min_n=1, max_n=2, num_speculative_tokens=2)"  # noqa: E501
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    cached = list(tmp_path.rglob("*.nbi"))
    assert cached, "nothing was written to the numba cache"

    def files():
        return {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}

    before = files()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    assert files() == before, "the second process compiled again instead of loading the cache"


def test_editing_a_helper_module_recompiles_the_kernels_that_inline_it(tmp_path):
    # numba's cache checks only a kernel's own file; rejection's kernel inlines argmax from
    # cpu/sampling.py, so the cache stamp carries a digest of every cpu/ source
    import shutil

    root = pathlib.Path(__file__).resolve().parent.parent
    for name in ("specdec_kernels", "ops"):
        shutil.copytree(root / name, tmp_path / name, ignore=shutil.ignore_patterns("*.nb*"))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(tmp_path))
    code = (
        "import torch, specdec_kernels.ops as o; "
        "print(o.rejection_sample(torch.eye(3), torch.tensor([0, 1], dtype=torch.int32), "
        "torch.tensor([0, 2], dtype=torch.int32), num_speculative_tokens=2)"
        ".output_token_ids.tolist())"
    )

    def run():
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=tmp_path, check=True, timeout=300,
            capture_output=True, text=True,
        )  # fmt: skip
        return done.stdout.strip()

    assert run() == "[[0, 1, 2]]"
    helper = tmp_path / "specdec_kernels" / "cpu" / "sampling.py"
    text = helper.read_text()
    assert "    return max(i, 0)\n" in text
    helper.write_text(text.replace("    return max(i, 0)\n", "    return 0  # edited\n"))
    assert run() == "[[0, 0, -1]]"  # argmax now says 0: recompiled, not the cached code


def test_numba_philox_is_the_torch_philox_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(2**63), 2**63 - 1, (500,), generator=g)
    counters = torch.randint(0, 2**62, (500,), generator=g)
    for stream in (0, 1):
        want = torch_philox.philox_uniform(seeds, counters, stream).numpy()
        pairs = zip(seeds.tolist(), counters.tolist(), strict=True)
        got = np.array([sampling.philox_uniform(s, c, stream) for s, c in pairs], np.float32)
        assert np.array_equal(got, want)


def test_exp2_polynomial_is_float32_exp2_to_rounding():
    z = -np.linspace(0, 126, 2_000_001, dtype=np.float32)[:-1]
    out = np.zeros_like(z)
    sampling.exp2_scaled(z, np.float32(0), np.float32(1), out)
    want = np.exp2(z.astype(np.float64))
    assert out[0] == 1.0  # exactly: the maximum's weight
    assert np.max(np.abs(out - want) / want) < 2e-7
    z = np.array([-126.0, -200.0, np.nan], dtype=np.float32)
    sampling.exp2_scaled(z, np.float32(0), np.float32(1), out[:3])
    assert out[:3].tolist() == [0.0, 0.0, 0.0]  # subnormal or no weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bit_key_maximum_and_first_maximal_id_are_torch_with_nan_as_neg_inf(dtype):
    # row_max and argmax work on the raw bits: NaN of either sign, -0 beside +0, infinities,
    # maxima in a later block, all against torch on the NaN-cleared row.
    g = torch.Generator().manual_seed(5)
    V = 2 * sampling.BLOCK + 300
    specials = torch.tensor([float("nan"), -float("nan"), 0.0, -0.0, float("inf"), -float("inf")])
    rows = []
    for r in range(60):
        row = torch.randn(V, generator=g) * 4 - (30 if r % 3 else 0)
        hits = torch.randint(0, V, (int(torch.randint(0, 40, (1,), generator=g)),), generator=g)
        row[hits] = specials[torch.randint(0, 6, hits.shape, generator=g)]
        if r % 5 == 0:
            row = torch.where(row > 0, torch.zeros(()), row)  # maxima -0 and +0 mixed
            row[torch.randint(0, V, (9,), generator=g)] = -0.0
        rows.append(row)
    rows += [torch.full((V,), float("nan")), torch.full((V,), -float("inf"))]
    rows = torch.stack(rows).to(dtype)
    f32, u16 = _rows(rows)
    buf = np.zeros(sampling.BLOCK, dtype=np.float32)
    clean = rows.float().masked_fill(rows.isnan(), -float("inf"))
    want_max = clean.max(dim=1).values
    first = (clean == want_max[:, None]).int().argmax(dim=1)  # the first maximal id
    for g_ in range(rows.shape[0]):
        m = sampling.row_max(f32, u16, dtype == torch.bfloat16, g_, V, buf)
        assert m == want_max[g_].item(), g_
        assert sampling.argmax(f32, u16, dtype == torch.bfloat16, g_, V, buf) == first[g_], g_


def _rows(rows: torch.Tensor):
    from specdec_kernels.cpu._jit import float_rows

    return float_rows(rows, rows.shape[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_pass_weights_are_the_two_pass_weights_to_float32_rounding(dtype):
    # row_weights finds the maximum block by block and rescales the blocks taken against an
    # older one; it must give the two-pass weights (row_max, then weights) to rounding,
    # exactly 1 at the maximum, and fall back to two passes for NaN, +inf and extreme T.
    g = torch.Generator().manual_seed(6)
    V = 3 * sampling.BLOCK + 200
    rows = torch.randn(12, V, generator=g) * 3
    rows[1] += torch.linspace(0, 40, V)  # the maximum grows block after block
    rows[2] -= torch.linspace(0, 40, V)  # the maximum is in the first block
    rows[3, 5::7] = -float("inf")
    rows[4, 100] = float("nan")  # a positive NaN: two passes
    rows[5, 2000] = float("inf")  # an infinite maximum: two passes
    rows[6, : 2 * sampling.BLOCK] = -float("inf")  # the first blocks have no weight
    rows[7] = -float("inf")
    rows = rows.to(dtype)
    f32, u16 = _rows(rows)
    bf16 = dtype == torch.bfloat16
    nb = (V + sampling.BLOCK - 1) // sampling.BLOCK
    buf = np.zeros(sampling.BLOCK, dtype=np.float32)
    for T in (1.0, 0.05, 7.0, 1e-30):
        for r in range(rows.shape[0]):
            w1, b1 = np.zeros(V, np.float32), np.zeros(nb)
            m, total = sampling.row_weights(
                f32, u16, bf16, r, V, np.float32(T), w1, b1, np.zeros(nb, np.float32), buf
            )
            w2, b2 = np.zeros(V, np.float32), np.zeros(nb)
            m2 = sampling.row_max(f32, u16, bf16, r, V, buf)
            total2 = sampling.weights(f32, u16, bf16, r, V, m2, np.float32(T), w2, b2, buf)
            assert m == m2 or (np.isnan(m) and np.isnan(m2)), (T, r)
            # z = (l - r) s + (r - m) s rounds apart from (l - m) s by ~|z| * 1e-7: a weight
            # 2**z differs by up to ~1e-5 relative where z nears -126, by ~1e-7 near the top
            np.testing.assert_allclose(w1, w2, rtol=2e-5, atol=1e-37, err_msg=f"T={T} row {r}")
            assert np.abs(w1 - w2).sum() <= 1e-6 * w2.sum(), (T, r)  # the mass: to rounding
            np.testing.assert_allclose(b1, b2, rtol=2e-5, err_msg=f"T={T} row {r}")
            assert total == pytest.approx(total2, rel=1e-6)
            if np.isfinite(m2):
                first = int(np.argmax(w2))
                assert w1[first] == 1.0 and w2[first] == 1.0


@pytest.mark.parametrize("with_rows", [False, True])
@pytest.mark.parametrize("with_other", [False, True])
def test_batch_row_statistics_of_the_value_checks_are_those_of_indexing(with_rows, with_other):
    # the CPU pass of rows_stats against the indexing it replaces (the path other devices take)
    from specdec_kernels.ops import _validation

    gen = torch.Generator().manual_seed(3)
    for trial in range(40):
        R = int(torch.randint(1, 9, (1,), generator=gen))
        values = torch.randint(-50, 50, (R,), generator=gen, dtype=torch.int32)
        other = torch.randint(-50, 50, (R,), generator=gen, dtype=torch.int32)
        B = int(torch.randint(0, R + 1, (1,), generator=gen))
        rows = torch.randint(-1, R, (B,), generator=gen, dtype=torch.int32)
        req = rows if with_rows else None
        oth = other if with_other else None
        got = _validation.rows_stats(values, req, B, oth)
        picked = rows[rows >= 0].long() if with_rows else torch.arange(B)
        v = values[picked]
        if not v.numel():
            assert got == (0, 0, 0, 0, 0), trial
            continue
        gap = v - other[picked] if with_other else torch.zeros(1, dtype=torch.int32)
        want = (v.numel(), int(v.min()), int(v.max()), int(gap.min()), int(gap.max()))
        assert tuple(int(x) for x in got) == want, trial


@jit
def _through_borrowed(a, b):
    """Writes through a borrowed array and through a borrowed tuple's arrays, then reads
    them back from the originals."""
    v = borrowed(a)
    v[0] = 7.0
    t = borrowed((a, np.int64(3), b, True))
    t[2][1] = t[1] + 2
    return a[0] + b[1] + t[0][2] + (t[3] and v.shape[0] == a.shape[0])


def test_borrowed_views_are_the_arrays_themselves():
    a, b = np.arange(4, dtype=np.float32), np.zeros(2, dtype=np.int64)
    assert _through_borrowed(a, b) == 7.0 + 5 + 2.0 + 1
    assert a[0] == 7.0 and b[1] == 5  # the writes reached the caller's arrays


@jit
def _borrow_nested(a):
    return borrowed((a, (a,)))[0][0]


def test_borrowed_refuses_what_it_would_release_once_too_often():
    # a nested tuple returned as it is would be released once more than it was counted
    import numba

    with pytest.raises(numba.core.errors.TypingError):
        _borrow_nested(np.zeros(2))
