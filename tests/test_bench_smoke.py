"""Smoke tests of bench/: the baselines are right, the suites run, the GPU parts import.

No timing is asserted (timings live in bench/results). The CPU suite runs at its tiny
``--quick`` shapes; the GPU suite's check-and-report logic runs on CPU tensors with the
timers stubbed out (no GPU numbers are produced or written).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec_kernels.reference.ngram import ngram_propose as reference_ngram

ROOT = Path(__file__).resolve().parents[1]


def _random_ngram_batches(seed: int, count: int):
    """Small histories over tiny alphabets (many matches), with every optional argument."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        B, L_max, V = int(rng.integers(1, 6)), int(rng.integers(1, 40)), int(rng.integers(1, 5))
        tok = rng.integers(0, V, (B, L_max)).astype(np.int32)
        lengths = rng.integers(0, L_max + 1, B).astype(np.int32)
        min_n = int(rng.integers(1, 4))
        kw = {
            "min_n": min_n,
            "max_n": min_n + int(rng.integers(0, 4)),
            "num_speculative_tokens": int(rng.integers(1, 6)),
            "max_model_len": None if rng.random() < 0.5 else int(rng.integers(1, 50)),
        }
        yield tok, lengths, kw, rng


def test_numba_kmp_baseline_equals_reference():
    pytest.importorskip("numba")
    from bench.baselines.ngram_numba import ngram_propose_numba

    for tok, lengths, kw, rng in _random_ngram_batches(0, 150):
        B = tok.shape[0]
        rows = None
        if rng.random() < 0.5:  # permuted rows with padding (-1)
            rows = rng.permutation(np.r_[np.arange(B), -1, -1]).astype(np.int32)[:B]
        caps = None if rng.random() < 0.5 else rng.integers(0, 7, B).astype(np.int32)
        for tie_break in ("first", "last"):
            got = ngram_propose_numba(
                tok, lengths, rows, max_draft_tokens=caps, tie_break=tie_break, **kw
            )
            t = lambda a: None if a is None else torch.from_numpy(a)  # noqa: E731
            want = reference_ngram(
                t(tok), t(lengths), t(rows), t(caps), None, None, tie_break=tie_break, **kw
            )
            np.testing.assert_array_equal(got[0], want[0].numpy())
            np.testing.assert_array_equal(got[1], want[1].numpy())


def test_torch_eager_ngram_baseline_equals_reference():
    from bench.baselines.ngram_torch import ngram_propose_torch

    for tok, lengths, kw, _ in _random_ngram_batches(1, 150):
        tok_t, len_t = torch.from_numpy(tok), torch.from_numpy(lengths)
        got = ngram_propose_torch(tok_t, len_t, **kw)
        want = reference_ngram(tok_t, len_t, None, None, None, None, tie_break="first", **kw)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_token_stream_is_real_repetitive_text():
    from bench import data

    tokens, lengths = data.ngram_histories(2, 1024)
    assert tokens.dtype == torch.int32 and tokens.shape == (2, 1024)
    assert torch.equal(lengths, torch.full((2,), 1024, dtype=torch.int32))
    assert not torch.equal(tokens[0], tokens[1])  # different windows of the stream
    # real code repeats: a few hundred distinct ids in 1024 tokens, not ~1000 as noise gives
    assert len(torch.unique(tokens[0])) < 600
    assert data.tokenize("def f(x):\n    return x") == [
        "def",
        " ",
        "f",
        "(",
        "x",
        ")",
        ":",
        "\n    ",
        "return",
        " ",
        "x",
    ]


def test_cpu_suite_quick_run_writes_table_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from bench.__main__ import run

    threads = torch.get_num_threads()
    try:
        md = run(["--quick", "--budget", "0.005", "--threads", "1", "--out", str(tmp_path)])
    finally:  # run() sets the process-wide thread count
        torch.set_num_threads(threads)
    text = md.read_text()
    for op in (
        "ngram_propose",
        "rejection_sample",
        "compute_slot_mapping",
        "prepare_verify_inputs",
        "commit_accepted_tokens",
    ):
        assert op in text
    assert "speedup vs torch" in text and "exactly" in text
    assert md.with_suffix(".png").stat().st_size > 10_000


