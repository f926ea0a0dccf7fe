"""The timeline arch: per-impression reads of a batch's timelines, and point-in-time correctness through it."""

import pytest
import torch

from gem_model.modules.timeline import DECAY_MINUTES, Matches, TargetReader, TimelineEncoder, Timelines

DIM, HEADS, D = 8, 2, 6
# Three timelines over six impression rows: 4 events and 3 impressions, none and 1, 5 and 2.
EVENTS = torch.tensor([4, 0, 0, 0, 5, 0])
STARTS = torch.tensor([1, 0, 0, 1, 1, 0])
VISIBLE = torch.tensor([0, 2, 4, 0, 3, 5])


def _timelines() -> Timelines:
    return Timelines.from_rows(EVENTS, STARTS, VISIBLE)


def _visible_rows(timelines: Timelines) -> list[range]:
    first = timelines.first_event().tolist()
    return [range(f, f + v) for f, v in zip(first, timelines.visible.tolist())]


def test_timelines_group_rows_by_their_first_impression():
    t = _timelines()
    assert t.first_rows.tolist() == [0, 3, 4]
    assert t.event_offsets.tolist() == [0, 4, 4, 9]
    assert t.impression_offsets.tolist() == [0, 3, 4, 6]
    assert t.timeline_of().tolist() == [0, 0, 0, 1, 2, 2]
    assert t.first_event().tolist() == [0, 0, 0, 4, 4, 4]


@pytest.mark.parametrize(
    ("events", "starts", "visible", "message"),
    [
        (EVENTS, torch.tensor([0, 1, 0, 1, 1, 0]), VISIBLE, "row 0 must start a timeline"),
        (torch.tensor([4, 1, 0, 0, 5, 0]), STARTS, VISIBLE, "only on the first row"),
        (EVENTS, STARTS, torch.tensor([0, 2, 5, 0, 3, 5]), r"visible\[2\]=5 must be between 0 and its timeline's 4"),
        (EVENTS, STARTS, VISIBLE[:5], "one entry per impression row"),
    ],
)
def test_timelines_refuse_a_malformed_batch(events, starts, visible, message):
    with pytest.raises(ValueError, match=message):
        Timelines.from_rows(events, starts, visible)


def test_visible_mean_and_newest_read_only_the_visible_events():
    t = _timelines()
    values = torch.arange(9, dtype=torch.float32).unsqueeze(1) * torch.tensor([[1.0, -2.0]])
    rows = _visible_rows(t)
    expected_mean = torch.stack([values[list(r)].mean(0) if len(r) else torch.zeros(2) for r in rows])
    torch.testing.assert_close(t.visible_mean(values), expected_mean)
    newest = t.newest(values, 3)
    for i, r in enumerate(rows):
        want = [values[j] for j in reversed(r)][:3]
        want += [torch.zeros(2)] * (3 - len(want))
        torch.testing.assert_close(newest[i], torch.stack(want))


def test_matches_count_the_visible_events_that_share_the_candidates_id():
    t = _timelines()
    event_ids = torch.tensor([3, 1, 3, 0, 2, 2, 2, 0, 7])
    candidates = torch.tensor([3, 3, 0, 2, 2, 7])
    expected = [
        sum(int(event_ids[j] == c) for j in r) if c > 0 else 0 for r, c in zip(_visible_rows(t), candidates.tolist())
    ]
    assert expected == [0, 1, 0, 0, 3, 1]
    count, newest = t.matches(event_ids, candidates)
    assert count.tolist() == expected
    assert newest.tolist() == [-1, 0, -1, -1, 6, 8]  # the newest visible match's index in the events
    # Several ids an impression, one sort: column by column as if asked one at a time.
    other = torch.tensor([1, 2, 3, 7, 0, 2])
    counts, newests = t.matches(event_ids, torch.stack([candidates, other], dim=1))
    for column, ids in enumerate((candidates, other)):
        one_count, one_newest = t.matches(event_ids, ids)
        assert one_count.tolist() == counts[:, column].tolist() and one_newest.tolist() == newests[:, column].tolist()


