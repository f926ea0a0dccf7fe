"""The timeline arch: a user's events encoded once, read by each of that user's impressions.

A batch is a set of user timelines. Timeline u holds the user's events, oldest first, and the user's impressions
of the day, in time order; impression i may read only the first `visible[i]` events, those strictly before it.
The expensive part depends on the user and time alone and runs once per timeline: causal jagged self-attention
over the events (`kernels.jagged_attention`, a sliding window for long histories), so encoded event j depends
on events 0..j only. The cheap part runs per impression and costs O(read window) however long the history:
queries made from the candidate ad and its context attend over the newest visible encoded events
(`kernels.target_attention`), the item attributes embedded into both queries and keys so an event like the
candidate scores high (the match signal as a term of q.k); the mean and the newest of the visible events come
from prefix sums and gathers, and the count of visible events that share the candidate's item or attribute ids
from a binary search. Nothing an impression reads lies at or after its timestamp, so point-in-time correctness
is exact by construction.

Rows of a batch are impressions. A timeline's events ride on the row of its first impression (every other row
of the timeline has none), so one KeyedJaggedTensor of fixed stride carries a batch and the item table looks each
event up once (`Timelines.from_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn

from gem_model.config import FeatureSpec
from kernels.jagged_attention import jagged_attention
from kernels.target_attention import target_attention


def offsets_of(lengths: torch.Tensor) -> torch.Tensor:
    """[B] lengths -> [B+1] offsets."""
    return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])


@dataclass(frozen=True)
class Timelines:
    """Which events each impression of a batch may read: U timelines over M impression rows and L events."""

    first_rows: torch.Tensor  # [U] the row of each timeline's first impression (where its events ride)
    event_offsets: torch.Tensor  # [U+1] the timelines' events, oldest first, in the batch's event order
    impression_offsets: torch.Tensor  # [U+1] the timelines' impressions (contiguous rows, in row order)
    visible: torch.Tensor  # [M] events of its timeline before each impression

    @classmethod
    def from_rows(cls, event_lengths: torch.Tensor, starts: torch.Tensor, visible: torch.Tensor) -> Timelines:
        """From per-row tensors [M]: the events on each row (non-zero only where a timeline starts), 1 where a row
        starts a timeline (row 0 must), and the visible counts."""
        if event_lengths.shape != starts.shape or starts.shape != visible.shape:
            raise ValueError(
                f"event lengths {tuple(event_lengths.shape)}, timeline starts {tuple(starts.shape)} and visible "
                f"{tuple(visible.shape)} must each have one entry per impression row"
            )
        starts = starts.bool()
        if starts.numel() and not bool(starts[0]):
            raise ValueError("row 0 must start a timeline: a batch holds whole timelines")
        if bool((event_lengths[~starts] != 0).any()):
            raise ValueError("events ride only on the first row of their timeline; another row carries some")
        first_rows = starts.nonzero().squeeze(1)
        impressions = offsets_of(torch.diff(first_rows, append=first_rows.new_tensor([starts.numel()])))
        events = event_lengths.index_select(0, first_rows)
        keys = events.repeat_interleave(impressions.diff())  # each impression's timeline length
        bad = ((visible < 0) | (visible > keys)).nonzero()
        if bad.numel():
            i = int(bad[0])
            raise ValueError(
                f"visible[{i}]={int(visible[i])} must be between 0 and its timeline's {int(keys[i])} events"
            )
        return cls(first_rows, offsets_of(events), impressions, visible)

    @property
    def n_impressions(self) -> int:
        return self.visible.numel()

    # The layouts below are read by every per-impression part of a forward: computed once per batch.
    @cached_property
    def _impression_timeline(self) -> torch.Tensor:
        return torch.repeat_interleave(
            torch.arange(self.first_rows.numel(), device=self.visible.device), self.impression_offsets.diff()
        )

    @cached_property
    def _first_event(self) -> torch.Tensor:
        return self.event_offsets[:-1].index_select(0, self._impression_timeline)

    @cached_property
    def _event_places(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """([L] each event's timeline, [L] its position in it, the longest timeline + 1)."""
        lengths = self.event_offsets.diff()
        timeline = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
        position = torch.arange(timeline.numel(), device=lengths.device) - self.event_offsets[:-1][timeline]
        return timeline, position, int(lengths.max()) + 1 if timeline.numel() else 1

    def timeline_of(self) -> torch.Tensor:
        """[M] each impression's timeline."""
        return self._impression_timeline

    def first_event(self) -> torch.Tensor:
        """[M] where each impression's timeline begins in the batch's events."""
        return self._first_event

    def visible_mean(self, values: torch.Tensor) -> torch.Tensor:
        """[M, D] the mean of each impression's visible events' values [L, D] (zeros where none is visible), from
        prefix sums: O(L) once and O(1) per impression. Summed in float64 so a long batch loses no precision."""
        sums = torch.cat([values.new_zeros(1, values.shape[1], dtype=torch.float64), values.double().cumsum(0)])
        first = self.first_event()
        total = sums.index_select(0, first + self.visible) - sums.index_select(0, first)
        return (total / self.visible.clamp(min=1).unsqueeze(1)).to(values.dtype)

    def newest(self, values: torch.Tensor, n: int) -> torch.Tensor:
        """[M, n, D] each impression's n newest visible events' values, newest first; zeros past its oldest."""
        place = self.visible.unsqueeze(1) - torch.arange(1, n + 1, device=values.device)  # [M, n] within timeline
        if values.shape[0] == 0:
            return values.new_zeros(self.n_impressions, n, values.shape[1])
        index = (self.first_event().unsqueeze(1) + place.clamp(min=0)).flatten().clamp(max=values.shape[0] - 1)
        picked = values.index_select(0, index).view(-1, n, values.shape[1])
        return picked * (place >= 0).unsqueeze(2).to(values.dtype)

    def matches(self, event_ids: torch.Tensor, candidate_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per impression, of its visible events that carry its candidate's id (event_ids [L], candidate_ids [M] or
        [M, C], C ids an impression; id 0, missing, matches nothing): how many there are, and the newest one's index
        in the events (-1 for none), each shaped like candidate_ids. Events sorted once by (timeline, id, position)
        and each impression's range found by binary search: O(L log L + M C log L), no impression x event product."""
        timeline, position, span = self._event_places
        ids = int(torch.cat([event_ids, candidate_ids.flatten()]).max()) + 1 if self.n_impressions else 1
        sorted_keys, order = torch.sort((timeline * ids + event_ids) * span + position)
        per_row = (-1,) + (1,) * (candidate_ids.dim() - 1)
        base = (self.timeline_of().view(per_row) * ids + candidate_ids) * span
        end = torch.searchsorted(sorted_keys, base + self.visible.view(per_row))
        count = (end - torch.searchsorted(sorted_keys, base)) * (candidate_ids > 0)
        newest = order[(end - 1).clamp(min=0)] if event_ids.numel() else end
        return count, torch.where(count > 0, newest, -1)


class EventTokenizer(nn.Module):
    """[L, D] item embeddings + side ids (action, age bucket, item attributes) -> [L, Ds] event tokens."""

    def __init__(self, spec: FeatureSpec, embedding_dim: int, dim: int) -> None:
        super().__init__()
        self.item = nn.Linear(embedding_dim, dim)
        self.side = nn.ModuleDict(
            {name: nn.Embedding(buckets, dim) for name, buckets in spec.sequence_side_columns.items()}
        )

    def forward(self, items: torch.Tensor, side: dict[str, torch.Tensor]) -> torch.Tensor:
        tokens = self.item(items)
        for name, table in self.side.items():
            ids = side[name]
            if ids.numel() != items.shape[0]:
                raise ValueError(
                    f"sequence side column {name} has {ids.numel()} ids for {items.shape[0]} events; "
                    "the feature table must carry it aligned with the sequence"
                )
            tokens = tokens + table(ids)
        return tokens


# Time constants (minutes) of the newest match's decayed recency: an hour, six hours, a day, a week.
DECAY_MINUTES = (60.0, 360.0, 1440.0, 10080.0)


@dataclass(frozen=True)
class Matches:
    """Per impression and kind of match (any visible event, one sharing the candidate's item or one of its
    attributes, one of those of a given action): how many visible events match [M, K], the newest one's age
    bucket before the impression [M, K] (`age_buckets` for none), its action [M, K] (`action_buckets` for none)
    and its decayed recency exp(-minutes before the impression / tau) for each tau of `DECAY_MINUTES` [M, K, T]
    (0 for none): the shape of an interest that fades, exact where the log2 buckets are coarse."""

    counts: torch.Tensor
    age: torch.Tensor
    action: torch.Tensor
    decay: torch.Tensor

    @classmethod
    def find(
        cls,
        timelines: Timelines,
        pairs: list[tuple[torch.Tensor, torch.Tensor]],
        event_minutes: torch.Tensor,
        target_minutes: torch.Tensor,
        event_actions: torch.Tensor,
        age_buckets: int,
        action_buckets: int,
    ) -> Matches:
        """Any visible event, then each (event ids [L], candidate ids [M] or [M, C]) pair's matches, C kinds for one
        sort of the events (`Timelines.matches`). event_minutes [L] and target_minutes [M] count back from the
        timeline's instant, so an event's age before an impression is their difference; event_actions [L] are the
        events' action rows."""
        last = timelines.first_event() + timelines.visible - 1
        counts, newest = [timelines.visible.unsqueeze(1)], [torch.where(timelines.visible > 0, last, -1).unsqueeze(1)]
        for events, candidates in pairs:
            count, index = timelines.matches(events, candidates)
            counts.append(count.view(timelines.n_impressions, -1))
            newest.append(index.view(timelines.n_impressions, -1))
        counts, index = torch.cat(counts, dim=1), torch.cat(newest, dim=1)  # [M, K]
        found = index >= 0
        if event_minutes.numel() == 0:
            none = torch.zeros_like(index)
            decay = torch.zeros(*index.shape, len(DECAY_MINUTES), device=index.device)
            return cls(counts, none + age_buckets, none + action_buckets, decay)
        safe = index.clamp(min=0)
        gap = (event_minutes[safe] - target_minutes.unsqueeze(1)).clamp(min=0)
        age = torch.floor(torch.log2(1.0 + gap.double())).long().clamp(max=age_buckets - 1)
        tau = torch.tensor(DECAY_MINUTES, dtype=torch.float64, device=gap.device)
        decay = torch.exp(-gap.double().unsqueeze(2) / tau) * found.unsqueeze(2)
        return cls(
            counts,
            torch.where(found, age, age_buckets),
            torch.where(found, event_actions[safe], action_buckets),
            decay.float(),
        )


class CausalBlock(nn.Module):
    """Pre-LN transformer block over a batch of timelines: each event attends to itself and the events before it
    (at most `window` before it, when window > 0), so its output never depends on a later event."""

    def __init__(self, dim: int, heads: int, window: int) -> None:
        super().__init__()
        self.dim, self.heads, self.window = dim, heads, window
        self.norm_attn, self.norm_ffn = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.ffn = nn.Sequential(nn.Linear(dim, 2 * dim), nn.SiLU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
        q, k, v = self.qkv(self.norm_attn(x)).view(-1, 3, self.heads, self.dim // self.heads).unbind(1)
        attended = jagged_attention(
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            offsets,
            max_seq_len=max(max_len, 1),
            causal=True,
            window=self.window if 0 < self.window < max_len - 1 else None,
        )
        x = x + self.out(attended.reshape(-1, self.dim))
        return x + self.ffn(self.norm_ffn(x))


class TimelineEncoder(nn.Module):
    """[L, Ds] event tokens of a batch's timelines -> [L, Ds] encoded, causally, once per timeline."""

    def __init__(self, dim: int, heads: int, layers: int, window: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([CausalBlock(dim, heads, window) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor, timelines: Timelines) -> torch.Tensor:
        lengths = timelines.event_offsets.diff()
        max_len = int(lengths.max()) if lengths.numel() else 0
        for block in self.blocks:
            tokens = block(tokens, timelines.event_offsets, max_len)
        return self.norm(tokens)


class TargetReader(nn.Module):
    """Per impression: `n_queries` queries from the candidate [M, C] (its ad and context embeddings) attend over
    the newest `read_window` of its visible encoded events (all of them when 0: an impression's cost then grows with
    its history); with the mean and the `n_recent` newest visible events, projected to the embedding dim D, and
    (with `match`) a token of the matches over every visible event, gated into [M, n_tokens, D].

    With `match`, `attribute_rows[c]` embeds item attribute c (one table, row 0 = missing, zero): the candidate's
    row joins its queries and each event's row its keys, so q.k rises where an event's attributes equal the
    candidate's; `attribute_buckets` maps each attribute's event column to its rows. The match token sums, for
    each of the first `match_kinds` kinds of match (`Matches`), maps of the count of matching visible events, their
    share of the visible events (how much of the user's history is like the candidate: attention, normalised over
    the visible events, does not say it) and the newest one's decayed recency, and learned rows for its age bucket
    and its action. The `action_kinds` kinds after them (a kind per action: "an add-to-cart in the candidate's
    category") make a token of their own from their counts, shares and decayed recency alone."""

    def __init__(
        self,
        candidate_dim: int,
        dim: int,
        heads: int,
        n_queries: int,
        n_recent: int,
        read_window: int,
        embedding_dim: int,
        attribute_buckets: dict[str, int],
        age_buckets: int,
        match: bool,
        match_kinds: int = 0,
        action_buckets: int = 0,
        action_kinds: int = 0,
    ) -> None:
        super().__init__()
        self.dim, self.heads, self.n_queries, self.n_recent = dim, heads, n_queries, n_recent
        self.read_window = read_window or None
        self.n_tokens = n_queries + 1 + n_recent + int(match) + int(match and action_kinds > 0)
        self.match_kinds = match_kinds
        attribute_buckets = attribute_buckets if match else {}
        self.query = nn.Linear(candidate_dim, n_queries * dim)
        self.query_age = nn.Embedding(age_buckets, n_queries * dim)
        self.attribute_rows = nn.ModuleDict(
            {column: nn.Embedding(buckets, dim, padding_idx=0) for column, buckets in attribute_buckets.items()}
        )
        self.key_norm = nn.LayerNorm(dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, embedding_dim)
        self.match = nn.Linear(match_kinds * (2 + len(DECAY_MINUTES)), embedding_dim) if match else None
        # Per kind of match, a row per age bucket and per action of its newest event, and one for "none".
        self.ages, self.actions = age_buckets + 1, action_buckets + 1
        self.match_age = nn.Embedding(match_kinds * self.ages, embedding_dim) if match else None
        self.match_action = nn.Embedding(match_kinds * self.actions, embedding_dim) if match else None
        self.action_match = (
            nn.Linear(action_kinds * (2 + len(DECAY_MINUTES)), embedding_dim) if match and action_kinds else None
        )
        self.gate = nn.Linear(self.n_tokens * embedding_dim, self.n_tokens)

    def forward(
        self,
        encoded: torch.Tensor,
        timelines: Timelines,
        candidate: torch.Tensor,
        target_age: torch.Tensor,
        event_attributes: dict[str, torch.Tensor],
        candidate_attributes: dict[str, torch.Tensor],
        matches: Matches | None,
    ) -> torch.Tensor:
        """encoded [L, Ds]; candidate [M, C]; target_age [M] each impression's age bucket; event_attributes /
        candidate_attributes: column -> [L] / [M] attribute rows; `matches` of `match_kinds` kinds, None without
        `match`."""
        m, n_q, heads, head_dim = timelines.n_impressions, self.n_queries, self.heads, self.dim // self.heads
        keys = self.key_norm(encoded)
        queries = self.query(candidate) + self.query_age(target_age)  # [M, n_q * Ds]
        for column, table in self.attribute_rows.items():
            keys = keys + table(event_attributes[column])
            queries = queries + table(candidate_attributes[column]).repeat(1, n_q)
        k, v = self.kv(keys).view(-1, 2, heads, head_dim).unbind(1)
        q = queries.to(k.dtype).view(m * n_q, heads, head_dim)  # under autocast the embeddings' sum stays fp32
        longest = timelines.impression_offsets.diff()
        read = target_attention(
            q,
            timelines.impression_offsets * n_q,
            k.contiguous(),
            v.contiguous(),
            timelines.event_offsets,
            timelines.visible.repeat_interleave(n_q),
            max_targets=max(int(longest.max()) * n_q if longest.numel() else 0, 1),
            max_seq_len=max(int(timelines.event_offsets.diff().max()) if longest.numel() else 0, 1),
            window=self.read_window,
        )
        parts = torch.cat(
            [
                self.out(read.reshape(m, n_q, self.dim)),
                timelines.visible_mean(encoded).unsqueeze(1),
                timelines.newest(encoded, self.n_recent),
            ],
            dim=1,
        )
        tokens = self.proj(parts)
        if self.match is not None:
            if matches is None:
                raise ValueError("a TargetReader with `match` needs the matches")
            k = self.match_kinds
            kinds = torch.arange(k, device=tokens.device)
            # [M, K, 2 + T]: each kind's log count, its share of the visible events and decayed recency.
            counts = matches.counts.to(tokens.dtype)
            share = counts / timelines.visible.clamp(min=1).unsqueeze(1).to(tokens.dtype)
            values = torch.cat([torch.log1p(counts).unsqueeze(2), share.unsqueeze(2), matches.decay], dim=2)
            values = values.to(tokens.dtype)
            found = [
                self.match(values[:, :k].flatten(1))
                + self.match_age(kinds * self.ages + matches.age[:, :k]).sum(1)
                + self.match_action(kinds * self.actions + matches.action[:, :k]).sum(1)
            ]
            if self.action_match is not None:
                found.append(self.action_match(values[:, k:].flatten(1)))
            tokens = torch.cat([tokens, torch.stack(found, dim=1)], dim=1)
        return torch.sigmoid(self.gate(tokens.flatten(1))).unsqueeze(2) * tokens
