"""The cost of long histories in the timeline arch: per user (encoding) and per impression (reading) against L.

    .venv/bin/python -m bench.perf.sequence_cost --lengths 256,1024,4096,8192 --impressions 27

For each history length L: a batch of users (--tokens // L, at least 1), each a timeline as gold.user_timelines
holds one, L events of which the last --day-events fall on the day, with --impressions impressions spread over
that day (impression i sees the first L - day + round((i + 1) day / (impressions + 1)) events). Through the
model's own parts at the default `model.sequence` config: the `TimelineEncoder` (causal jagged attention over
each user's events, with `--window`, default the config's) and the `TargetReader` (each impression's queries
over the newest `--read-window` of its visible encoded events, default the config's, the visible mean and newest
events, the match tokens). Each part runs forward + backward on its own; reported per user (encoding) and per
impression (reading: all of the reader's work over the impressions, its per-user part included), the median of
--reps steps after one warm-up, at 1 torch thread unless --threads; and what an added impression costs (the read
with twice the impressions, less the read, over the impressions added), the per-impression part alone. That
part should be nearly flat in L with a read window (linear without one); the reader's per-user part (the keys'
projections, the matches' sorts, prefix sums) is linear in L, and the encoding linear with an encoder window
and quadratic without.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from collections.abc import Callable

import torch

from gem_model.config import GemConfig
from gem_model.modules.timeline import Matches, TargetReader, TimelineEncoder, Timelines


def _timelines(users: int, length: int, impressions: int, day_events: int) -> Timelines:
    day = min(day_events, length)
    visible = [length - day + round((i + 1) * day / (impressions + 1)) for i in range(impressions)] * users
    rows = users * impressions
    starts = torch.zeros(rows, dtype=torch.int64)
    starts[::impressions] = 1
    return Timelines.from_rows(starts * length, starts, torch.tensor(visible, dtype=torch.int64))


def _median(step: Callable[[], None], reps: int) -> float:
    step()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(
    length: int, users: int, impressions: int, day_events: int, window: int, read_window: int, reps: int
) -> dict:
    cfg = GemConfig()
    seq, spec, d = cfg.model.sequence, cfg.features, cfg.model.embedding_dim
    attributes = {column: spec.sequence_side_columns[column] for column in spec.sequence_attribute_columns.values()}
    encoder = TimelineEncoder(seq.dim, seq.heads, seq.layers, window)
    candidate_dim = d * (len(spec.side("ad")) + len(spec.side("context")))
    reader = TargetReader(
        candidate_dim,
        seq.dim,
        seq.heads,
        seq.queries,
        seq.n_recent,
        read_window,
        d,
        attributes,
        spec.age_buckets,
        match=True,
        match_kinds=2 + len(attributes),
        action_buckets=spec.action_buckets,
    )
    n_events = users * length
    items = spec.item_feature.buckets
    events = {column: torch.randint(1, buckets, (n_events,)) for column, buckets in attributes.items()}
    event_items = torch.randint(1, items, (n_events,))
    minutes, actions = torch.randint(0, 100_000, (n_events,)), torch.randint(0, spec.action_buckets, (n_events,))
    encoding_timelines = _timelines(users, length, impressions, day_events)

    def encode() -> None:
        tokens = torch.randn(n_events, seq.dim, requires_grad=True)
        encoder(tokens, encoding_timelines).sum().backward()

    def reading(per_user: int) -> Callable[[], None]:
        timelines = _timelines(users, length, per_user, day_events)
        m = timelines.n_impressions
        candidates = {column: torch.randint(1, buckets, (m,)) for column, buckets in attributes.items()}
        candidate_items = torch.randint(1, items, (m,))

        def read() -> None:
            encoded = torch.randn(n_events, seq.dim, requires_grad=True)
            pairs = [(event_items, candidate_items), *((events[c], candidates[c]) for c in attributes)]
            matches = Matches.find(
                timelines, pairs, minutes, torch.zeros(m, dtype=torch.int64), actions, spec.age_buckets,
                spec.action_buckets,
            )  # fmt: skip
            out = reader(
                encoded,
                timelines,
                torch.randn(m, candidate_dim),
                torch.randint(0, spec.age_buckets, (m,)),
                events,
                candidates,
                matches,
            )
            out.sum().backward()

        return read

    encode_s = _median(encode, reps)
    read_s, read_twice_s = (_median(reading(n), reps) for n in (impressions, 2 * impressions))
    m = users * impressions
    return {
        "length": length,
        "users": users,
        "impressions": m,
        "window": window,
        "read_window": read_window,
        "encode_ms_per_user": 1e3 * encode_s / users,
        "read_ms_per_impression": 1e3 * read_s / m,
        # What one more impression adds: the reader's per-user work (projections, sorts, prefix sums) cancels.
        "read_ms_per_added_impression": 1e3 * (read_twice_s - read_s) / m,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="256,1024,4096,8192")
    parser.add_argument("--impressions", type=int, default=27, help="impressions per user")
    parser.add_argument("--tokens", type=int, default=16384, help="events a batch (users = tokens // L, at least 1)")
    parser.add_argument("--day-events", type=int, default=64, help="events of the day the impressions fall among")
    parser.add_argument("--window", type=int, default=None, help="the encoder's window; default the config's")
    parser.add_argument("--read-window", type=int, default=None, help="the reader's window; default the config's")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    seq = GemConfig().model.sequence
    window = seq.window if args.window is None else args.window
    read_window = seq.read_window if args.read_window is None else args.read_window
    lengths = [int(x) for x in args.lengths.split(",")]
    results = []
    for length in lengths:
        users = max(1, args.tokens // length)
        results.append(measure(length, users, args.impressions, args.day_events, window, read_window, args.reps))
        print(json.dumps(results[-1]), flush=True)
    print(
        f"\n{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s), window {window}, "
        f"read window {read_window}, {args.impressions} impressions a user among the last {args.day_events} events; "
        "forward + backward\n"
    )
    print("| L events a user | encoding ms a user | reading ms an impression | ms an added impression |")
    print("|---|---|---|---|")
    for r in results:
        print(
            f"| {r['length']:,} | {r['encode_ms_per_user']:.2f} | {r['read_ms_per_impression']:.3f} "
            f"| {r['read_ms_per_added_impression']:.3f} |"
        )
    print("\nlog-log slope against L (0 flat, 1 linear, 2 quadratic):\n")
    print("| from L | to L | encoding | reading | an added impression |")
    print("|---|---|---|---|---|")
    keys = ("encode_ms_per_user", "read_ms_per_impression", "read_ms_per_added_impression")
    for a, b in zip(results, results[1:]):
        ratio = math.log(b["length"] / a["length"])
        slopes = [math.log(b[k] / a[k]) / ratio if a[k] > 0 and b[k] > 0 else math.nan for k in keys]
        print(f"| {a['length']:,} | {b['length']:,} | " + " | ".join(f"{x:.2f}" for x in slopes) + " |")


if __name__ == "__main__":
    main()
