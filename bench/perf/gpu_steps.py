"""The measured steps of `bench/perf/gpu_check.sh`, one JSON line each (stdout and `--jsonl`).

    python -m bench.perf.gpu_steps peak  --device cuda --jsonl $OUT/results.jsonl
    python -m bench.perf.gpu_steps train --device cuda --steps 200 --jsonl $OUT/results.jsonl
    python -m bench.perf.gpu_steps score --device cuda --rows 262144 --jsonl $OUT/results.jsonl
    python -m bench.perf.gpu_steps faiss --device cuda --rows 1000000 --jsonl $OUT/results.jsonl

On random examples in the `gold.training_examples` layout (`gem_model.testing.examples`), no lake:
- peak: the best bf16 and fp32 n x n matmul rate (the MFU denominator, measured on this device);
- train: GEM's real training module (GemTrain in TorchRec's DistributedModelParallel, a world of
  one: fbgemm's table-batched embeddings on the device, Adam on the dense part), a fixed number of
  steps under bf16 autocast (`train.bf16`); examples/s, and model FLOP utilisation = dense FLOPs a
  step (bench/common.py, forward + backward) x steps/s / the measured bf16 peak. Where the fbgemm
  installed has no kernels for the device (fbgemm-gpu-cpu on a GPU machine: the CUDA wheel is
  ~470 MB), GemTrain runs unsharded, TorchRec's collections doing their lookups with torch's
  EmbeddingBag and Adam on every parameter, and the result says `"embeddings": "torch"`;
- score: `GemModel.logits` (what jobs/score.py runs per chunk) in chunks of `export.chunk_rows`,
  under bf16 autocast; rows/s and MFU likewise, and the largest difference of a chunk's logits
  from the same model's float32 logits on the CPU;
- faiss: an IVF-Flat index (`IVF<4 sqrt N>,Flat`) over N random unit vectors of the model's
  `repr_dim`, built on the GPU when faiss has one (faiss-gpu) and on the CPU otherwise, recall@10
  of 1,000 queries against exact search.
`--device cpu` runs the same code on the CPU (the dry run of gpu_check.sh, at small sizes).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import count_flops
from gem_model.config import GemConfig
from gem_model.data.loader import Batch, features_to_kjt
from gem_model.testing.examples import random_examples


def emit(result: dict[str, Any], jsonl: Path | None) -> None:
    line = json.dumps(result)
    print(line, flush=True)
    if jsonl is not None:
        with jsonl.open("a") as f:
            f.write(line + "\n")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def autocast(device: torch.device, bf16: bool):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def matmul_rate(device: torch.device, dtype: torch.dtype, n: int, reps: int) -> float:
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    sync(device)
    best = math.inf
    for _ in range(reps):
        started = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best


def peak(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    return {
        "bf16_flops_per_second": matmul_rate(device, torch.bfloat16, args.n, args.reps),
        "fp32_flops_per_second": matmul_rate(device, torch.float32, args.n, args.reps),
        "n": args.n,
    }


# Torch versions of the fbgemm operators that TorchRec's unsharded collections and jagged tensors
# call, registered for CUDA only where the installed fbgemm has no CUDA kernels of its own.
_FALLBACKS = torch.library.Library("fbgemm", "IMPL")


def _complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])


def _jagged_positions(offsets: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = offsets[1:] - offsets[:-1]
    rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths, output_size=total)
    return rows, torch.arange(total, device=offsets.device) - offsets[rows]


def _jagged_to_padded_dense_forward(
    values: torch.Tensor, offsets: list[torch.Tensor], max_lengths: list[int], padding_value: float = 0.0
) -> torch.Tensor:
    rows, positions = _jagged_positions(offsets[0], values.shape[0])
    dense = values.new_full((offsets[0].numel() - 1, max_lengths[0], *values.shape[1:]), padding_value)
    keep = positions < max_lengths[0]
    dense[rows[keep], positions[keep]] = values[keep]
    return dense


def _jagged_to_padded_dense_backward(grad: torch.Tensor, offsets: list[torch.Tensor], total_L: int) -> torch.Tensor:
    rows, positions = _jagged_positions(offsets[0], total_L)
    values = grad.new_zeros((total_L, *grad.shape[2:]))
    keep = positions < grad.shape[1]
    values[keep] = grad[rows[keep], positions[keep]]
    return values


def fbgemm_on(device: torch.device) -> bool:
    """Whether fbgemm has kernels for `device`; on a CUDA device without them, register the fallbacks."""
    import fbgemm_gpu  # noqa: F401  (loads the operator library)

    key = "CUDA" if device.type == "cuda" else "CPU"
    if torch._C._dispatch_has_kernel_for_dispatch_key("fbgemm::asynchronous_complete_cumsum", key):
        return True
    for name, fn in (
        ("asynchronous_complete_cumsum", _complete_cumsum),
        ("jagged_to_padded_dense_forward", _jagged_to_padded_dense_forward),
        ("jagged_to_padded_dense_backward", _jagged_to_padded_dense_backward),
    ):
        _FALLBACKS.impl(name, fn, key)
    return False


def _examples(cfg: GemConfig, rows: int, max_len: int, seed: int):
    table = random_examples(cfg.features, rows, seed, max_len)
    rng = np.random.default_rng(seed)
    clicked = torch.from_numpy((rng.random(rows) < 0.1).astype(np.float32))
    converted = clicked * torch.from_numpy((rng.random(rows) < 0.2).astype(np.float32))
    return table, clicked, converted


def train(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from gem_model.models.gem import GemModel
    from gem_model.models.train_wrapper import GemTrain
    from gem_model.train.trainer import _forward, build_sharded_model, init_distributed

    cfg = GemConfig.from_dict(
        {"train": {"batch_size": args.batch, "bf16": True}}, base=GemConfig.from_preset(args.preset)
    )
    env = init_distributed()
    sharded = fbgemm_on(env.device) and not args.torch_embeddings
    if sharded:
        module, optimizer = build_sharded_model(cfg, env)
    else:
        torch.manual_seed(cfg.train.seed)
        module = GemTrain(GemModel(cfg.features, cfg.model), cfg.train).to(env.device)
        optimizer = torch.optim.Adam(module.parameters(), lr=cfg.train.dense_lr)
    table, clicked, converted = _examples(cfg, args.batch, args.max_len, 0)
    kjt = features_to_kjt(table, cfg.features)
    kjt.offsets()  # computed here on the CPU, like the loader's batches
    batch = Batch(kjt, clicked, converted, torch.ones(args.batch, dtype=torch.bool), table)

    def step() -> torch.Tensor:
        loss, _ = _forward(module, batch, env, cfg)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(args.warmup):
        step()
    flops = count_flops(step)[0]
    sync(device)
    started = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync(device)
    seconds = time.perf_counter() - started
    rate = args.steps * args.batch / seconds
    result = {
        "examples_per_second": rate,
        "steps": args.steps,
        "batch": args.batch,
        "seconds": seconds,
        "dense_flops_per_example": flops / args.batch,
        "loss": float(loss),
        "bf16": env.device.type == "cuda",
        "embeddings": "fbgemm" if sharded else "torch",
    }
    if args.peak_flops:
        result["mfu"] = flops / args.batch * rate / args.peak_flops
    return result


@torch.inference_mode()
def score(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from gem_model.models.gem import GemModel

    cfg = GemConfig.from_preset(args.preset)
    torch.manual_seed(0)
    model = GemModel(cfg.features, cfg.model).eval()
    chunk = cfg.export.chunk_rows if args.chunk is None else args.chunk
    table, _, _ = _examples(cfg, chunk, args.max_len, 1)
    reference = model.logits(features_to_kjt(table.slice(0, 256), cfg.features))
    model.to(device)
    embeddings = "fbgemm" if fbgemm_on(device) else "torch"
    kjt = features_to_kjt(table, cfg.features).to(device)
    with autocast(device, args.bf16):
        difference = float((model.logits(kjt)[:256].float().cpu() - reference).abs().max())
        model.logits(kjt)
        flops = count_flops(lambda: model.logits(kjt))[0]
        sync(device)
        chunks = math.ceil(args.rows / chunk)
        started = time.perf_counter()
        for _ in range(chunks):
            logits = model.logits(features_to_kjt(table, cfg.features).to(device)).float().cpu()
        seconds = time.perf_counter() - started
        started = time.perf_counter()  # the forward alone, on a chunk already on the device
        for _ in range(args.reps):
            model.logits(kjt)
        sync(device)
        forward_rate = args.reps * chunk / (time.perf_counter() - started)
    rate = chunks * chunk / seconds
    result = {
        "rows_per_second": rate,
        "rows": chunks * chunk,
        "chunk_rows": chunk,
        "bf16": args.bf16,
        "flops_per_row": flops / chunk,
        "finite": bool(torch.isfinite(logits).all()),
        "max_abs_difference_from_cpu_fp32": difference,
        "embeddings": embeddings,
        "forward_rows_per_second": forward_rate,
    }
    if args.peak_flops:
        result["mfu"] = result["flops_per_row"] * rate / args.peak_flops
        result["forward_mfu"] = result["flops_per_row"] * forward_rate / args.peak_flops
    return result


@torch.inference_mode()
def profile(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The scoring forward's top operators by self time on the device (where the time goes)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from gem_model.models.gem import GemModel

    cfg = GemConfig.from_preset(args.preset)
    model = GemModel(cfg.features, cfg.model).eval().to(device)
    fbgemm_on(device)
    chunk = cfg.export.chunk_rows if args.chunk is None else args.chunk
    kjt = features_to_kjt(_examples(cfg, chunk, args.max_len, 1)[0], cfg.features).to(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with autocast(device, args.bf16):
        model.logits(kjt)
        sync(device)
        started = time.perf_counter()
        with torch_profile(activities=activities) as prof:
            for _ in range(args.reps):
                model.logits(kjt)
            sync(device)
        wall = time.perf_counter() - started
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    return {
        "chunk_rows": chunk,
        "reps": args.reps,
        "wall_seconds": wall,
        "top": [{"op": e.key, "ms": getattr(e, key) / 1e3, "calls": e.count} for e in events[: args.top]],
    }


def faiss_index(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    import faiss

    dim = GemConfig.from_preset(args.preset).model.repr_dim
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((args.rows, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[rng.choice(args.rows, 1000, replace=False)] + 0.1 * rng.standard_normal((1000, dim), np.float32)
    nlist = max(1, int(4 * math.sqrt(args.rows)))
    on_gpu = device.type == "cuda" and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
    index = faiss.index_factory(dim, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
    if on_gpu:
        resources = faiss.StandardGpuResources()
        index = faiss.index_cpu_to_gpu(resources, 0, index)
    started = time.perf_counter()
    index.train(vectors[rng.choice(args.rows, min(args.rows, 39 * 256 * 4), replace=False)])
    index.add(vectors)
    build = time.perf_counter() - started
    (faiss.GpuParameterSpace() if on_gpu else faiss.ParameterSpace()).set_index_parameter(index, "nprobe", 32)
    started = time.perf_counter()
    _, found = index.search(queries, 10)
    search = time.perf_counter() - started
    exact = faiss.IndexFlatIP(dim)
    exact.add(vectors)
    _, truth = exact.search(queries, 10)
    recall = float(np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True)]))
    return {
        "rows": args.rows,
        "dim": dim,
        "nlist": nlist,
        "on_gpu": on_gpu,
        "build_seconds": build,
        "queries_per_second": len(queries) / search,
        "recall_at_10": recall,
    }


STEPS = {"peak": peak, "train": train, "score": score, "profile": profile, "faiss": faiss_index}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=sorted(STEPS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--jsonl", type=Path)
    parser.add_argument("--n", type=int, default=8192, help="peak: matmul size")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--top", type=int, default=20, help="profile: operators listed")
    parser.add_argument("--batch", type=int, default=4096, help="train: examples a step")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--max-len", type=int, default=512, help="sequence lengths uniform in [0, max-len)")
    parser.add_argument("--rows", type=int, default=262_144, help="score: rows; faiss: vectors")
    parser.add_argument("--chunk", type=int, help="score: rows a forward (default export.chunk_rows)")
    parser.add_argument("--no-bf16", dest="bf16", action="store_false")
    parser.add_argument(
        "--torch-embeddings",
        action="store_true",
        help="train: unsharded with torch's EmbeddingBag even where fbgemm has kernels (the dry run)",
    )
    parser.add_argument("--peak-flops", type=float, help="the MFU denominator (peak's bf16_flops_per_second)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible; use --device cpu for the dry run")
    name = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or platform.machine()
    result = STEPS[args.step](args, device)
    emit({"step": args.step, "device": name, "preset": args.preset, **result}, args.jsonl)


if __name__ == "__main__":
    main()
