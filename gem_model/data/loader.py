"""Stream Delta feature tables into TorchRec KeyedJaggedTensors, one shard per rank.

Each rank opens the Delta table itself at a pinned version (delta-rs, no Spark driver in the
path), lists the table's data files for the `ds` range with their row counts (Parquet footers),
and takes its own share of whole files (balanced by rows, the same assignment computed on every
rank), so each rank reads only its files, in Arrow record batches of the needed columns. It
emits fixed-size batches; every rank yields exactly `len(stream)` batches (the largest shard's
count), the last ones padded with `valid = False` rows, so collective ops in a sharded model stay
in lockstep and no row is dropped. Memory is bounded by the shuffle buffer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from gem_model.config import FeatureSpec

KEY_COLUMNS = ("impression_id", "user_id", "ad_id", "surface", "ds")
LABEL_COLUMNS = ("clicked", "converted")
TRUTH_COLUMNS = ("p_click", "p_convert")


def open_delta(path: Path, version: int | None = None, spec: FeatureSpec | None = None) -> pads.Dataset:
    """An Arrow dataset over the Delta table at `path`, at `version` (latest when None); with `spec`, a feature
    table whose rows must have been mapped to embedding rows as `spec` maps them (`require_mapping`)."""
    if not (Path(path) / "_delta_log").is_dir():
        raise FileNotFoundError(f"no Delta table at {path}; materialise the asset that writes it first")
    from deltalake import DeltaTable  # here, not at import: the model and its GPU check run without Delta

    if spec is not None:
        require_mapping(Path(path), spec.mapping, version, reader=True)
    return DeltaTable(str(path), version=version).to_pyarrow_dataset()


class FeatureMappingError(ValueError):
    pass


# The commit metadata key of the feature mapping (`FeatureSpec.mapping`) a feature table's rows were written with.
MAPPING_KEY = "feature_mapping"
# Removed and rebuilt to move a lake to another mapping: bronze stays, and each of these is derived from it.
FEATURE_TABLES = (
    "silver/user_features",
    "silver/ad_features",
    "gold/user_sequences",
    "gold/training_examples",
    "gold/user_timelines",
)


def recorded_mapping(path: Path, version: int | None = None) -> str | None:
    """The mapping of the newest commit (at or before `version`) that recorded one; None when none did."""
    from deltalake import DeltaTable

    for commit in DeltaTable(str(path)).history():  # newest first
        if version is not None and commit.get("version", -1) > version:
            continue
        info = json.loads(commit.get("userMetadata") or "{}")
        if MAPPING_KEY in info:
            return str(info[MAPPING_KEY])
    return None


def require_mapping(path: Path, mapping: str, version: int | None = None, reader: bool = False) -> None:
    """A `FeatureMappingError` unless the rows of the feature table at `path` (if any) were mapped with `mapping`:
    a writer about to add a day, or a `reader` (training, scoring) whose model maps values that way."""
    if not (path / "_delta_log").is_dir():
        return
    found = recorded_mapping(path, version)
    if found == mapping:
        return
    built = f"with feature mapping {found}" if found else "before feature mappings were recorded"
    tables = ", ".join(str(path.parents[1] / t) for t in FEATURE_TABLES)
    rebuild = (
        f"rebuild the lake's feature tables with this config: remove {tables} (bronze stays) and materialise "
        "the feature assets again (`make demo`, or `python -m jobs.build_features`)"
    )
    fix = (
        f"Use the config that built it (a model keeps its features), or {rebuild}"
        if reader
        else f"To move the lake to this mapping, {rebuild}"
    )
    raise FeatureMappingError(
        f"{path.parent.name}.{path.name} was built {built}; this config's features map values to embedding rows as "
        f"{mapping} (features.features' buckets or encodings differ), and rows mapped two ways must not meet. {fix}"
    )


def ds_filter(start: date | None, end: date | None) -> pc.Expression | None:
    """Rows with start <= ds < end (either bound optional)."""
    expr = None
    for bound, op in ((start, "ge"), (end, "lt")):
        if bound is not None:
            term = getattr(pc.field("ds"), f"__{op}__")(pa.scalar(bound, pa.date32()))
            expr = term if expr is None else expr & term
    return expr


def _jagged(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(values, lengths) of a list column; null lists are empty."""
    arr = column.combine_chunks()
    arr = pc.fill_null(arr, pa.scalar([], arr.type))
    offsets = arr.offsets.to_numpy()
    values = arr.values.to_numpy()[offsets[0] : offsets[-1]] if len(arr) else np.zeros(0, np.int64)
    return values, np.diff(offsets).astype(np.int64)


