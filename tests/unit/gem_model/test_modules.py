"""GEM's parts: jagged ops, Wukong, the sequence pyramid, the heads, and the assembled models."""

import dataclasses

import pyarrow as pa
import pytest
import torch

from gem_model.config import ARCHITECTURES, ExperimentalConfig, GemConfig, SequenceConfig, WukongConfig
from gem_model.data.loader import features_to_kjt
from gem_model.models.gem import GemModel
from gem_model.modules.heads import MultiSurfaceHeads
from gem_model.modules.jagged import concat_rows, first_tokens, keep_first
from gem_model.modules.seed_pooling import HierarchicalSeedPooling, SumKronLinear
from gem_model.modules.sequence import (
    GDPAPersonalizedFFN,
    SequenceLayer,
    SequenceSummary,
    SequenceTokenizer,
)
from gem_model.modules.wukong import WukongExperts, WukongLayer, low_rank_fm
from gem_model.testing.examples import random_examples

CFG = GemConfig()
SPEC = CFG.features
ABLATIONS = [
    {},
    {"use_wukong": False},
    {"use_sequence": False},
    # The events without the default's match rows.
    {"sequence": dataclasses.replace(CFG.model.sequence, match_candidate=False)},
    # The research options: interleaving; a sliding window in the lower layers with GDPA's gelu weights;
    # the PFFN as GDPA with seed pooling; Computation Skip (which needs seed pooling), with and without
    # interleaving (the PFFN personalises only an interleaved pyramid); Wukong experts.
    {"experimental": ExperimentalConfig(interleave=True)},
    {"experimental": ExperimentalConfig(attention_window=4, attention_activation="gelu")},
    {"experimental": ExperimentalConfig(interleave=True, pffn="gdpa", seed_pooling=True)},
    {"experimental": ExperimentalConfig(interleave=True, seed_pooling=True, comp_skip=True)},
    {"experimental": ExperimentalConfig(seed_pooling=True, comp_skip=True)},
    {"experimental": ExperimentalConfig(wukong_experts=2)},
]
EXPERIMENTAL = ExperimentalConfig()


