#!/usr/bin/env bash
# The project's GPU measurements, in one call of under 8 minutes; each result is a JSON line in
# $OUT/results.jsonl (default OUT=/tmp/gem_gpu_check), the logs beside it.
#   bash bench/perf/gpu_check.sh             # on the GPU machine, from anywhere
#   bash bench/perf/gpu_check.sh --dry-run   # on any machine: every step on the CPU at toy sizes (proves the script)
#   bash bench/perf/gpu_check.sh --download-wheels .whl   # here, for a GPU machine that cannot reach PyPI (below)
# Steps: (1) the environment: $PYTHON, else the repo's .venv, else a new .venv-gpu installed from the project's
# files (requirements.lock with the `gpu` extra's CUDA builds of fbgemm-gpu and faiss in place of the CPU ones,
# see pyproject.toml), skipped when the interpreter already imports them; (2) the device and its measured bf16
# and fp32 matmul peak; (3) the jagged-attention parity tests on CUDA with compiled Triton kernels; (4) the
# attention benchmark, Triton against the bucketed PyTorch path and padded attention; (5) GEM training for a
# fixed number of bf16 steps (TorchRec DMP, fbgemm embeddings) with its MFU against (2); (6) scoring throughput
# of GemModel.logits with its MFU; (7) an IVF index build on the GPU (faiss-gpu) with recall@10.
# A GPU machine with no network and its own torch (this workplace's H200: torch 2.11, Python 3.12, no
# TorchRec, fbgemm or faiss) gets the wheels of bench/perf/gpu_wheels.txt, downloaded beforehand with
# --download-wheels into .whl/ and carried there: step (1) installs them when .whl/ holds any.
# A failed step writes {"step": ..., "status": "failed"} and the rest still run; the exit status is the count
# of failed steps. STEP_TIMEOUT (seconds, default 150) bounds each step.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gem_gpu_check}"
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
if [ "${1:-}" = "--download-wheels" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "${2:-.whl}" -r bench/perf/gpu_wheels.txt
    exit $?
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
results="$OUT/results.jsonl"
: > "$results"
failed=0
record() { echo "{\"step\": \"$1\", \"status\": \"$2\", \"rc\": $3, \"seconds\": $4}" | tee -a "$results"; }
run_step() {  # run_step NAME COMMAND...: its output to $OUT/NAME.log, a status line to results.jsonl
    local name=$1; shift
    local started=$SECONDS
    timeout "${STEP_TIMEOUT:-150}" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    if [ $rc -eq 0 ]; then record "$name" ok 0 $((SECONDS - started))
    else record "$name" failed $rc $((SECONDS - started)); failed=$((failed + 1)); tail -5 "$OUT/$name.log"; fi
}

if [ $DRY -eq 1 ]; then
    DEVICE=cpu; KERNEL_ENV="GEM_KERNEL_DEVICE=cpu TRITON_INTERPRET=1"
    TRAIN="--batch 64 --steps 3 --warmup 1 --max-len 64"; SCORE="--rows 2048 --chunk 512 --max-len 64"
    PEAK="--n 512 --reps 3"; FAISS="--rows 20000"; ATTN="--batch 16 --max-len 128 --reps 1 --warmup 1"
    TESTS="test_parity_random_lengths and triton-softmax-True-2-32"
else
    DEVICE=cuda; KERNEL_ENV="GEM_KERNEL_DEVICE=cuda TRITON_INTERPRET=0"
    TRAIN="--batch 4096 --steps 50 --warmup 5 --max-len 1024"; SCORE="--rows 1048576 --chunk 16384 --max-len 1024"
    PEAK="--n 8192 --reps 10"; FAISS="--rows 1000000"; ATTN="--batch 256 --heads 4 --dim 64 --max-len 2048 --dtype bfloat16"
    TESTS=""
fi

# (1) The environment.
needs='import torch, torchrec, fbgemm_gpu, triton, pyarrow, gem_model.models.gem'
if [ -z "${PYTHON:-}" ] && compgen -G ".whl/*.whl" > /dev/null && ! python3 -c "$needs" 2>/dev/null; then
    started=$SECONDS
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gem-site \
        .whl/*.whl > "$OUT/install.log" 2>&1
    rc=$?; record install "$([ $rc -eq 0 ] && echo ok || echo failed)" $rc $((SECONDS - started))
    export PYTHONPATH="$PYTHONPATH:/tmp/gem-site"
    PYTHON=python3
fi
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    [ -x .venv/bin/python ] && PYTHON=.venv/bin/python
    if ! "$PYTHON" -c "$needs" 2>/dev/null; then
        started=$SECONDS
        python3 -m venv .venv-gpu && PYTHON=.venv-gpu/bin/python
        grep -v -e '^fbgemm_gpu-cpu==' -e '^faiss-cpu==' requirements.lock > "$OUT/requirements-gpu.txt"
        gpu_builds=$(sed -n 's/^gpu = \[\(.*\)\]/\1/p' pyproject.toml | tr -d '",')
        if [ $DRY -eq 1 ]; then gpu_builds="fbgemm_gpu-cpu==1.8.0 faiss-cpu==1.15.1"; fi
        { "$PYTHON" -m pip install -q --no-deps -r "$OUT/requirements-gpu.txt" && "$PYTHON" -m pip install -q --no-deps $gpu_builds \
            && "$PYTHON" -m pip install -q --no-deps --no-build-isolation -e . ; } > "$OUT/install.log" 2>&1
        rc=$?; record install "$([ $rc -eq 0 ] && echo ok || echo failed)" $rc $((SECONDS - started))
    fi
fi
"$PYTHON" -c "$needs" > "$OUT/imports.log" 2>&1 || { record imports failed 1 0; cat "$OUT/imports.log"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore

# (2) Device and peak: the MFU denominator of (5) and (6).
run_step peak "$PYTHON" -m bench.perf.gpu_steps peak --device $DEVICE $PEAK --jsonl "$results"
peak=$("$PYTHON" -c "import json,sys; print(next((r['bf16_flops_per_second'] for r in map(json.loads, open(sys.argv[1])) if r.get('step') == 'peak' and 'bf16_flops_per_second' in r), ''))" "$results")
PEAK_ARG=${peak:+--peak-flops $peak}

# (3) Kernel parity on the device.
# (-o: pyproject's warning filters name a Dagster class, and a GPU machine may have no Dagster.)
run_step kernel_tests env $KERNEL_ENV "$PYTHON" -m pytest -q -p no:cacheprovider -o "filterwarnings=ignore::DeprecationWarning" \
    tests/unit/kernels -k "$TESTS" \
    --junitxml "$OUT/kernel_tests.xml"
"$PYTHON" -c "import sys, json, xml.etree.ElementTree as E; s = E.parse(sys.argv[1]).getroot().iter('testsuite').__next__(); print(json.dumps({'step': 'kernel_tests_counts', **{k: int(s.get(k, 0)) for k in ('tests', 'failures', 'errors', 'skipped')}}))" \
    "$OUT/kernel_tests.xml" 2>/dev/null | tee -a "$results"

# (4) Jagged attention: Triton (CUDA) against the bucketed PyTorch path and padded attention.
run_step attention "$PYTHON" kernels/benchmarks/jagged_attention_bench.py $ATTN --device $DEVICE --json "$OUT/attention.json"
[ -f "$OUT/attention.json" ] && "$PYTHON" -c "import json, sys; [print(json.dumps({'step': 'attention', **r})) for r in json.load(open(sys.argv[1]))]" \
    "$OUT/attention.json" | tee -a "$results"

# (5)-(7) Training, scoring, FAISS.
run_step train "$PYTHON" -m bench.perf.gpu_steps train --device $DEVICE $TRAIN $PEAK_ARG --jsonl "$results"
[ $DRY -eq 1 ] && run_step train_torch_embeddings "$PYTHON" -m bench.perf.gpu_steps train --device $DEVICE $TRAIN \
    --torch-embeddings --jsonl "$results"
run_step score "$PYTHON" -m bench.perf.gpu_steps score --device $DEVICE $SCORE $PEAK_ARG --jsonl "$results"
if "$PYTHON" -c 'import faiss' 2>/dev/null; then
    run_step faiss "$PYTHON" -m bench.perf.gpu_steps faiss --device $DEVICE $FAISS --jsonl "$results"
else  # faiss-gpu's wheels need CUDA 12's runtime libraries, which a CUDA 13 image does not have
    echo '{"step": "faiss", "status": "skipped", "reason": "faiss is not installed"}' | tee -a "$results"
fi

echo "results: $results ($failed failed step(s))"
exit $failed
