"""seed_attention (broadcast-query GDPA): parity of its Triton and PyTorch paths with the fp32 reference.

Each test runs a path and `pt_seed_attention` on the same inputs and upstream gradient and compares the output
and the gradients of the shared queries, the keys and the values, over jagged rows that include empty ones.
"""

import pytest
import torch
from torch import Tensor

from kernels.reference.pt_seed_attention import pt_seed_attention
from kernels.seed_attention import seed_attention

TOLERANCES = {torch.float32: {"atol": 1e-4, "rtol": 1e-4}, torch.float16: {"atol": 5e-3, "rtol": 5e-3}}
KERNELS = ("pytorch", "triton")


def _inputs(
    lengths: list[int], seeds: int, dtype: torch.dtype, device: torch.device, heads: int = 2, head_dim: int = 16
) -> tuple[Tensor, ...]:
    g = torch.Generator().manual_seed(len(lengths) * 31 + seeds)
    offsets = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(device)
    n = int(offsets[-1])
    q = torch.randn(seeds, heads, head_dim, generator=g)
    k, v = (torch.randn(n, heads, head_dim, generator=g) for _ in range(2))
    dout = torch.randn(len(lengths), seeds, heads, head_dim, generator=g)
    return offsets, *(t.to(device, dtype) for t in (q, k, v, dout))


def _run(fn, q: Tensor, k: Tensor, v: Tensor, dout: Tensor) -> list[Tensor]:
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), dout)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("seeds", [5, 40])
@pytest.mark.parametrize("activation", ["softmax", "silu", "gelu"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_parity_with_the_reference(
    kernel: str, activation: str, seeds: int, dtype: torch.dtype, device: torch.device
) -> None:
    lengths = [0, 7, 1, 70, 0, 23, 16]
    offsets, q, k, v, dout = _inputs(lengths, seeds, dtype, device)
    expected = _run(lambda q, k, v: pt_seed_attention(q, k, v, offsets, activation=activation), q, k, v, dout)
    actual = _run(
        lambda q, k, v: seed_attention(q, k, v, offsets, max_seq_len=75, activation=activation, kernel=kernel),
        q,
        k,
        v,
        dout,
    )
    for name, a, e in zip(("out", "dq", "dk", "dv"), actual, expected):
        assert a.dtype == dtype and a.shape == e.shape, name
        torch.testing.assert_close(a.float(), e.float(), **TOLERANCES[dtype], msg=lambda m, name=name: f"{name}: {m}")
    assert torch.equal(actual[0][0], torch.zeros_like(actual[0][0]))  # an empty row pools to zeros


@pytest.mark.parametrize("kernel", KERNELS)
def test_one_key_row_returns_its_value_under_softmax(kernel: str, device: torch.device) -> None:
    offsets, q, k, v, _ = _inputs([1, 3], 4, torch.float32, device)
    out = seed_attention(q, k, v, offsets, max_seq_len=3, kernel=kernel)
    torch.testing.assert_close(out[0], v[0].expand(4, -1, -1))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("lengths", [[], [0, 0]], ids=["no-rows", "all-empty"])
def test_no_rows_and_all_empty_rows(kernel: str, lengths: list[int], device: torch.device) -> None:
    offsets, q, k, v, dout = _inputs(lengths, 3, torch.float32, device)
    out, dq, dk, dv = _run(
        lambda q, k, v: seed_attention(q, k, v, offsets, max_seq_len=0, kernel=kernel), q, k, v, dout
    )
    assert out.shape == (len(lengths), 3, 2, 16) and not out.any() and not dq.any()


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"q": torch.randn(4, 2, 8)}, r"q.shape=\(4, 2, 8\) must be \[S, H, Dh\] with k's H and Dh"),
        ({"v": torch.randn(6, 2, 16)}, r"v.shape=\(6, 2, 16\) must equal k.shape=\(5, 2, 16\)"),
        ({"offsets": torch.tensor([0, 2, 4])}, r"offsets\[-1\]=4 must equal L=k.shape\[0\]=5"),
        ({"activation": "tanh"}, r"activation='tanh' is not one of"),
        ({"max_seq_len": 2}, r"max_seq_len=2 is below the longest row \(3 tokens\)"),
    ],
)
def test_validation_names_the_argument(changes: dict, match: str) -> None:
    args = {
        "q": torch.randn(4, 2, 16),
        "k": torch.randn(5, 2, 16),
        "v": torch.randn(5, 2, 16),
        "offsets": torch.tensor([0, 2, 5]),
        "max_seq_len": 3,
        **changes,
    }
    with pytest.raises(ValueError, match=match):
        seed_attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("offsets"), **args)