def test_gpu_suite_logic_runs_on_cpu_with_stub_timers(monkeypatch, tmp_path):
    pytest.importorskip("triton")
    import bench.gpu as gpu
    import bench.gpu_cases as cases
    from bench import cases_ngram, cases_rejection

    calls = []

    def fake_time(fn, **_):  # run once (so the call is exercised), report no real number
        fn()
        calls.append(fn)
        return (1.0, 1.0, 1.0)

    monkeypatch.setattr(gpu, "DEVICE", "cpu")
    monkeypatch.setattr(gpu, "time_kernel", fake_time)
    monkeypatch.setattr(gpu, "time_graph", lambda fn, **_: None)
    monkeypatch.setattr(gpu, "time_host", fake_time)
    monkeypatch.setattr(gpu, "time_steps", fake_time)
    monkeypatch.setattr(gpu, "_graph_steps", lambda step, calls: None)
    rows = gpu.Rows()
    cases.bench_ngram(rows, cases_ngram.QUICK_SPECS[:1], graphs=True)
    cases.bench_rejection(rows, [s for s in cases_rejection.QUICK_SPECS if s["dtype"] == "fp32"])
    cases.bench_bookkeeping(rows, (3,), graphs=True)
    cases.bench_ngram_index(rows, [{"B": 2, "L": 64, "k": 2, "corpus": 256}], graphs=True)
    cases.bench_processing(rows, [{"B": 2, "V": 1000, "L": 64, "features": "all"}])
    from bench import gpu_frequency

    gpu_frequency.bench_frequency(rows, gpu_frequency.QUICK_SPECS, graphs=True)
    text = gpu.render(rows, gpu="(stub)", copy_bw=1.0, elapsed=0.0, argv=[])
    assert len(calls) >= 10 and "commit_accepted_tokens" in text
    assert all("exactly" in n or "uniforms" in n or "bit for bit" in n for n in rows.notes)
    assert "process_logits" in text and "frequency step" in text
    from bench import cases_logprobs  # raw and processed modes (values compared to 1e-5)

    cases.bench_logprobs(rows, cases_logprobs.QUICK_SPECS)
    assert sum("top_logprobs" in n and "CUDA op == CPU op" in n for n in rows.notes) == 2


def test_gpu_check_script_parses_and_module_refuses_without_cuda():
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    script = ROOT / "bench" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    if not torch.cuda.is_available():
        import bench.gpu as gpu

        assert gpu.main(["--quick"]) == 2  # no CUDA: nothing timed, nothing written


def test_cpu_goals_takes_the_median_over_runs_and_the_right_goal():
    from bench import cpu_goals

    def run(op_us, numba_us, softmax_us):
        return [
            {"op": "ngram_propose", "spec": {"B": 1, "L": 1024, "k": 4}, "impl": "op",
             "median": op_us},
            {"op": "ngram_propose", "spec": {"B": 1, "L": 1024, "k": 4}, "impl": "numba",
             "median": numba_us},
            {"op": "rejection_sample", "spec": {"B": 8, "V": 32000, "mode": "probs"},
             "impl": "op", "median": 150.0},
            {"op": "rejection_sample", "spec": {"B": 8, "V": 32000, "mode": "probs"},
             "impl": "softmax", "median": softmax_us},
            {"op": "rejection_sample", "spec": {"B": 8, "V": 32000, "mode": "greedy"},
             "impl": "op", "median": 1.0},
        ]  # fmt: skip

    # numba/op 0.4, 0.6, 0.55 -> median 0.55 (B = 1: >= 0.5); softmax/op 0.6 -> missed 2/3
    rows = cpu_goals.cells([run(25.0, 10.0, 90.0), run(20.0, 12.0, 90.0), run(20.0, 11.0, 90.0)])
    by_op = {r["op"]: r for r in rows}
    assert set(by_op) == {"ngram_propose", "rejection_sample"}  # greedy rows left out
    assert by_op["ngram_propose"]["median"] == pytest.approx(0.55) and by_op["ngram_propose"]["ok"]
    assert by_op["rejection_sample"]["goal"] == "within 1.5x of softmax"
    assert not by_op["rejection_sample"]["ok"]


def test_overhead_cuda_mode_runs_every_case_on_cpu_with_stubbed_cuda(monkeypatch, tmp_path):
    # bench.overhead --device cuda (run by gpu_check.sh): its loop and report, here on CPU
    # tensors with the CUDA calls stubbed (no GPU number is produced)
    from bench import overhead

    to = overhead._to
    monkeypatch.setattr(overhead, "_to", lambda value, device: to(value, "cpu"))
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "Stub GPU")
    assert overhead.main(["--device", "cuda", "--rounds", "2", "--repeats", "1",
                          "--out", str(tmp_path)]) == 0  # fmt: skip
    (report,) = tmp_path.glob("*-overhead-stub-gpu.md")
    text = report.read_text()
    assert "| rejection_sample-greedy |" in text and "| ngram_propose-scan |" in text
