"""target_attention: parity of its Triton and PyTorch paths with the fp32 reference, the prefix each target
sees, and validation.

Rows mix every case: a row without targets, one without keys, targets that see no key, all keys or a prefix.
"""

import pytest
import torch
from torch import Tensor

from kernels.reference.pt_target_attention import pt_target_attention
from kernels.target_attention import target_attention

TOLERANCES = {torch.float32: {"atol": 1e-4, "rtol": 1e-4}, torch.float16: {"atol": 5e-3, "rtol": 5e-3}}
KERNELS = ("pytorch", "triton")
# (targets, keys) per row.
ROWS = [(3, 0), (0, 9), (5, 70), (1, 1), (40, 23), (2, 16)]


def _inputs(dtype: torch.dtype, device: torch.device, heads: int = 2, head_dim: int = 16) -> tuple[Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    targets, keys = (torch.tensor([0, *column], dtype=torch.int64).cumsum(0) for column in zip(*ROWS))
    # Each target sees a prefix of its row: none, all of it, or any length between.
    visible = torch.cat([torch.randint(0, n + 1, (m,), generator=g) for m, n in ROWS]).to(torch.int64)
    visible[0:1] = 0
    q = torch.randn(int(targets[-1]), heads, head_dim, generator=g)
    k, v = (torch.randn(int(keys[-1]), heads, head_dim, generator=g) for _ in range(2))
    dout = torch.randn(q.shape, generator=g)
    return targets.to(device), keys.to(device), visible.to(device), *(t.to(device, dtype) for t in (q, k, v, dout))


def _run(fn, q: Tensor, k: Tensor, v: Tensor, dout: Tensor) -> list[Tensor]:
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), dout)]


