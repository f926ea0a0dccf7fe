"""GEM's parts: Wukong, the heads, and the assembled models (the timeline arch's own: test_timeline.py)."""

import dataclasses

import pyarrow as pa
import pytest
import torch

from gem_model.config import ARCHITECTURES, ExperimentalConfig, GemConfig, WukongConfig
from gem_model.data.loader import features_to_kjt, timelines_to_kjt
from gem_model.models.gem import GemModel
from gem_model.modules.heads import MultiSurfaceHeads
from gem_model.modules.wukong import WukongExperts, WukongLayer, low_rank_fm
from gem_model.testing.examples import impression_alone, random_examples, random_timelines

CFG = GemConfig()
SPEC = CFG.features
ABLATIONS = [
    {},
    {"use_wukong": False},
    {"use_sequence": False},
    # The events without the match signal; a sliding window shorter than the histories; Wukong experts.
    {"sequence": dataclasses.replace(CFG.model.sequence, match_candidate=False)},
    {"sequence": dataclasses.replace(CFG.model.sequence, window=4)},
    {"experimental": ExperimentalConfig(wukong_experts=2)},
]


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


def test_wukong_experts_mix_only_their_own_group():
    torch.manual_seed(0)
    layer = WukongExperts(n_in=5, dim=4, config=WukongConfig(n_fm=4, n_lc=2, rank=2), n_experts=2)
    x = torch.randn(3, 5, 4)
    out = layer(x)
    assert out.shape == (3, 6, 4) and layer.sizes == [3, 2]
    moved = x.clone()
    moved[:, 4] += 1.0  # the second expert's group
    torch.testing.assert_close(layer(moved)[:, :3], out[:, :3])


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
        ({"sequence": {"layers": 0}}, "model.sequence.layers"),
        ({"sequence": {"dim": 30, "heads": 4}}, "divisible"),
        ({"experimental": {"wukong_experts": 3}}, "model.wukong.n_fm=8 must be divisible by"),
    ],
)
def test_model_config_errors_name_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        GemConfig.from_dict({"model": bad})


@pytest.mark.parametrize("ablation", ABLATIONS[:1] + ABLATIONS[3:5])
def test_a_timeline_gives_each_impression_the_logits_it_gets_with_only_its_visible_events(ablation):
    """Encoded once per user: each impression of a batch of timelines scores as if it were alone with the events
    before it, none after (causal encoding, reads of the visible prefix), whatever else shares its timeline."""
    torch.manual_seed(0)
    model = GemModel(SPEC, dataclasses.replace(CFG.model, **ablation)).eval()
    timelines = random_timelines(SPEC, 5, seed=4, max_events=30)
    together = model.logits(timelines_to_kjt(timelines, SPEC))
    at = 0
    for row, visible in enumerate(timelines.column("visible").to_pylist()):
        for i in range(len(visible)):
            alone = model.logits(timelines_to_kjt(impression_alone(timelines, SPEC, row, i), SPEC))
            torch.testing.assert_close(alone, together[at : at + 1], rtol=1e-5, atol=1e-5)
            at += 1
    assert at == together.shape[0] > 5


def test_an_impressions_logits_ignore_every_event_at_or_after_it_and_use_every_one_before():
    """Point-in-time through the model: perturbing an event an impression may not see (position >= visible)
    leaves its logits unchanged; perturbing one it sees (another item there) changes them."""
    torch.manual_seed(0)
    model = GemModel(SPEC, CFG.model).eval()
    rows = random_timelines(SPEC, 2, seed=7, max_events=30)
    one = rows.slice(1, 1).to_pylist()[0]
    n_events = len(one[SPEC.sequence_idx_column])
    assert n_events >= 6
    visible = [0, 2, n_events // 2, n_events - 1]  # four impressions of one ad at four times
    one |= {"visible": visible, "target_age_idx": [1] * 4, "ts": [one["ts"][0]] * 4}
    for f in SPEC.features:
        if f.side != "user":
            one[f.idx_column] = one[f.idx_column][:1] * 4
    items = one[SPEC.sequence_idx_column]
    base = model.logits(timelines_to_kjt(pa.Table.from_pylist([one], schema=rows.schema), SPEC))
    for event in range(n_events):
        moved = one | {SPEC.sequence_idx_column: [*items[:event], items[event] + 1, *items[event + 1 :]]}
        logits = model.logits(timelines_to_kjt(pa.Table.from_pylist([moved], schema=rows.schema), SPEC))
        for i, seen in enumerate(visible):
            if event < seen:
                assert not torch.equal(logits[i], base[i]), (event, i)
            else:
                torch.testing.assert_close(logits[i], base[i], rtol=0, atol=0, msg=f"event {event}, impression {i}")


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_gems_towers_train_on_the_embeddings_without_moving_them_and_the_baselines_move_them(architecture):
    """GEM's retrieval loss reaches the towers, not the shared tables (its ranking loss owns those); a baseline's
    reaches its tables too (DCN-V2 trains poorly without it)."""
    torch.manual_seed(0)
    model = GemModel(SPEC, dataclasses.replace(CFG.model, architecture=architecture))
    out = model(features_to_kjt(_batch(8), SPEC))
    (out.user_embedding * out.ad_embedding).sum().backward()
    moved = [p.grad is not None and bool(p.grad.abs().sum() > 0) for p in model.sparse_arch.parameters()]
    assert (not any(moved)) if architecture == "gem" else any(moved)
    assert all(p.grad is not None for p in (*model.user_tower.parameters(), *model.ad_tower.parameters()))
