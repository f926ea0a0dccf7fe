#!/usr/bin/env bash
# GPU check of the jagged attention kernel: the parity tests on CUDA with compiled Triton kernels
# (GEM_KERNEL_DEVICE=cuda, TRITON_INTERPRET=0), then the benchmark with --device cuda.
#   bash kernels/benchmarks/gpu_check.sh     # from anywhere; writes under $OUT (default /tmp/gem_gpu_check)
# PYTHON overrides the interpreter (default: the repo's .venv). Exits non-zero if the tests fail,
# after running the benchmark anyway.
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-.venv/bin/python}"
OUT="${OUT:-/tmp/gem_gpu_check}"
mkdir -p "$OUT"
bench=kernels/benchmarks/jagged_attention_bench.py

"$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())" \
    | tee "$OUT/device.txt" || exit 1

GEM_KERNEL_DEVICE=cuda TRITON_INTERPRET=0 "$PYTHON" -m pytest -q -p no:cacheprovider tests/kernels \
    --junitxml "$OUT/kernel_tests.xml" 2>&1 | tee "$OUT/kernel_tests.txt"
tests_rc=${PIPESTATUS[0]}

"$PYTHON" "$bench" --batch 128 --heads 2 --dim 32 --max-len 1024 --device cuda \
    --json "$OUT/bench_b128_fp32.json" | tee "$OUT/bench_b128_fp32.md"
"$PYTHON" "$bench" --batch 256 --heads 4 --dim 64 --max-len 2048 --dtype bfloat16 --device cuda \
    --json "$OUT/bench_b256_bf16.json" | tee "$OUT/bench_b256_bf16.md"

exit "$tests_rc"
