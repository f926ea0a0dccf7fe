"""bench/perf/gpu_check.sh, the GPU run, proved on the CPU by its dry run: every step runs and reports."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEPS = ("peak", "kernel_tests", "attention", "train", "train_torch_embeddings", "score", "faiss")
# Each step's bound (the script's STEP_TIMEOUT, 150 s by default) catches a hung step, not a slow machine: on
# 2 cores under load a step takes minutes.
STEP_TIMEOUT_S = 900


def test_the_gpu_check_dry_run_runs_every_step_and_writes_json_lines(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "STEP_TIMEOUT": str(STEP_TIMEOUT_S)}
    run = subprocess.run(
        ["bash", "bench/perf/gpu_check.sh", "--dry-run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=len(STEPS) * STEP_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    status = {r["step"]: r["status"] for r in lines if "status" in r}
    assert status == dict.fromkeys(STEPS, "ok")
    results = {r["step"]: r for r in lines if "status" not in r}
    trains = {r["embeddings"]: r for r in lines if r["step"] == "train" and "status" not in r}
    assert set(trains) == {"fbgemm", "torch"} and trains["torch"]["steps"] == 3 and trains["torch"]["loss"] > 0
    assert results["kernel_tests_counts"]["tests"] >= 1 and results["kernel_tests_counts"]["failures"] == 0
    assert results["peak"]["bf16_flops_per_second"] > 0 and results["peak"]["fp32_flops_per_second"] > 0
    train = trains["fbgemm"]
    assert train["steps"] == 3 and train["examples_per_second"] > 0 and train["dense_flops_per_example"] > 0
    # MFU is a rate over the peak measured in the same run: either can be taken while the CPU is busy (a
    # busy peak gave an MFU of 8.4), so check that it is the step's rate over that peak, not its size.
    peak = results["peak"]["bf16_flops_per_second"]
    assert train["mfu"] == pytest.approx(train["dense_flops_per_example"] * train["examples_per_second"] / peak)
    assert train["loss"] > 0
    score = results["score"]
    assert score["finite"] and score["rows"] == 2048
    assert score["mfu"] == pytest.approx(score["flops_per_row"] * score["rows_per_second"] / peak)
    assert score["forward_mfu"] == pytest.approx(score["flops_per_row"] * score["forward_rows_per_second"] / peak)
    assert score["max_abs_difference_from_cpu_fp32"] < 0.05  # bf16 autocast against float32
    assert results["faiss"]["recall_at_10"] > 0.5 and not results["faiss"]["on_gpu"]
    assert {r["path"] for r in lines if r["step"] == "attention" and "path" in r} == {"jagged", "padded"}


def test_the_torch_fallbacks_of_fbgemm_operators_equal_fbgemm():
    """What bench/perf/gpu_steps.py registers on a GPU whose fbgemm has no CUDA kernels, against fbgemm on the CPU."""
    import torch

    from bench.perf.gpu_steps import _complete_cumsum, _jagged_to_padded_dense_backward, _jagged_to_padded_dense_forward

    lengths = torch.tensor([3, 0, 5, 1, 7])
    offsets = _complete_cumsum(lengths)
    assert torch.equal(offsets, torch.ops.fbgemm.asynchronous_complete_cumsum(lengths))
    values = torch.randn(int(lengths.sum()), 4)
    for max_length in (1, 4, 8):
        dense = torch.ops.fbgemm.jagged_to_padded_dense_forward(values, [offsets], [max_length], -1.0)
        assert torch.equal(_jagged_to_padded_dense_forward(values, [offsets], [max_length], -1.0), dense)
        grad = torch.randn_like(dense)
        expected = torch.ops.fbgemm.jagged_to_padded_dense_backward(grad, [offsets], values.shape[0])
        assert torch.equal(_jagged_to_padded_dense_backward(grad, [offsets], values.shape[0]), expected)