def _oldest_first(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The values of each row in reverse order: a table's newest-first sequences as a timeline's oldest-first."""
    ends = np.cumsum(lengths)
    rows = np.repeat(np.arange(lengths.size), lengths)
    place = np.arange(values.size) - (ends - lengths)[rows]
    return values[ends[rows] - 1 - place]


def features_to_kjt(table: pa.Table, spec: FeatureSpec) -> KeyedJaggedTensor:
    """KJT over `spec.kjt_keys` for rows that each carry their own sequence (`gold.training_examples`,
    `gold.user_sequences`, ad rows); features absent from `table` are empty.

    Single-valued features come from `<name>_idx` columns (one id per row); the sequence and its
    per-event side columns from list columns (jagged, aligned, newest first). Each row is a timeline of its own
    (`gem_model.modules.timeline`): its events oldest first, all of them visible, its own age bucket 0 (the
    events' ages count to the row's own instant). Empty features let one model embed users or ads alone.
    """
    n = table.num_rows
    names = set(table.column_names)
    keys, values, lengths = [], [], []
    for feature in (*spec.pooled_features, spec.item_feature):
        keys.append(feature.name)
        if feature.idx_column in names:
            col = table.column(feature.idx_column).combine_chunks()
            if col.null_count:
                raise ValueError(f"column {feature.idx_column} has {col.null_count} nulls; fix the feature table")
            values.append(col.to_numpy())
            lengths.append(np.ones(n, dtype=np.int64))
        else:
            lengths.append(np.zeros(n, dtype=np.int64))
    seq_lengths = np.zeros(n, dtype=np.int64)
    for key, column in (
        (spec.sequence_feature, spec.sequence_idx_column),
        *((c, c) for c in spec.sequence_side_columns),
    ):
        keys.append(key)
        if column in names:
            vals, lens = _jagged(table.column(column))
            if key != spec.sequence_feature and not np.array_equal(lens, seq_lengths):
                raise ValueError(
                    f"column {column} is not aligned with {spec.sequence_idx_column}; rebuild the feature table"
                )
            seq_lengths = lens
            values.append(_oldest_first(vals, lens))
            lengths.append(lens)
        else:
            lengths.append(np.zeros(n, dtype=np.int64))
    keys.append(spec.event_minutes_key)
    lengths.append(seq_lengths)
    if seq_lengths.any():
        if spec.event_ts_column not in names:
            raise ValueError(
                f"the sequence needs its timestamps, column {spec.event_ts_column}; read it with the sequence "
                "(FeatureSpec.sequence_columns)"
            )
        stamps = _micros(pc.list_flatten(table.column(spec.event_ts_column)))
        instant = _micros(table.column("ts")) if "ts" in names else _end_of_day(table.column("ds"))
        values.append(_oldest_first(_minutes_before(instant, stamps, seq_lengths), seq_lengths))
    one, zero = np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for key, per_row in zip(spec.timeline_keys, (one, seq_lengths, zero, zero), strict=True):
        keys.append(key)
        values.append(per_row)
        lengths.append(one)
    flat = np.concatenate(values).astype(np.int64) if values else np.zeros(0, np.int64)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.from_numpy(flat), lengths=torch.from_numpy(np.concatenate(lengths))
    )


# Per-impression list columns of gold.user_timelines beside the ad and context features' `<name>_idx`.
VISIBLE_COLUMN = "visible"
# Timelines read from a file at once by scoring: a bound on memory, each holding up to max_seq_len events.
TIMELINE_READ = 64
TARGET_AGE_COLUMN = "target_age_idx"
_MICROS_A_MINUTE, _MICROS_A_DAY = 60_000_000, 86_400_000_000


def _micros(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Microseconds since the epoch (UTC) of a timestamp column, or of a list column's values."""
    return pc.cast(column, pa.timestamp("us", "UTC")).cast(pa.int64()).to_numpy(zero_copy_only=False)


def _end_of_day(ds: pa.ChunkedArray) -> np.ndarray:
    """Microseconds since the epoch of the midnight (UTC) after each row's day: a day's timeline's instant."""
    return (pc.cast(ds, pa.int32()).to_numpy(zero_copy_only=False).astype(np.int64) + 1) * _MICROS_A_DAY


def _minutes_before(instant: np.ndarray, stamps: np.ndarray, per_row: np.ndarray) -> np.ndarray:
    """Whole minutes from each of `stamps` (microseconds, `per_row` of them to each row) to its row's instant."""
    return (np.repeat(instant, per_row) - stamps) // _MICROS_A_MINUTE


def timelines_to_kjt(table: pa.Table, spec: FeatureSpec) -> KeyedJaggedTensor:
    """KJT over `spec.kjt_keys` for rows of `gold.user_timelines`: one row per impression, in each timeline's order.

    A timeline row holds its user's features once (`<name>_idx`), its events as aligned lists, oldest first, and
    its impressions as aligned lists (the ad and context features' `<name>_idx`, `visible`, `target_age_idx`).
    User features repeat on each of the timeline's impressions; the events ride on its first impression's row
    (`gem_model.modules.timeline.Timelines`), so they are looked up once however many impressions read them.
    """
    visible, counts = _jagged(table.column(VISIBLE_COLUMN))
    if (counts == 0).any():
        raise ValueError(
            f"{int((counts == 0).sum())} rows of gold.user_timelines have no impressions; every timeline row holds "
            "its user's impressions of the day, so rebuild the table"
        )
    n, first = int(counts.sum()), np.cumsum(counts) - counts
    keys, values, lengths = [], [], []
    one = np.ones(n, dtype=np.int64)
    for feature in (*spec.pooled_features, spec.item_feature):
        keys.append(feature.name)
        column = table.column(feature.idx_column)
        if feature.side == "user":
            if column.null_count:
                raise ValueError(f"column {feature.idx_column} has {column.null_count} nulls; fix the feature table")
            values.append(np.repeat(column.to_numpy(), counts))
        else:
            ids, per_row = _jagged(column)
            if not np.array_equal(per_row, counts):
                raise ValueError(f"column {feature.idx_column} is not aligned with {VISIBLE_COLUMN}; rebuild the table")
            values.append(ids)
        lengths.append(one)
    event_lengths = None
    for key, column in (
        (spec.sequence_feature, spec.sequence_idx_column),
        *((c, c) for c in spec.sequence_side_columns),
    ):
        ids, per_row = _jagged(table.column(column))
        if event_lengths is not None and not np.array_equal(per_row, event_lengths):
            raise ValueError(f"column {column} is not aligned with {spec.sequence_idx_column}; rebuild the table")
        event_lengths = per_row
        on_first_rows = np.zeros(n, dtype=np.int64)
        on_first_rows[first] = per_row
        keys.append(key)
        values.append(ids)
        lengths.append(on_first_rows)
    instant = _end_of_day(table.column("ds"))
    stamps = _micros(pc.list_flatten(table.column(spec.event_ts_column)))
    on_first_rows = np.zeros(n, dtype=np.int64)
    on_first_rows[first] = event_lengths
    keys.append(spec.event_minutes_key)
    values.append(_minutes_before(instant, stamps, event_lengths))
    lengths.append(on_first_rows)
    starts = np.zeros(n, dtype=np.int64)
    starts[first] = 1
    target_age, per_row = _jagged(table.column(TARGET_AGE_COLUMN))
    if not np.array_equal(per_row, counts):
        raise ValueError(f"column {TARGET_AGE_COLUMN} is not aligned with {VISIBLE_COLUMN}; rebuild the table")
    impression_ts = _micros(pc.list_flatten(table.column("ts")))
    target_minutes = _minutes_before(instant, impression_ts, counts)
    for key, per_impression in zip(spec.timeline_keys, (starts, visible, target_age, target_minutes), strict=True):
        keys.append(key)
        values.append(per_impression)
        lengths.append(one)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
        lengths=torch.from_numpy(np.concatenate(lengths)),
    )