def _attention(targets: Tensor, keys: Tensor, visible: Tensor, **options):
    return lambda q, k, v: target_attention(q, targets, k, v, keys, visible, max_targets=40, max_seq_len=70, **options)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("activation", ["softmax", "silu", "gelu"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_parity_with_the_reference(kernel: str, activation: str, dtype: torch.dtype, device: torch.device) -> None:
    targets, keys, visible, q, k, v, dout = _inputs(dtype, device)
    expected = _run(
        lambda q, k, v: pt_target_attention(q, targets, k, v, keys, visible, activation=activation), q, k, v, dout
    )
    actual = _run(_attention(targets, keys, visible, activation=activation, kernel=kernel), q, k, v, dout)
    for name, a, e in zip(("out", "dq", "dk", "dv"), actual, expected):
        assert a.dtype == dtype and a.shape == e.shape, name
        torch.testing.assert_close(a.float(), e.float(), **TOLERANCES[dtype], msg=lambda m, name=name: f"{name}: {m}")
    seeing_nothing = visible == 0
    assert seeing_nothing.any() and torch.equal(actual[0][seeing_nothing], torch.zeros_like(actual[0][seeing_nothing]))


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_target_is_unchanged_by_keys_past_its_prefix_and_changed_by_one_inside(
    kernel: str, device: torch.device
) -> None:
    """The point-in-time property: a key at or after a target's time never reaches it, in both passes."""
    targets, keys, visible, q, k, v, dout = _inputs(torch.float32, device)
    attention = _attention(targets, keys, visible, kernel=kernel)
    before = _run(attention, q, k, v, dout)
    row = 2  # 5 targets over 70 keys
    first, end = int(keys[row]), int(keys[row + 1])
    cut = 30
    later = k.clone(), v.clone()
    for t in later:
        t[first + cut : end] += 10.0
    after = _run(attention, q, *later, dout)
    mine = slice(int(targets[row]), int(targets[row + 1]))
    sees_before_cut = visible[mine] <= cut
    assert sees_before_cut.any() and not sees_before_cut.all()
    rows = torch.arange(mine.start, mine.stop, device=device)
    torch.testing.assert_close(after[0][rows[sees_before_cut]], before[0][rows[sees_before_cut]], rtol=0, atol=0)
    assert not torch.allclose(after[0][rows[~sees_before_cut]], before[0][rows[~sees_before_cut]])
    # Nothing flows back into the keys no target sees.
    unseen = first + int(visible[mine].max())
    assert unseen < end
    for grad in after[2:]:
        assert torch.equal(grad[unseen:end], torch.zeros_like(grad[unseen:end]))


@pytest.mark.parametrize("activation", ["softmax", "silu"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_window_reads_the_newest_visible_keys_alone(kernel: str, activation: str, device: torch.device) -> None:
    """With window=w a target reads the last w of its visible keys: parity with the reference, and keys before
    that span (or at or after its time) change nothing, in both passes."""
    window = 7
    targets, keys, visible, q, k, v, dout = _inputs(torch.float32, device)
    expected = _run(
        lambda q, k, v: pt_target_attention(q, targets, k, v, keys, visible, activation=activation, window=window),
        q,
        k,
        v,
        dout,
    )
    attention = _attention(targets, keys, visible, activation=activation, kernel=kernel, window=window)
    actual = _run(attention, q, k, v, dout)
    for name, a, e in zip(("out", "dq", "dk", "dv"), actual, expected):
        torch.testing.assert_close(a, e, **TOLERANCES[torch.float32], msg=lambda m, name=name: f"{name}: {m}")
    unwindowed = _run(_attention(targets, keys, visible, activation=activation, kernel=kernel), q, k, v, dout)[0]
    longer = visible > window
    assert longer.any() and not torch.allclose(actual[0][longer], unwindowed[longer])
    torch.testing.assert_close(actual[0][~longer], unwindowed[~longer], **TOLERANCES[torch.float32])

    row = 2  # 5 targets over 70 keys
    mine = slice(int(targets[row]), int(targets[row + 1]))
    oldest_read = int((visible[mine] - window).clamp(min=0).min())
    assert oldest_read > 0
    older = k.clone(), v.clone()
    for t in older:
        t[int(keys[row]) : int(keys[row]) + oldest_read] += 10.0
    after = _run(attention, q, *older, dout)
    torch.testing.assert_close(after[0][mine], actual[0][mine], rtol=0, atol=0)
    for grad in after[2:]:
        old_keys = grad[int(keys[row]) : int(keys[row]) + oldest_read]
        assert torch.equal(old_keys, torch.zeros_like(old_keys))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"visible": "too_many"}, r"visible\[\d+\]=\d+ must be between 0 and its row's \d+ keys"),
        ({"visible": "float"}, r"visible must be an int64 tensor \[M=51\]"),
        ({"kv_rows": 5}, "q_offsets has 6 rows and kv_offsets 5"),
        ({"max_seq_len": 10}, r"max_seq_len=10 is below the longest row \(70 tokens\)"),
        ({"max_targets": 30}, r"max_targets=30 is below the longest row \(40 tokens\); pass max_targets >= 40"),
        ({"activation": "tanh"}, r"activation='tanh' is not one of"),
        ({"window": 0}, r"window must be None \(every visible key\) or an int >= 1, got window=0"),
    ],
)
def test_bad_inputs_are_refused_naming_the_argument(change: dict, message: str) -> None:
    targets, keys, visible, q, k, v, _ = _inputs(torch.float32, torch.device("cpu"))
    options = {"max_targets": change.get("max_targets", 40), "max_seq_len": change.get("max_seq_len", 70)}
    if change.get("visible") == "too_many":
        visible = visible.clone()
        visible[-1] = 17
    elif change.get("visible") == "float":
        visible = visible.float()
    if "kv_rows" in change:
        keys = keys[:-1].clone()
        k, v = k[: int(keys[-1])], v[: int(keys[-1])]
    with pytest.raises(ValueError, match=message):
        target_attention(
            q,
            targets,
            k,
            v,
            keys,
            visible,
            activation=change.get("activation", "softmax"),
            window=change.get("window"),
            **options,
        )
