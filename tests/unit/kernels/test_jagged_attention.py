"""jagged_attention: parity of its Triton and PyTorch paths with the fp32 reference, validation, known values.

Parity tests run a path and `pt_jagged_attention` on the same inputs and upstream gradient and compare the
output and the gradients of q, k and v with tolerances from `TOLERANCES`, over random jagged lengths that
include empty rows and one long row. On CPU (the default) the Triton kernels run under TRITON_INTERPRET=1
(set in conftest.py); GEM_KERNEL_DEVICE=cuda runs every test on a GPU with compiled kernels.
"""

import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.jagged_attention import jagged_attention
from kernels.reference.pt_jagged_attention import pt_jagged_attention

TOLERANCES = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.float16: {"atol": 5e-3, "rtol": 5e-3},
    torch.bfloat16: {"atol": 4e-2, "rtol": 4e-2},
}
KERNELS = ("pytorch", "triton")
ACTIVATIONS = ("softmax", "silu")  # the full matrix; GDPA's other activations have tests of their own
GDPA_ACTIVATIONS = ("gelu", "relu2", "identity")


def _lengths(seed: int, count: int, short_max: int, long: int) -> list[int]:
    """Row lengths with empty rows, a length-1 row, one long row and `count` random short ones."""
    g = torch.Generator().manual_seed(seed)
    short = torch.randint(0, short_max + 1, (count,), generator=g).tolist()
    return [0, *short[: count // 2], long, 1, 0, *short[count // 2 :]]


def _inputs(
    lengths: list[int], heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """offsets [B+1] and q, k, v, upstream gradient [L, H, Dh]."""
    g = torch.Generator().manual_seed(seed)
    offsets = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
    L = int(offsets[-1])
    tensors = [torch.randn(L, heads, head_dim, generator=g).to(device, dtype) for _ in range(4)]
    return offsets.to(device), *tensors


def _forward_backward(fn: Callable[..., Tensor], q: Tensor, k: Tensor, v: Tensor, dout: Tensor) -> list[Tensor]:
    """[out, dq, dk, dv] of fn on fresh leaves."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), dout)]


def _check_parity(
    kernel: str,
    lengths: list[int],
    *,
    heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    activation: str,
    causal: bool,
    scale: float | None = None,
    window: int | None = None,
    n_global: int = 0,
) -> None:
    offsets, q, k, v, dout = _inputs(lengths, heads, head_dim, dtype, device)
    common = {"causal": causal, "activation": activation, "scale": scale, "window": window, "n_global": n_global}
    expected = _forward_backward(lambda q, k, v: pt_jagged_attention(q, k, v, offsets, **common), q, k, v, dout)
    actual = _forward_backward(
        # max_seq_len is an upper bound, not the batch maximum: the extra Triton programs must do nothing.
        lambda q, k, v: jagged_attention(q, k, v, offsets, max_seq_len=max(lengths) + 5, kernel=kernel, **common),
        q,
        k,
        v,
        dout,
    )
    for name, a, e in zip(("out", "dq", "dk", "dv"), actual, expected):
        assert a.dtype == dtype and a.shape == q.shape, name
        torch.testing.assert_close(a.float(), e.float(), **TOLERANCES[dtype], msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("causal", [True, False])
def test_reference_matches_dense_attention(causal: bool) -> None:
    # The ground truth checked against torch's own dense attention, one row at a time.
    offsets, q, k, v, _ = _inputs([5, 0, 12], 2, 16, torch.float32, torch.device("cpu"))
    out = pt_jagged_attention(q, k, v, offsets, causal=causal, scale=0.7)
    for start, end in ((0, 5), (5, 17)):
        qb, kb, vb = (t[start:end].transpose(0, 1) for t in (q, k, v))  # [H, n, Dh]
        dense = F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal, scale=0.7)
        torch.testing.assert_close(out[start:end], dense.transpose(0, 1))


@pytest.mark.slow
@pytest.mark.parametrize("head_dim", [16, 32])
@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_parity_random_lengths(
    kernel: str, activation: str, causal: bool, heads: int, head_dim: int, device: torch.device
) -> None:
    lengths = _lengths(seed=heads * 100 + head_dim, count=6, short_max=40, long=80)
    _check_parity(
        kernel,
        lengths,
        heads=heads,
        head_dim=head_dim,
        dtype=torch.float32,
        device=device,
        activation=activation,
        causal=causal,
    )


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("activation", GDPA_ACTIVATIONS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_parity_gdpa_activations(kernel: str, activation: str, causal: bool, device: torch.device) -> None:
    lengths = _lengths(seed=11, count=6, short_max=40, long=80)
    _check_parity(
        kernel,
        lengths,
        heads=2,
        head_dim=16,
        dtype=torch.float32,
        device=device,
        activation=activation,
        causal=causal,
        scale=0.5,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("activation", "window", "n_global"),
    [
        ("softmax", 0, 0),
        ("softmax", 0, 2),
        ("softmax", 5, 0),
        ("softmax", 5, 2),
        ("softmax", 40, 2),
        ("gelu", 5, 2),
        ("gelu", 40, 0),
    ],
)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kernel", KERNELS)
def test_parity_sliding_window(
    kernel: str, activation: str, causal: bool, window: int, n_global: int, device: torch.device
) -> None:
    # Windows narrower and wider than a tile, rows shorter and longer than the window, global tokens or none.
    lengths = _lengths(seed=13, count=6, short_max=30, long=100)
    _check_parity(
        kernel,
        lengths,
        heads=2,
        head_dim=16,
        dtype=torch.float32,
        device=device,
        activation=activation,
        causal=causal,
        window=window,
        n_global=n_global,
    )


@pytest.mark.parametrize("kernel", KERNELS)
def test_window_sees_only_near_tokens_and_the_global_ones(kernel: str, device: torch.device) -> None:
    # Moving a far, non-global key leaves a windowed token's output as it was; moving a global key does not.
    offsets, q, k, v, _ = _inputs([40], 1, 16, torch.float32, device)
    common = {"max_seq_len": 40, "causal": False, "window": 3, "n_global": 2, "kernel": kernel}
    before = jagged_attention(q, k, v, offsets, **common)
    far, global_key = v.clone(), v.clone()
    far[30] += 1.0
    global_key[39] += 1.0
    torch.testing.assert_close(jagged_attention(q, k, far, offsets, **common)[:26], before[:26])
    assert not torch.allclose(jagged_attention(q, k, global_key, offsets, **common)[0], before[0])
    whole_row = jagged_attention(q, k, v, offsets, max_seq_len=40, causal=False, kernel=kernel)
    torch.testing.assert_close(before[38:], whole_row[38:])  # global queries see the whole row


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_parity_long_row(kernel: str, activation: str, causal: bool, device: torch.device) -> None:
    # The interpreter is slow, so the Triton row is shorter on CPU; a non-default scale rides along.
    long = 300 if kernel == "triton" and device.type == "cpu" else 1000
    lengths = _lengths(seed=7, count=4, short_max=60, long=long)
    _check_parity(
        kernel,
        lengths,
        heads=2,
        head_dim=32,
        dtype=torch.float32,
        device=device,
        activation=activation,
        causal=causal,
        scale=0.3,
    )


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_parity_half_precision(
    kernel: str, dtype: torch.dtype, activation: str, causal: bool, device: torch.device
) -> None:
    if kernel == "triton" and dtype == torch.bfloat16 and device.type == "cpu":
        pytest.skip("triton's interpreter cannot run bfloat16 tl.dot (triton-lang/triton#11584)")
    lengths = _lengths(seed=3, count=6, short_max=40, long=100)
    _check_parity(
        kernel, lengths, heads=2, head_dim=32, dtype=dtype, device=device, activation=activation, causal=causal
    )


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_parity_equal_lengths(kernel: str, activation: str, device: torch.device) -> None:
    # One bucket without padding: the PyTorch path's unmasked branch.
    for causal in (True, False):
        _check_parity(
            kernel,
            [24, 24, 24],
            heads=2,
            head_dim=16,
            dtype=torch.float32,
            device=device,
            activation=activation,
            causal=causal,
        )


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_parity_fused_projection_strides(kernel: str, activation: str, device: torch.device) -> None:
    # q, k, v unbound from one [L, 3, H, Dh] tensor are not contiguous; the upstream gradient is transposed.
    offsets, q, k, v, _ = _inputs([0, 9, 40, 3], 2, 16, torch.float32, device)
    dout = torch.randn(q.shape[0], 16, 2, generator=torch.Generator().manual_seed(5)).to(device).transpose(1, 2)

    def strided(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q, k, v = torch.stack([q, k, v], dim=1).unbind(1)  # differentiable, strided like a fused projection
        assert not q.is_contiguous()
        return jagged_attention(q, k, v, offsets, max_seq_len=40, activation=activation, kernel=kernel)

    expected = _forward_backward(
        lambda q, k, v: pt_jagged_attention(q, k, v, offsets, activation=activation), q, k, v, dout
    )
    for a, e in zip(_forward_backward(strided, q, k, v, dout), expected):
        torch.testing.assert_close(a, e, **TOLERANCES[torch.float32])


@pytest.mark.parametrize("lengths", [[], [0], [0, 0, 0]], ids=["no-rows", "one-empty", "all-empty"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_empty_batch(kernel: str, lengths: list[int], device: torch.device) -> None:
    offsets, q, k, v, dout = _inputs(lengths, 2, 16, torch.float32, device)
    out, dq, dk, dv = _forward_backward(
        lambda q, k, v: jagged_attention(q, k, v, offsets, max_seq_len=0, kernel=kernel), q, k, v, dout
    )
    assert out.shape == dq.shape == dk.shape == dv.shape == (0, 2, 16)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kernel", KERNELS)
def test_row_of_one_token(kernel: str, causal: bool, device: torch.device) -> None:
    # A token alone in its row: softmax returns its v; silu returns silu(scale * q.k) * v (n = 1).
    offsets, q, k, v, _ = _inputs([3, 1, 2], 2, 16, torch.float32, device)
    common = {"max_seq_len": 3, "causal": causal, "kernel": kernel, "scale": 0.5}
    softmax = jagged_attention(q, k, v, offsets, activation="softmax", **common)
    torch.testing.assert_close(softmax[3], v[3])
    silu = jagged_attention(q, k, v, offsets, activation="silu", **common)
    dot = (q[3] * k[3]).sum(-1, keepdim=True)  # [H, 1]
    torch.testing.assert_close(silu[3], 0.5 * dot * torch.sigmoid(0.5 * dot) * v[3])


@pytest.mark.parametrize("kernel", KERNELS)
def test_causal_first_token_sees_only_itself(kernel: str, device: torch.device) -> None:
    offsets, q, k, v, _ = _inputs([4, 5], 2, 16, torch.float32, device)
    scale = 1 / math.sqrt(16)
    softmax = jagged_attention(q, k, v, offsets, max_seq_len=5, kernel=kernel)
    torch.testing.assert_close(softmax[[0, 4]], v[[0, 4]])
    silu = jagged_attention(q, k, v, offsets, max_seq_len=5, activation="silu", kernel=kernel)
    for first, n in ((0, 4), (4, 5)):
        weight = F.silu(scale * (q[first] * k[first]).sum(-1, keepdim=True)) / n
        torch.testing.assert_close(silu[first], weight * v[first])


@pytest.mark.parametrize("kernel", KERNELS)
def test_rows_and_the_future_are_invisible(kernel: str, device: torch.device) -> None:
    # Changing row 1, and the last token of row 0, leaves the other tokens of row 0 unchanged.
    offsets, q, k, v, _ = _inputs([6, 5], 1, 16, torch.float32, device)
    before = jagged_attention(q, k, v, offsets, max_seq_len=6, kernel=kernel)
    k2, v2 = k.clone(), v.clone()
    k2[5:] += 1.0
    v2[5:] -= 1.0
    after = jagged_attention(q, k2, v2, offsets, max_seq_len=6, kernel=kernel)
    torch.testing.assert_close(after[:5], before[:5])
    assert not torch.allclose(after[5:], before[5:])


def _bad_call(**changes: object) -> None:
    offsets = torch.tensor([0, 2, 5], dtype=torch.int64)
    q = torch.randn(5, 2, 16)
    args: dict[str, object] = {"q": q, "k": q.clone(), "v": q.clone(), "offsets": offsets, "max_seq_len": 3}
    args.update(changes)
    jagged_attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("offsets"), **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"offsets": torch.tensor([0, 2, 5], dtype=torch.int32)}, r"offsets must be a 1-D int64 .*torch.int32"),
        ({"offsets": torch.tensor([0, 4, 3, 5])}, r"non-decreasing, got offsets\[1\]=4 > offsets\[2\]=3"),
        ({"offsets": torch.tensor([0, 2, 4])}, r"offsets\[-1\]=4 must equal L=q.shape\[0\]=5"),
        ({"offsets": torch.tensor([1, 2, 5])}, r"offsets\[0\] must be 0, got offsets\[0\]=1"),
        ({"k": torch.randn(5, 2, 8)}, r"k.shape=\(5, 2, 8\) must equal q.shape=\(5, 2, 16\)"),
        ({"v": torch.randn(5, 2, 16, dtype=torch.float64)}, r"v.dtype=torch.float64 must equal q.dtype"),
        ({"q": torch.randn(5, 32)}, r"q must be \[L, H, Dh\].*q.shape=\(5, 32\)"),
        ({"activation": "relu"}, r"activation='relu' is not one of"),
        ({"window": -1}, r"window must be None \(the whole row\) or an int >= 0, got window=-1"),
        ({"n_global": 2}, r"n_global=2 needs a window"),
        ({"window": 4, "n_global": -1}, r"n_global must be an int >= 0"),
        ({"kernel": "cuda"}, r"kernel='cuda' is not one of"),
        ({"max_seq_len": 2}, r"max_seq_len=2 is below the longest row \(3 tokens\)"),
        ({"scale": float("nan")}, r"scale must be a finite float"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_validation_names_the_argument(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _bad_call(**changes)


def test_triton_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"kernel='triton' got q on cpu with TRITON_INTERPRET='0'"):
        _bad_call(kernel="triton")


def test_triton_interpreter_refuses_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q = torch.randn(5, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"kernel='triton' got bfloat16 CPU tensors"):
        _bad_call(q=q, k=q.clone(), v=q.clone(), kernel="triton")


def test_auto_on_cpu_takes_the_pytorch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    import kernels.jagged_attention as module

    def no_triton(q: Tensor) -> None:
        raise AssertionError("kernel='auto' imported the Triton kernel for CPU tensors")

    monkeypatch.setattr(module, "_import_triton_kernel", no_triton)
    _bad_call(kernel="auto")


def test_import_does_not_import_triton() -> None:
    code = "import sys, kernels, kernels.jagged_attention; print('triton' in sys.modules)"
    root = Path(__file__).resolve().parents[3]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