def _assign(sized: list[tuple[pads.Fragment, int]], world_size: int) -> list[list[tuple[pads.Fragment, int]]]:
    """Whole fragments (each with its size) to ranks, largest first to the rank with the least: deterministic and
    balanced."""
    shards: list[list[tuple[pads.Fragment, int]]] = [[] for _ in range(world_size)]
    totals = [0] * world_size
    for fragment, rows in sorted(sized, key=lambda fr: -fr[1]):  # stable: ties keep path order
        if rows:
            target = totals.index(min(totals))
            shards[target].append((fragment, rows))
            totals[target] += rows
    return shards


def timeline_columns(spec: FeatureSpec, labels: bool) -> tuple[list[str], list[str], list[str]]:
    """The columns of `gold.user_timelines` the model reads (with `labels`, the labels too): (per user, per
    impression, per event)."""
    per_user = ["user_id", "ds", *(f.idx_column for f in spec.side("user"))]
    per_impression = [
        "ts",
        *(c for c in KEY_COLUMNS if c not in ("user_id", "ds")),
        *(LABEL_COLUMNS if labels else ()),
        *(f.idx_column for f in spec.features if f.side != "user"),
        VISIBLE_COLUMN,
        TARGET_AGE_COLUMN,
    ]
    return per_user, per_impression, list(spec.sequence_columns)