def _column(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_concat_rows_interleaves_per_row():
    a, a_len = _column([[1], [2], [3]]), torch.tensor([2, 0, 1])
    b, b_len = _column([[10], [20], [30]]), torch.tensor([1, 2, 0])
    out, lengths, a_at, b_at = concat_rows(a, a_len, b, b_len)
    assert out.squeeze(1).tolist() == [1, 2, 10, 20, 30, 3]
    assert lengths.tolist() == [3, 2, 1] and a_at.tolist() == [0, 1, 5] and b_at.tolist() == [2, 3, 4]


def test_keep_first_pools_the_dropped_tail_and_first_tokens_pads_short_rows():
    values, lengths = _column([[1], [2], [3], [4], [5]]), torch.tensor([4, 1])
    kept, kept_len, dropped_mean, dropped = keep_first(values, lengths, 2)
    assert kept.squeeze(1).tolist() == [1, 2, 5] and kept_len.tolist() == [2, 1]
    assert dropped_mean.squeeze(1).tolist() == [3.5, 0.0] and dropped.tolist() == [True, False]
    assert first_tokens(values, lengths, 2).squeeze(2).tolist() == [[1, 2], [5, 0]]


def test_low_rank_fm_equals_pairwise_dot_products_times_y():
    torch.manual_seed(0)
    x, y = torch.randn(2, 4, 3), torch.randn(4, 5)
    explicit = torch.zeros(2, 4, 5)
    for b in range(2):
        for i in range(4):
            for j in range(4):
                explicit[b, i] += float(x[b, i] @ x[b, j]) * y[j]
    assert torch.allclose(low_rank_fm(x, y), explicit, atol=1e-5)


def test_wukong_layer_maps_n_embeddings_to_nf_plus_nl_normalised_ones():
    layer = WukongLayer(n_in=7, dim=16, config=WukongConfig(n_fm=3, n_lc=5, rank=4))
    out = layer(torch.randn(6, 7, 16))
    assert out.shape == (6, 8, 16)
    assert torch.allclose(out.mean(-1), torch.zeros(6, 8), atol=1e-5)  # LayerNorm over D


def test_pyramid_layer_keeps_the_newest_tokens_plus_one_pooled_token():
    config = SequenceConfig(dim=8, heads=2, n_cls=2)
    layer = SequenceLayer(config, EXPERIMENTAL, keep=3, personalised=True)
    lengths = torch.tensor([0, 2, 3, 7])
    tokens, out_lengths, cls_out, level = layer(torch.randn(12, 8), lengths, 7, torch.randn(4, 2, 8), torch.randn(4, 8))
    assert out_lengths.tolist() == [0, 2, 3, 4] and tokens.shape == (9, 8) and cls_out.shape == (4, 2, 8)
    assert level.shape == (12, 8)  # every token before the truncation: what seed pooling reads


def test_sum_kron_linear_is_the_sum_of_its_kronecker_factored_maps():
    torch.manual_seed(0)
    layer, x = SumKronLinear(n_in=5, n_out=3, d_in=4, d_out=2, rank=2), torch.randn(6, 5, 4)
    explicit = sum(layer.z[i].T @ x @ layer.w[i] for i in range(2))  # Z_iᵀ X_b W_i, batched over b
    torch.testing.assert_close(layer(x), explicit)


def test_seed_pooling_attends_within_each_row_and_pools_an_empty_row_to_zeros():
    torch.manual_seed(0)
    config = ExperimentalConfig(seed_pooling=True, hsp_seeds=10, hsp_tokens=3, hsp_rank=2)
    hsp = HierarchicalSeedPooling(config, dim=8, heads=2, out_dim=6, max_len=5)
    tokens, lengths = torch.randn(9, 8), torch.tensor([4, 0, 5])
    out = hsp(tokens, lengths)
    assert out.shape == (3, 3, 6) and torch.equal(out[1], torch.zeros(3, 6))
    moved = tokens.clone()
    moved[5:] += torch.randn(4, 8)  # row 2 only (not a constant: the layer norm would remove it)
    again = hsp(moved, lengths)
    torch.testing.assert_close(again[0], out[0])
    assert not torch.allclose(again[2], out[2])


def test_gdpa_pffn_is_a_per_row_two_layer_ffn_made_from_the_context():
    torch.manual_seed(0)
    pffn = GDPAPersonalizedFFN(dim=8, heads=2, n_kv=3, activation="relu2", context_dim=5)
    x, context, rows = torch.randn(7, 8), torch.randn(2, 5), torch.tensor([0, 0, 0, 1, 1, 1, 1])
    out = pffn(x, context, torch.tensor([3, 4]))
    for t in range(7):
        k, v = pffn.kv(context[rows[t]]).view(2, 3, 2, 4).unbind(0)  # [n_kv, H, dh]
        q = pffn.q(pffn.norm(x[t])).view(2, 4)
        hidden = torch.relu(torch.einsum("hd,khd->hk", q, k) / 2.0).square() / 3  # relu² / n_kv
        torch.testing.assert_close(out[t], x[t] + pffn.out(torch.einsum("hk,khd->hd", hidden, v).reshape(8)))


def test_wukong_experts_mix_only_their_own_group():
    torch.manual_seed(0)
    layer = WukongExperts(n_in=5, dim=4, config=WukongConfig(n_fm=4, n_lc=2, rank=2), n_experts=2)
    x = torch.randn(3, 5, 4)
    out = layer(x)
    assert out.shape == (3, 6, 4) and layer.sizes == [3, 2]
    moved = x.clone()
    moved[:, 4] += 1.0  # the second expert's group
    torch.testing.assert_close(layer(moved)[:, :3], out[:, :3])


def test_computation_skip_layer_keeps_its_cls_tokens_and_truncates():
    config = SequenceConfig(dim=8, heads=2, n_cls=2)
    layer = SequenceLayer(
        config, ExperimentalConfig(seed_pooling=True, comp_skip=True), keep=3, personalised=False, attends=False
    )
    cls = torch.randn(2, 2, 8)
    level = torch.randn(9, 8)
    tokens, lengths, cls_out, out_level = layer(level, torch.tensor([2, 7]), 7, cls, None)
    assert lengths.tolist() == [2, 4] and tokens.shape == (6, 8) and torch.equal(cls_out, cls)
    assert torch.equal(out_level, level)


def test_the_summarys_mean_token_averages_the_kept_tokens():
    config = SequenceConfig(dim=8, heads=2, n_cls=2, n_recent=1)
    summary = SequenceSummary(config, EXPERIMENTAL, embedding_dim=8, max_len=7)
    with torch.no_grad():  # show the parts as they are: identity projection, gates open
        summary.proj.weight.copy_(torch.eye(8))
        summary.proj.bias.zero_()
        summary.gate.weight.zero_()
        summary.gate.bias.fill_(50.0)
    level, level_lengths = torch.randn(9, 8), torch.tensor([2, 7])
    tokens, lengths = torch.randn(5, 8), torch.tensor([2, 3])  # what the layer kept of each row
    out, _ = summary(tokens, lengths, torch.randn(2, 2, 8), level, level_lengths)
    torch.testing.assert_close(out[:, 2], torch.stack([tokens[:2].mean(0), tokens[2:].mean(0)]))
    torch.testing.assert_close(out[:, 3], tokens[[0, 2]])  # the newest kept token of each row


def test_candidate_match_marks_the_events_whose_attribute_equals_their_rows_target_ad():
    """Row 0's target is in category 3, row 1's in 5; a missing id (0) never matches, nor does an absent target."""
    torch.manual_seed(0)
    tokenizer = SequenceTokenizer(SPEC, 16, 8, match_candidate=True)
    (column,) = SPEC.sequence_attribute_columns.values()
    side, lengths = {column: torch.tensor([3, 5, 0, 5, 3, 3])}, torch.tensor([3, 2, 1])
    target = {column: torch.tensor([3, 5, -1])}
    rows = tokenizer.match[column].weight
    expected = rows[torch.tensor([1, 0, 0, 1, 0, 0])]
    assert torch.equal(tokenizer.candidate_match(side, target, lengths), expected)
    assert not torch.equal(rows[0], rows[1])


def _batch(n: int, seed: int = 0, max_len: int = 40) -> pa.Table:
    return random_examples(SPEC, n, seed, max_len)


VARIANTS = [("gem", a) for a in ABLATIONS] + [(arch, {}) for arch in ARCHITECTURES if arch != "gem"]


@pytest.mark.parametrize("arch, ablation", VARIANTS)
def test_every_variant_trains_every_dense_parameter(arch, ablation):
    torch.manual_seed(0)
    model = GemModel(SPEC, dataclasses.replace(CFG.model, architecture=arch, **ablation))
    out = model(features_to_kjt(_batch(16), SPEC))
    assert out.logits.shape == (16, 2) and torch.isfinite(out.logits).all()
    (out.logits.sum() + (out.user_embedding * out.ad_embedding).sum()).backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []  # DDP needs no unused parameters


@pytest.mark.parametrize("ablation", ABLATIONS)
def test_a_rows_prediction_does_not_depend_on_the_rest_of_the_batch(ablation):
    """Jagged all the way: no padding to the batch maximum leaks between rows."""
    torch.manual_seed(0)
    model = GemModel(SPEC, dataclasses.replace(CFG.model, **ablation)).eval()
    table = _batch(6, seed=3, max_len=200)
    together = model(features_to_kjt(table, SPEC)).logits
    assert torch.equal(model.logits(features_to_kjt(table, SPEC)), together)  # scoring's path, towers skipped
    for i in range(6):
        alone = model.logits(features_to_kjt(table.slice(i, 1), SPEC))
        assert torch.allclose(alone, together[i : i + 1], atol=1e-5), i


def test_logistic_regression_adds_one_learned_number_per_feature_id():
    """`lr`: changing one feature's id moves the logits by the same amount whatever the other features
    and the history are (no interaction, no sequence)."""
    torch.manual_seed(0)
    model = GemModel(SPEC, dataclasses.replace(CFG.model, architecture="lr")).eval()
    table = _batch(2, seed=5, max_len=30)
    swapped = table.set_column(table.schema.get_field_index("ad_id_idx"), "ad_id_idx", pa.array([7, 7], pa.int64()))
    moved = [model.logits(features_to_kjt(t, SPEC)) for t in (table, swapped)]
    original = table.column("ad_id_idx").to_pylist()
    assert original[0] != original[1]
    delta = moved[1] - moved[0]  # rows differ in every other feature and in their sequences
    for row in (0, 1):
        same_id = table.set_column(
            table.schema.get_field_index("ad_id_idx"), "ad_id_idx", pa.array([original[row]] * 2, pa.int64())
        )
        base = model.logits(features_to_kjt(same_id, SPEC))
        assert torch.allclose(model.logits(features_to_kjt(swapped, SPEC)) - base, delta[row].expand(2, -1), atol=1e-5)


def test_surface_heads_keep_a_correction_per_surface():
    torch.manual_seed(0)
    heads = MultiSurfaceHeads(in_dim=8, shared_dims=(16,), surface_dims=(4,), n_surfaces=3, n_tasks=2)
    h = torch.randn(1, 8).expand(3, 8)
    assert torch.allclose(heads(h, torch.tensor([0, 1, 2])), heads(h, torch.tensor([0, 0, 0])))  # starts shared
    with torch.no_grad():
        heads.w2[1].fill_(1.0)
    logits = heads(h, torch.tensor([0, 1, 2]))
    assert torch.allclose(logits[0], logits[2]) and not torch.allclose(logits[0], logits[1])


def test_ranking_needs_the_surface_but_embeddings_do_not():
    model = GemModel(SPEC, CFG.model)
    users = _batch(4).drop_columns(["surface_idx"])
    with pytest.raises(ValueError, match="exactly one 'surface' id"):
        model(features_to_kjt(users, SPEC))
    assert model.user_embedding(features_to_kjt(users, SPEC)).shape == (4, CFG.model.repr_dim)


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"architecture": "xgboost"}, "model.architecture"),
        ({"sequence": {"pyramid": []}}, "pyramid"),
        ({"experimental": {"attention_activation": "relu"}}, "attention_activation"),
        ({"sequence": {"dim": 30, "heads": 4}}, "divisible"),
        ({"experimental": {"comp_skip": True}}, r"comp_skip needs model.experimental.seed_pooling=true"),
        ({"experimental": {"pffn": "dense"}}, "model.experimental.pffn"),
        ({"experimental": {"wukong_experts": 3}}, "model.wukong.n_fm=8 must be divisible by"),
    ],
)
def test_model_config_errors_name_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        GemConfig.from_dict({"model": bad})
