"""bench/gpu_check.sh, the GPU run of issue 14, proved on the CPU by its dry run: every step runs and reports."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_check_dry_run_runs_every_step_and_writes_json_lines(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    run = subprocess.run(["bash", "bench/gpu_check.sh", "--dry-run"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    status = {r["step"]: r["status"] for r in lines if "status" in r}
    assert status == dict.fromkeys(("peak", "kernel_tests", "attention", "train", "score", "faiss"), "ok")
    results = {r["step"]: r for r in lines if "status" not in r}
    assert results["kernel_tests_counts"]["tests"] >= 1 and results["kernel_tests_counts"]["failures"] == 0
    assert results["peak"]["bf16_flops_per_second"] > 0 and results["peak"]["fp32_flops_per_second"] > 0
    train = results["train"]
    assert train["steps"] == 3 and train["examples_per_second"] > 0 and train["dense_flops_per_example"] > 0
    assert 0 < train["mfu"] < 1 and train["loss"] > 0
    score = results["score"]
    assert score["finite"] and score["rows"] == 2048 and 0 < score["mfu"] < 1
    assert results["faiss"]["recall_at_10"] > 0.5 and not results["faiss"]["on_gpu"]
    assert {r["path"] for r in lines if r["step"] == "attention" and "path" in r} == {"jagged", "padded"}