def test_matches_give_each_kinds_newest_event_its_age_before_the_impression_and_its_action():
    t = _timelines()
    event_ids = torch.tensor([3, 1, 3, 0, 2, 2, 2, 0, 7])
    minutes = torch.tensor([900, 700, 300, 100, 1000, 500, 40, 20, 10])  # before the timeline's instant
    target_minutes = torch.tensor([1000, 600, 50, 0, 30, 0])
    actions = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9])
    found = Matches.find(t, [(event_ids, torch.tensor([3, 3, 0, 2, 2, 7]))], minutes, target_minutes, actions, 8, 16)
    # Kind 0, any visible event: impression 1 sees events 0-1 (newest 1, 700 - 600 = 100 minutes: bucket 6).
    assert found.counts.tolist() == [[0, 0], [2, 1], [4, 0], [0, 0], [3, 3], [5, 1]]
    assert found.age.tolist() == [[8, 8], [6, 7], [5, 8], [8, 8], [3, 3], [3, 3]]  # 300 minutes: capped at 7
    assert found.action.tolist() == [[16, 16], [2, 1], [4, 16], [16, 16], [7, 7], [9, 9]]
    # Decayed recency exp(-minutes / tau) per tau, 0 where nothing matches: impression 1's any-event match is
    # 100 minutes old, its item match (event 0) 300.
    tau = torch.tensor(DECAY_MINUTES, dtype=torch.float64)
    torch.testing.assert_close(found.decay[1].double(), torch.stack([torch.exp(-100 / tau), torch.exp(-300 / tau)]))
    assert found.decay.shape == (6, 2, len(DECAY_MINUTES))
    assert not found.decay[0].any() and not found.decay[2, 1].any()


def _arch(seed: int = 0) -> tuple[TimelineEncoder, TargetReader]:
    torch.manual_seed(seed)
    encoder = TimelineEncoder(DIM, HEADS, layers=2, window=2)
    reader = TargetReader(
        candidate_dim=5, dim=DIM, heads=HEADS, n_queries=2, n_recent=2, read_window=3, embedding_dim=D,
        attribute_buckets={"seq_category_idx": 4}, age_buckets=3, match=True, match_kinds=2, action_buckets=5,
        action_kinds=1,
    )  # fmt: skip
    return encoder.eval(), reader.eval()


def _read(encoder, reader, tokens, t, attributes, candidate, candidate_attributes):
    minutes = torch.arange(attributes.numel(), 0, -1) * 100
    matches = Matches.find(
        t, [(attributes, candidate_attributes)] * 2, minutes, torch.zeros(6, dtype=torch.int64), attributes, 3, 5
    )  # the second pair as a kind of the action token
    return reader(
        encoder(tokens, t),
        t,
        candidate,
        torch.tensor([0, 1, 2, 0, 1, 2]),
        {"seq_category_idx": attributes},
        {"seq_category_idx": candidate_attributes},
        matches,
    )


def test_an_impression_reads_nothing_at_or_after_its_time():
    """Perturbing any event an impression may not see (position >= visible) leaves its output unchanged; perturbing
        one it sees changes it, through the encoding and the mean when it lies before the read window (3). The encoder's
    window (2) is shorter than the timelines, so the sliding path runs."""
    encoder, reader = _arch()
    t = _timelines()
    torch.manual_seed(1)
    tokens = torch.randn(9, DIM)
    attributes = torch.tensor([1, 2, 3, 0, 1, 1, 2, 3, 3])
    candidate, candidate_attributes = torch.randn(6, 5), torch.tensor([1, 2, 3, 0, 1, 3])
    base = _read(encoder, reader, tokens, t, attributes, candidate, candidate_attributes)
    assert base.shape == (6, reader.n_tokens, D)
    first = t.first_event().tolist()
    for event in range(9):
        moved_tokens, moved_attributes = tokens.clone(), attributes.clone()
        moved_tokens[event] += torch.linspace(-1.0, 1.0, DIM)  # not a constant: the LayerNorms would drop it
        moved_attributes[event] = (moved_attributes[event] + 1) % 4
        out = _read(encoder, reader, moved_tokens, t, moved_attributes, candidate, candidate_attributes)
        for i, (start, seen) in enumerate(zip(first, t.visible.tolist())):
            own = t.event_offsets[t.timeline_of()[i]].item() <= event < t.event_offsets[t.timeline_of()[i] + 1].item()
            if own and event - start < seen:
                assert not torch.allclose(out[i], base[i]), (event, i)
            else:
                torch.testing.assert_close(out[i], base[i], rtol=0, atol=1e-6, msg=f"event {event}, impression {i}")


def test_gradients_reach_the_tokens_and_every_parameter():
    encoder, reader = _arch()
    encoder.train(), reader.train()
    t = _timelines()
    tokens = torch.randn(9, DIM, requires_grad=True)
    out = _read(encoder, reader, tokens, t, torch.tensor([1, 2, 3, 0, 1, 1, 2, 3, 3]), torch.randn(6, 5),
                torch.tensor([1, 2, 3, 0, 1, 3]))  # fmt: skip
    out.square().sum().backward()
    assert tokens.grad is not None and bool(tokens.grad.abs().sum() > 0)
    idle = [
        name
        for name, p in [*encoder.named_parameters(), *reader.named_parameters()]
        if p.grad is None or not bool(p.grad.abs().sum() > 0)
    ]
    assert idle == []
