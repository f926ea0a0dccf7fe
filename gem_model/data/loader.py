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
from collections.abc import Iterator
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


def features_to_kjt(table: pa.Table, spec: FeatureSpec) -> KeyedJaggedTensor:
    """KJT over `spec.kjt_keys`; features absent from `table` are empty.

    Single-valued features come from `<name>_idx` columns (one id per row); the sequence and its
    per-event side columns from list columns (jagged, aligned). Empty features let one model
    embed users or ads alone.
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
    seq_lengths = None
    for key, column in (
        (spec.sequence_feature, spec.sequence_idx_column),
        *((c, c) for c in spec.sequence_side_columns),
    ):
        keys.append(key)
        if column in names:
            vals, lens = _jagged(table.column(column))
            if seq_lengths is not None and not np.array_equal(lens, seq_lengths):
                raise ValueError(
                    f"column {column} is not aligned with {spec.sequence_idx_column}; rebuild the feature table"
                )
            seq_lengths = lens
            values.append(vals)
            lengths.append(lens)
        else:
            lengths.append(np.zeros(n, dtype=np.int64))
    flat = np.concatenate(values).astype(np.int64) if values else np.zeros(0, np.int64)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.from_numpy(flat), lengths=torch.from_numpy(np.concatenate(lengths))
    )


def _assign(
    fragments: list[pads.Fragment], world_size: int, filter: pc.Expression | None
) -> list[list[tuple[pads.Fragment, int]]]:
    """Whole files to ranks, largest first to the rank with the fewest rows: deterministic and balanced."""
    sized = [(f, f.count_rows(filter=filter)) for f in fragments]
    shards: list[list[tuple[pads.Fragment, int]]] = [[] for _ in range(world_size)]
    totals = [0] * world_size
    for fragment, rows in sorted(sized, key=lambda fr: -fr[1]):  # stable: ties keep path order
        if rows:
            target = totals.index(min(totals))
            shards[target].append((fragment, rows))
            totals[target] += rows
    return shards


def rank_fragments(
    dataset: pads.Dataset, filter: pc.Expression | None, rank: int, world_size: int
) -> list[pads.Fragment]:
    """This rank's share of `dataset`'s row groups (each a fragment), balanced by rows, same on every rank."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    row_groups = [
        rg
        for f in sorted(dataset.get_fragments(filter=filter), key=lambda f: f.path)
        for rg in f.split_by_row_group(filter=filter)
    ]
    return [fragment for fragment, _ in _assign(row_groups, world_size, filter)[rank]]


def scan_rank(
    dataset: pads.Dataset, filter: pc.Expression | None, rank: int, world_size: int, columns: list[str], batch_rows: int
) -> Iterator[pa.Table]:
    """This rank's rows of `dataset` in tables of at most `batch_rows` rows, read row group by row group."""
    for fragment in rank_fragments(dataset, filter, rank, world_size):
        for record_batch in fragment.to_batches(
            schema=dataset.schema, columns=columns, filter=filter, batch_size=batch_rows
        ):
            if record_batch.num_rows:
                yield pa.Table.from_batches([record_batch])


@dataclass
class Batch:
    features: KeyedJaggedTensor
    clicked: torch.Tensor  # [B] float
    converted: torch.Tensor  # [B] float
    valid: torch.Tensor  # [B] bool; False on padding rows
    table: pa.Table  # the rows themselves (keys, truth), padding included


class ExampleStream:
    """Fixed-size batches of `gold.training_examples` rows for one rank."""

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
        wanted = [f.idx_column for f in spec.features] + [
            spec.sequence_idx_column,
            *spec.sequence_side_columns,
            *LABEL_COLUMNS,
            *KEY_COLUMNS,
        ]
        names = set(self.dataset.schema.names)
        missing = [c for c in wanted if c not in names]
        if missing:
            raise ValueError(f"{path} lacks columns {missing}; rebuild it with the current FeatureSpec")
        self.columns = wanted + [c for c in TRUTH_COLUMNS if c in names]
        self.fragments = _assign(
            sorted(self.dataset.get_fragments(filter=self.filter), key=lambda f: f.path), world_size, self.filter
        )
        self.total_rows = sum(rows for shard in self.fragments for _, rows in shard)
        if self.total_rows == 0:
            raise ValueError(f"no rows in {path} for ds in [{start}, {end}); check the partitions exist")

    @property
    def rank_rows(self) -> int:
        return sum(rows for _, rows in self.fragments[self.rank])

    def __len__(self) -> int:
        largest = max(sum(rows for _, rows in shard) for shard in self.fragments)
        return math.ceil(largest / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _rank_tables(self) -> Iterator[pa.Table]:
        shard = [fragment for fragment, _ in self.fragments[self.rank]]
        if self.shuffle_buffer > 0:  # a new file order every epoch, then rows shuffled within the buffer
            rng = np.random.default_rng([self.seed, self.rank, self.epoch])
            shard = [shard[i] for i in rng.permutation(len(shard))]
        for fragment in shard:
            for record_batch in fragment.to_batches(
                schema=self.dataset.schema, columns=self.columns, filter=self.filter
            ):
                if record_batch.num_rows:
                    yield pa.Table.from_batches([record_batch])

    def _shuffled(self) -> Iterator[pa.Table]:
        if self.shuffle_buffer <= 0:
            yield from self._rank_tables()
            return
        rng = np.random.default_rng([self.seed, self.rank, self.epoch])
        buffer: list[pa.Table] = []
        size = 0
        for part in self._rank_tables():
            buffer.append(part)
            size += part.num_rows
            if size >= self.shuffle_buffer:
                merged = pa.concat_tables(buffer)
                yield merged.take(rng.permutation(merged.num_rows))
                buffer, size = [], 0
        if buffer:
            merged = pa.concat_tables(buffer)
            yield merged.take(rng.permutation(merged.num_rows))

    def __iter__(self) -> Iterator[Batch]:
        pending: list[pa.Table] = []
        size, emitted = 0, 0
        for part in self._shuffled():
            pending.append(part)
            size += part.num_rows
            while size >= self.batch_size:
                merged = pa.concat_tables(pending)
                yield self._batch(merged.slice(0, self.batch_size), self.batch_size)
                emitted += 1
                pending, size = [merged.slice(self.batch_size)], size - self.batch_size
        rest = pa.concat_tables(pending) if pending else None
        while emitted < len(self):
            yield self._padded(rest)
            emitted, rest = emitted + 1, None

    def _padded(self, rest: pa.Table | None) -> Batch:
        if rest is None or rest.num_rows == 0:
            # A rank with no rows left still steps: one copied row, all masked out.
            template = self.dataset.head(1, columns=self.columns, filter=self.filter)
            return self._batch(template.take(np.zeros(self.batch_size, dtype=np.int64)), 0)
        pad = np.concatenate([np.arange(rest.num_rows), np.zeros(self.batch_size - rest.num_rows, np.int64)])
        return self._batch(rest.take(pad), rest.num_rows)

    def _batch(self, table: pa.Table, n_valid: int) -> Batch:
        valid = torch.zeros(table.num_rows, dtype=torch.bool)
        valid[:n_valid] = True
        return Batch(
            features=features_to_kjt(table, self.spec),
            clicked=torch.from_numpy(table.column("clicked").to_numpy(zero_copy_only=False).astype(np.float32)),
            converted=torch.from_numpy(table.column("converted").to_numpy(zero_copy_only=False).astype(np.float32)),
            valid=valid,
            table=table,
        )