def impressions_in(fragment: pads.Fragment, filter: pc.Expression | None) -> int:
    """The impressions of a fragment of `gold.user_timelines` (its rows are timelines)."""
    visible = fragment.to_table(columns=[VISIBLE_COLUMN], filter=filter).column(VISIBLE_COLUMN)
    return int(pc.sum(pc.list_value_length(visible)).as_py() or 0)


# A rank's row groups (each a fragment) with their sizes.
Shard = list[tuple[pads.Fragment, int]]


def rank_fragments(
    dataset: pads.Dataset,
    filter: pc.Expression | None,
    rank: int,
    world_size: int,
    size: Callable[[pads.Fragment, pc.Expression | None], int] | None = None,
) -> Shard:
    """This rank's share of `dataset`'s row groups (each a fragment) with their sizes, balanced by size (rows,
    or `size`: `impressions_in` for timelines), the same on every rank."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    row_groups = [
        rg
        for f in sorted(dataset.get_fragments(filter=filter), key=lambda f: f.path)
        for rg in f.split_by_row_group(filter=filter)
    ]
    sized = [(rg, size(rg, filter) if size else rg.count_rows(filter=filter)) for rg in row_groups]
    return _assign(sized, world_size)[rank]


def scan_rows(
    dataset: pads.Dataset, shard: Shard, filter: pc.Expression | None, columns: list[str], batch_rows: int
) -> Iterator[pa.Table]:
    """The rows of a shard of `dataset` (`rank_fragments`) in tables of at most `batch_rows` rows, read row group
    by row group."""
    for fragment, _ in shard:
        for record_batch in fragment.to_batches(
            schema=dataset.schema, columns=columns, filter=filter, batch_size=batch_rows
        ):
            if record_batch.num_rows:
                yield pa.Table.from_batches([record_batch])


def scan_timelines(
    dataset: pads.Dataset, shard: Shard, filter: pc.Expression | None, columns: list[str], impressions: int
) -> Iterator[pa.Table]:
    """The whole timelines of a shard of `gold.user_timelines` (`rank_fragments` sized by `impressions_in`, so the
    ranks' shares balance by impressions) in tables of at most `impressions` impressions (a timeline holding more
    comes alone). Read `TIMELINE_READ` timelines at a time, so memory is bounded by a chunk however long the
    histories."""
    pending: list[pa.Table] = []
    size = 0
    for fragment, _ in shard:
        for record_batch in fragment.to_batches(
            schema=dataset.schema, columns=columns, filter=filter, batch_size=TIMELINE_READ
        ):
            counts = pc.list_value_length(record_batch.column(VISIBLE_COLUMN)).to_numpy()
            start = 0
            for end, count in enumerate(counts):
                if size and size + count > impressions:
                    head = pa.Table.from_batches([record_batch.slice(start, end - start)])
                    yield pa.concat_tables([*pending, head])
                    pending, size, start = [], 0, end
                size += int(count)
            if start < record_batch.num_rows:
                pending.append(pa.Table.from_batches([record_batch.slice(start)]))
    if size:
        yield pa.concat_tables(pending)


@dataclass
class Batch:
    features: KeyedJaggedTensor
    clicked: torch.Tensor  # [B] float
    converted: torch.Tensor  # [B] float
    valid: torch.Tensor  # [B] bool; False on padding rows
    table: pa.Table  # the rows themselves (keys, truth), padding included


class TimelineStream:
    """Fixed-size batches of impressions for one rank, read as whole user timelines from `gold.user_timelines`.

    Every batch holds exactly `batch_size` impression rows: timelines in order (shuffled within a buffer of
    `shuffle_buffer` impressions, a new order every epoch), the one that crosses a batch's end split there, its
    later impressions starting the next batch with the events they see. A user's events are therefore encoded once
    per batch that holds the user's impressions, not once per impression. Ranks take whole files balanced by
    impressions and yield `len(stream)` batches each, the last padded with `valid = False` rows.
    """

    def __init__(
        self,
        path: Path,
        spec: FeatureSpec,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        version: int | None = None,
        start: date | None = None,
        end: date | None = None,
        shuffle_buffer: int = 0,
        seed: int = 0,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        self.spec, self.batch_size, self.rank, self.world_size = spec, batch_size, rank, world_size
        self.shuffle_buffer, self.seed, self.epoch = shuffle_buffer, seed, 0
        self.dataset = open_delta(path, version, spec)
        self.filter = ds_filter(start, end)
        self.per_user, self.per_impression, self.per_event = timeline_columns(spec, labels=True)
        names = set(self.dataset.schema.names)
        missing = [c for c in (*self.per_user, *self.per_impression, *self.per_event) if c not in names]
        if missing:
            raise ValueError(f"{path} lacks columns {missing}; rebuild it with the current FeatureSpec")
        self.per_impression += [c for c in TRUTH_COLUMNS if c in names]
        self.columns = [*self.per_user, *self.per_impression, *self.per_event]
        fragments = sorted(self.dataset.get_fragments(filter=self.filter), key=lambda f: f.path)
        self.fragments = _assign([(f, impressions_in(f, self.filter)) for f in fragments], world_size)
        self.total_rows = sum(n for shard in self.fragments for _, n in shard)
        if self.total_rows == 0:
            raise ValueError(f"no impressions in {path} for ds in [{start}, {end}); check the partitions exist")

    @property
    def rank_rows(self) -> int:
        """This rank's impressions."""
        return sum(n for _, n in self.fragments[self.rank])

    def __len__(self) -> int:
        largest = max(sum(n for _, n in shard) for shard in self.fragments)
        return math.ceil(largest / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _rank_tables(self) -> Iterator[pa.Table]:
        shard = [fragment for fragment, _ in self.fragments[self.rank]]
        rng = np.random.default_rng([self.seed, self.rank, self.epoch])
        if self.shuffle_buffer > 0:  # a new file order every epoch, then timelines shuffled within the buffer
            shard = [shard[i] for i in rng.permutation(len(shard))]
        buffer: list[pa.Table] = []
        size = 0
        for fragment in shard:
            for record_batch in fragment.to_batches(
                schema=self.dataset.schema, columns=self.columns, filter=self.filter
            ):
                if not record_batch.num_rows:
                    continue
                buffer.append(pa.Table.from_batches([record_batch]))
                size += _impression_count(buffer[-1])
                if size >= max(self.shuffle_buffer, 1):
                    yield self._shuffled(pa.concat_tables(buffer), rng)
                    buffer, size = [], 0
        if buffer:
            yield self._shuffled(pa.concat_tables(buffer), rng)

    def _shuffled(self, table: pa.Table, rng: np.random.Generator) -> pa.Table:
        return table.take(rng.permutation(table.num_rows)) if self.shuffle_buffer > 0 else table

    def __iter__(self) -> Iterator[Batch]:
        pending: list[pa.Table] = []
        size, emitted = 0, 0
        for part in self._rank_tables():
            pending.append(part)
            size += _impression_count(part)
            while size >= self.batch_size:
                full, rest = self._cut(pa.concat_tables(pending), self.batch_size)
                yield self._batch(full, self.batch_size)
                emitted += 1
                pending, size = [rest], size - self.batch_size
        rest = pa.concat_tables(pending) if pending else None
        while emitted < len(self):
            yield self._padded(rest)
            emitted, rest = emitted + 1, None

    def _cut(self, table: pa.Table, n: int) -> tuple[pa.Table, pa.Table]:
        """(the timelines holding the first n impressions, the rest), the timeline across the cut split in two."""
        counts = pc.list_value_length(table.column(VISIBLE_COLUMN)).to_numpy()
        ends = np.cumsum(counts)
        row = int(np.searchsorted(ends, n))  # the row holding impression n - 1
        inside = n - int(ends[row] - counts[row])  # of its impressions, those before the cut
        head, tail = table.slice(0, row), table.slice(row + 1)
        if inside == counts[row]:
            return pa.concat_tables([head, table.slice(row, 1)]), tail
        first, second = self._split(table.slice(row, 1), inside)
        return pa.concat_tables([head, first]), pa.concat_tables([second, tail])

    def _split(self, row: pa.Table, at: int) -> tuple[pa.Table, pa.Table]:
        """A one-timeline table as (its impressions before `at` with the events they see, the rest with all)."""
        seen = int(row.column(VISIBLE_COLUMN)[0].values[at - 1].as_py())
        first, second = row, row
        for column in self.per_impression:
            i = row.schema.get_field_index(column)
            first = first.set_column(i, column, pc.list_slice(row.column(column), 0, at))
            second = second.set_column(i, column, pc.list_slice(row.column(column), at))
        for column in self.per_event:
            i = row.schema.get_field_index(column)
            first = first.set_column(i, column, pc.list_slice(row.column(column), 0, seen))
        return first, second

    def _padded(self, rest: pa.Table | None) -> Batch:
        """The last batch: the rows left, then copies of a timeline's first impression alone, masked out."""
        n_real = 0 if rest is None else _impression_count(rest)
        source = rest if n_real else self.dataset.head(1, columns=self.columns, filter=self.filter)
        template, _ = self._split(source.slice(0, 1), 1)
        for column in self.per_event:
            i = template.schema.get_field_index(column)
            template = template.set_column(i, column, pc.list_slice(template.column(column), 0, 0))
        i = template.schema.get_field_index(VISIBLE_COLUMN)
        template = template.set_column(i, VISIBLE_COLUMN, pa.array([[0]], template.schema.field(i).type))
        padding = template.take(np.zeros(self.batch_size - n_real, dtype=np.int64))
        return self._batch(pa.concat_tables([rest, padding]) if n_real else padding, n_real)

    def _batch(self, timelines: pa.Table, n_valid: int) -> Batch:
        table = impression_rows(timelines, self.per_user, self.per_impression)
        valid = torch.zeros(table.num_rows, dtype=torch.bool)
        valid[:n_valid] = True
        return Batch(
            features=timelines_to_kjt(timelines, self.spec),
            clicked=torch.from_numpy(table.column("clicked").to_numpy(zero_copy_only=False).astype(np.float32)),
            converted=torch.from_numpy(table.column("converted").to_numpy(zero_copy_only=False).astype(np.float32)),
            valid=valid,
            table=table,
        )


def _impression_count(timelines: pa.Table) -> int:
    return int(pc.sum(pc.list_value_length(timelines.column(VISIBLE_COLUMN))).as_py() or 0)


def impression_rows(timelines: pa.Table, per_user: list[str], per_impression: list[str]) -> pa.Table:
    """One row per impression of `timelines`: its per-impression columns flattened, the per-user ones repeated."""
    counts = pc.list_value_length(timelines.column(VISIBLE_COLUMN)).to_numpy()
    owner = pa.array(np.repeat(np.arange(timelines.num_rows), counts))
    columns = {c: timelines.column(c).take(owner) for c in per_user}
    columns |= {c: pc.list_flatten(timelines.column(c)) for c in per_impression}
    return pa.table(columns)
