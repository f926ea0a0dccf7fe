"""The table contract: every lake table's columns (Spark SQL types, one-line descriptions) and keys.

Asset checks verify each materialised table against this (`schema_violations`), the Dagster UI
shows its descriptions beside each column (`dagster_project.defs.lake_tables.table_metadata`), and
the per-layer tables of docs/tables.md are generated from it: `python -m gem_lake.table_contract`
prints them, `--write docs/tables.md` replaces the generated blocks in place and `--check
docs/tables.md` fails when they are stale (tests/unit/gem_lake/test_table_contract.py runs the check).

A table guarantees its required columns: it never lacks one, key columns are never null and no two
rows of a partition share their values (unless the contract says the keys only group rows). It
may carry more. The extra columns that have a fixed name under the default configuration (the
synthetic world's `signup_date` or `true_*` truth, the default `FeatureSpec`'s `<feature>_idx`
and `seq_category_idx`, the impression columns that the gold tables keep) are listed as
optional `Column`s: described, in the docs and the UI, but not required by `schema_violations`,
because another source or feature set changes them. What varies by source or config with no
fixed name (a dataset's own features, one `<feature>_idx` per configured feature) is a prose
`notes` line per table.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Column:
    """One column: its Spark SQL type and a one-line description. An `optional` column is
    documented but not guaranteed (the contract check does not require it)."""

    name: str
    type: str
    description: str
    optional: bool = False


@dataclass(frozen=True)
class TableContract:
    """One table: what a row is, its columns in write order, keys and partition columns."""

    description: str
    schema: tuple[Column, ...]
    keys: tuple[str, ...]
    partitioned_by: tuple[str, ...] = ()
    notes: str = ""  # extra columns with no fixed name (a dataset's own features, per-config columns)
    unique: bool = True  # the keys identify one row of a partition; False: they only group rows

    def __post_init__(self) -> None:
        names = [c.name for c in self.schema]
        if len(set(names)) != len(names):
            raise ValueError(f"TableContract: duplicate column names in {names}")
        missing = [c for c in (*self.keys, *self.partitioned_by) if c not in self.columns]
        if missing:
            raise ValueError(
                f"TableContract: keys/partitioned_by {missing} are not required columns; "
                f"add them to the schema as required columns ({sorted(self.columns)})"
            )
        undescribed = [c.name for c in self.schema if not c.description.strip()]
        if undescribed:
            raise ValueError(f"TableContract: columns {undescribed} have no description; give each one line")

    @property
    def columns(self) -> dict[str, str]:
        """Required column -> Spark SQL type, in write order: what the contract check requires."""
        return {c.name: c.type for c in self.schema if not c.optional}

    @property
    def descriptions(self) -> dict[str, str]:
        """Every documented column (required and optional) -> its description."""
        return {c.name: c.description for c in self.schema}


def optional(*columns: Column) -> tuple[Column, ...]:
    return tuple(dataclasses.replace(c, optional=True) for c in columns)


def idx(feature: str) -> Column:
    """The `<feature>_idx` column: the feature's embedding row (docs/tables.md, silver)."""
    return Column(
        f"{feature}_idx",
        "bigint",
        f"embedding row of `{feature}` (by its `encoding`, hashed or modulo; 0 when it is null)",
    )


USER_ID = Column("user_id", "bigint", "the user")
AD_ID = Column("ad_id", "bigint", "the ad")
SURFACE = "the surface (`data.surfaces`)"
DS = Column("ds", "date", "the day of `ts`")
MODEL_VERSION = Column("model_version", "string", "the teacher model version that scored it")

# Observable attributes of the default FeatureSpec, and the synthetic world's own columns.
USER_ATTRIBUTES = (
    Column("age_bucket", "string", "the user's age bucket"),
    Column("country", "string", "the user's country"),
    Column("device", "string", "the user's device"),
)
AD_ATTRIBUTES = (
    Column("advertiser_id", "bigint", "the ad's advertiser"),
    Column("category", "bigint", "the ad's category"),
    Column("ad_format", "string", "the ad's format"),
    Column("objective", "string", "the ad's objective"),
)
WORLD_USER = Column("signup_date", "date", "synthetic world: the user's first day (some arrive after the first day)")
WORLD_AD = (
    Column("campaign_id", "bigint", "synthetic world: the ad's campaign"),
    Column("launch_date", "date", "synthetic world: the ad's first day (later launches are cold starts)"),
)
TRUTH = "synthetic world's truth, never a feature"
USER_TRUTH = (
    Column("true_interest", "bigint", f"{TRUTH}: the user's primary interest (a category)"),
    Column("true_interest2", "bigint", f"{TRUTH}: the user's secondary interest"),
    Column("true_activity", "double", f"{TRUTH}: the user's activity (mean events per day)"),
)
AD_TRUTH = (
    Column("true_quality", "double", f"{TRUTH}: the ad's quality"),
    Column("true_trend", "double", f"{TRUTH}: the ad's popularity trend over the days"),
)

IMPRESSION = (
    Column("impression_id", "string", "the impression"),
    Column("ts", "timestamp", "when the ad was shown"),
    DS,
    Column("user_id", "bigint", "the user it was shown to"),
    Column("ad_id", "bigint", "the ad shown"),
    Column("surface", "string", SURFACE),
    Column("clicked", "boolean", "the user clicked"),
    Column("converted", "boolean", "the user converted (implies `clicked`)"),
)
POSITION = Column("position", "int", "the ad's slot; null where the source logs none")
HOUR_OF_DAY = Column("hour_of_day", "int", "the hour of `ts`, 0-23 (UTC), derived for every source")
TRUE_RATES = (
    Column("p_click", "double", "true P(click) of the impression; null for real data"),
    Column("p_convert", "double", "true P(conversion) of the impression; null for real data"),
)


def sequence(before: str) -> tuple[Column, ...]:
    """The behaviour sequence columns: the user's events `before` a time, most recent first."""
    return (
        Column("seq_item_ids", "array<bigint>", f"the items of the user's events {before}, most recent first"),
        Column("seq_ts", "array<timestamp>", "the events' times"),
        Column("seq_actions", "array<string>", "the events' actions"),
        Column("seq_item_idx", "array<bigint>", "the items' embedding rows (mapped like `ad_id_idx`)"),
        Column("seq_action_idx", "array<bigint>", "the hashed actions"),
        Column(
            "seq_age_idx",
            "array<bigint>",
            f"each event's age {before}: floor(log2(1 + minutes)), capped at `age_buckets - 1`",
        ),
    )


SEQ_CATEGORY = Column(
    "seq_category_idx",
    "array<bigint>",
    "each event item's `category` from `silver.ad_features`, "
    "mapped like `category_idx` (0 when the item is no ad there)",
    optional=True,
)


def per_impression(column: Column) -> Column:
    """An impression's `column` as gold.user_timelines holds it: an array aligned with its `impression_id`."""
    return dataclasses.replace(column, type=f"array<{column.type}>")


TIMELINE_IMPRESSIONS = (
    Column(
        "impression_id",
        "array<string>",
        "the user's impressions of `ds` in time order (ties by id); every array but the `seq_*` ones is aligned "
        "with it",
    ),
    *(per_impression(c) for c in (IMPRESSION[1], *IMPRESSION[4:], HOUR_OF_DAY)),
    Column(
        "visible",
        "array<int>",
        "how many of the events each impression sees: positions 0 to `visible - 1` of the `seq_*` arrays, the "
        "events strictly before its `ts`",
    ),
    Column(
        "target_age_idx",
        "array<bigint>",
        "each impression's age before the end of `ds`, bucketed like `seq_age_idx`: the instant the events' ages "
        "count to",
    ),
)
TIMELINE_EVENTS = (
    Column(
        "seq_item_ids",
        "array<bigint>",
        "the items of the user's events that an impression of `ds` sees (`visible`), oldest first",
    ),
    *sequence("before the end of `ds`")[1:],
)

SEQUENCE_NOTES = "one `seq_<attribute>_idx` per `FeatureSpec.sequence_item_attributes` (default `category`)"
EMBEDDING = (MODEL_VERSION, Column("ds", "date", "the day scored"))

CONTRACT: dict[str, TableContract] = {
    "bronze.users": TableContract(
        "the source's users, one row each",
        (USER_ID, *USER_ATTRIBUTES, *optional(WORLD_USER, *USER_TRUTH)),
        ("user_id",),
        notes="a real dataset's own user features",
    ),
    "bronze.ads": TableContract(
        "the source's ads, one row each",
        (AD_ID, *AD_ATTRIBUTES, *optional(*WORLD_AD, *AD_TRUTH)),
        ("ad_id",),
        notes="a real dataset's own ad features",
    ),
    "bronze.events": TableContract(
        "behaviour events, one row each: a user acting on an item",
        (
            Column("user_id", "bigint", "the acting user"),
            Column("item_id", "bigint", "the item acted on (an id in the ad id space)"),
            Column("action", "string", "what the user did"),
            Column("surface", "string", SURFACE),
            Column("ts", "timestamp", "when it happened"),
            DS,
        ),
        ("user_id", "item_id", "action", "ts"),
        ("ds",),
        notes="a real dataset's own event features",
    ),
    "bronze.impressions": TableContract(
        "ad impressions with their labels, one row each",
        (*IMPRESSION, POSITION, *TRUE_RATES),
        ("impression_id", "user_id", "ad_id", "ts"),
        ("ds",),
        notes="a real dataset's own impression features",
    ),
    "bronze.rejected_rows": TableContract(
        "raw rows the quarantine rejected, one each, with the first rule it broke",
        (
            Column("source_table", "string", "the bronze table the row was meant for"),
            Column("source_partition", "string", "its `ds`, or `all` for a dimension"),
            Column("reason", "string", "the first rule the row broke (Quarantine below)"),
            Column("record", "string", "the whole raw row as JSON, as the source read it"),
            Column(
                "raw_line",
                "string",
                "the source file's line itself, byte for byte (bytes that are not UTF-8 "
                "become U+FFFD); null for rows not read from a text file (the synthetic world, dimension rows "
                "aggregated from many lines)",
            ),
            Column("source_file", "string", "that file, under the datasets folder; null when `raw_line` is"),
            Column("source_line", "bigint", "its 1-based line number (the header is line 1); null when `raw_line` is"),
        ),
        ("source_table", "source_partition", "reason"),
        ("source_table", "source_partition"),
        unique=False,
    ),
    "silver.user_features": TableContract(
        "the observable `bronze.users` columns (no `true_*`) and their embedding rows, one row per user",
        (USER_ID, idx("user_id"), *optional(*USER_ATTRIBUTES, WORLD_USER, *(idx(c.name) for c in USER_ATTRIBUTES))),
        ("user_id",),
        notes="a real dataset's own user features, from `bronze.users`; one `<feature>_idx` per user-side "
        "feature of `FeatureSpec.features`",
    ),
    "silver.ad_features": TableContract(
        "the observable `bronze.ads` columns (no `true_*`) and their embedding rows, one row per ad",
        (AD_ID, idx("ad_id"), *optional(*AD_ATTRIBUTES, *WORLD_AD, *(idx(c.name) for c in AD_ATTRIBUTES))),
        ("ad_id",),
        notes="a real dataset's own ad features, from `bronze.ads`; one `<feature>_idx` per ad-side "
        "feature of `FeatureSpec.features`",
    ),
    "gold.user_sequences": TableContract(
        "each active user's events up to the end of `ds` (lookback `FeatureSpec.lookback_days`), "
        "at most `max_seq_len`, one row per user",
        (
            USER_ID,
            Column("ds", "date", "the day the sequence ends with"),
            *sequence("before the end of `ds`"),
            SEQ_CATEGORY,
        ),
        ("user_id",),
        ("ds",),
        notes=SEQUENCE_NOTES,
    ),
    "gold.training_examples": TableContract(
        "one row per impression of `ds`: the impression and the user's and the ad's features (the user's events "
        "are in `gold.user_timelines`, once per user and day)",
        (
            *IMPRESSION,
            HOUR_OF_DAY,
            idx("user_id"),
            idx("ad_id"),
            idx("surface"),
            *optional(
                POSITION,
                *TRUE_RATES,
                *USER_ATTRIBUTES,
                *AD_ATTRIBUTES,
                *(idx(c.name) for c in (*USER_ATTRIBUTES, *AD_ATTRIBUTES, POSITION, HOUR_OF_DAY)),
            ),
        ),
        ("impression_id", "user_id", "ad_id", "ts"),
        ("ds",),
        notes="every `bronze.impressions` column (a dataset's extras included); the user and ad attributes of "
        "`FeatureSpec.features` (null when the dimension row is missing) and one `<feature>_idx` per feature",
    ),
    "gold.user_timelines": TableContract(
        "one row per user with impressions on `ds`: the user's features, the day's impressions with their ad and "
        "context features, and the user's events once, oldest first: those before the last impression (of those "
        "before the first, the newest `max_seq_len`), each impression seeing the ones before its `ts`",
        (
            USER_ID,
            Column("ds", "date", "the day of the impressions"),
            Column("impression_count", "int", "the user's impressions that day: the length of `impression_id`"),
            *TIMELINE_IMPRESSIONS,
            *TIMELINE_EVENTS,
            idx("user_id"),
            per_impression(idx("ad_id")),
            per_impression(idx("surface")),
            *optional(
                *USER_ATTRIBUTES,
                *(per_impression(c) for c in TRUE_RATES),
                *(idx(c.name) for c in USER_ATTRIBUTES),
                *(per_impression(idx(c.name)) for c in (*AD_ATTRIBUTES, POSITION, HOUR_OF_DAY)),
            ),
            SEQ_CATEGORY,
        ),
        ("user_id",),
        ("ds",),
        notes="the user attributes of `FeatureSpec.features` (null when the user has no `silver.user_features` "
        "row) and one `<feature>_idx` per feature (a value for a user feature; for an ad or context feature, an "
        f"array aligned with `impression_id`); {SEQUENCE_NOTES}",
    ),
    "gold.user_embeddings": TableContract(
        "each user's embedding from one model version on one day",
        (
            USER_ID,
            *EMBEDDING,
            Column("embedding", "array<float>", "the user's embedding: unit norm, length `model.repr_dim`"),
        ),
        ("user_id", "model_version"),
        ("model_version", "ds"),
    ),
    "gold.ad_embeddings": TableContract(
        "each ad's embedding from one model version on one day",
        (
            AD_ID,
            *EMBEDDING,
            Column("embedding", "array<float>", "the ad's embedding: unit norm, length `model.repr_dim`"),
        ),
        ("ad_id", "model_version"),
        ("model_version", "ds"),
    ),
    "gold.teacher_logits": TableContract(
        "a model version's logits for each impression of `ds`",
        (
            IMPRESSION[0],
            IMPRESSION[3],
            IMPRESSION[4],
            IMPRESSION[5],
            Column("ds", "date", "the impression's day"),
            MODEL_VERSION,
            Column("ctr_logit", "float", "logit P(click | impression)"),
            Column("cvr_logit", "float", "logit P(conversion | click)"),
        ),
        ("impression_id", "model_version"),
        ("model_version", "ds"),
    ),
    "gold.user_ad_candidates": TableContract(
        "each user's top `export.candidates_k` ads from the ads index of that version and day",
        (
            USER_ID,
            Column("ad_id", "bigint", "a candidate ad"),
            Column("rank", "int", "1 = best"),
            Column("score", "float", "the inner product of the user's and the ad's `embedding`"),
            MODEL_VERSION,
            Column("ds", "date", "the day scored"),
        ),
        ("user_id", "ad_id", "model_version"),
        ("model_version", "ds"),
    ),
    "gold.index_builds": TableContract(
        "one row per index build, the published manifest's numbers; a re-build of the same "
        "(index, version, day) replaces its row",
        (
            Column("index_name", "string", "`ads` or `users`"),
            Column("model_version", "string", "the model version whose embeddings it holds"),
            Column("ds", "date", "the day of those embeddings"),
            Column("factory", "string", "the FAISS index factory built"),
            Column(
                "configured_factory", "string", "the factory configured (`Flat` is built below `index.exact_below`)"
            ),
            Column("dimension", "int", "the embeddings' length"),
            Column("row_count", "bigint", "the vectors indexed"),
            Column("recall_at_k", "double", "recall@k against exact search"),
            Column("k", "int", "the k of `recall_at_k`"),
            Column("queries_per_second", "double", "the measured search throughput"),
            Column("build_seconds", "double", "the build's duration"),
            Column("sha256", "string", "the index file's checksum"),
            Column("created_at", "timestamp", "when the build was made"),
        ),
        ("index_name", "model_version", "ds"),
        ("index_name", "model_version", "ds"),
    ),
    "gold.student_metrics": TableContract(
        "a student version's manifest metrics, one row per (variant, surface or `all`, task), replaced whole "
        "when it is re-trained; a metric is null where undefined (the oracle has only `auc` and `ne`)",
        (
            Column("student_version", "string", "the student version"),
            Column("model_version", "string", "its teacher"),
            Column("eval_start", "date", "the first of the students' evaluation days"),
            Column("eval_end", "date", "the last of the evaluation days"),
            Column("created_at", "timestamp", "when the student version was trained"),
            Column(
                "variant",
                "string",
                "a student as trained (`labels`, `kd`, `adapter`, `kd_embeddings`, "
                "`adapter_no_embeddings`) or a reference scored on the same rows (`teacher`, `teacher_adapted`, "
                "`oracle`)",
            ),
            Column("surface", "string", "the surface, or `all` for every surface together"),
            Column("task", "string", "`ctr` on impressions, or `cvr` = P(conversion | click) on clicks"),
            Column("auc", "double", "AUC"),
            Column("ne", "double", "normalised entropy (log loss over the label rate's entropy)"),
            Column("calibration", "double", "mean prediction over the label rate"),
            Column("log_loss", "double", "log loss"),
            Column("rows", "bigint", "the rows evaluated"),
            Column("positives", "bigint", "the positive labels among them"),
        ),
        ("student_version", "variant", "surface", "task"),
        ("model_version", "student_version"),
    ),
}

LAYERS = ("bronze", "silver", "gold")
FIX = "python -m gem_lake.table_contract --write docs/tables.md"
_BLOCK = re.compile(
    r"<!-- generated by python -m gem_lake\.table_contract: (\w+); "
    r"edit gem_lake/table_contract\.py -->\n.*?<!-- end generated -->",
    re.DOTALL,
)


def schema_violations(table: str, actual: dict[str, str]) -> list[str]:
    """Human-readable differences between a table's schema (column -> type) and its contract."""
    problems = []
    for column, expected in CONTRACT[table].columns.items():
        if column not in actual:
            problems.append(f"missing column {column} ({expected})")
        elif actual[column] != expected:
            problems.append(f"column {column} is {actual[column]}, contract says {expected}")
    return problems


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _type(spark_type: str) -> str:
    # A bare `array<bigint>` would be read as an HTML tag and vanish from the rendered page.
    return spark_type.replace("<", "\\<")


def _columns_cell(columns: list[Column], notes: str = "") -> str:
    lines = [f"`{c.name}` {_type(c.type)}: {c.description}" for c in columns]
    if notes:
        lines.append(f"also: {notes}")
    return _cell("<br>".join(lines)) or "–"


def layer_markdown(layer: str) -> str:
    """The Markdown table of one layer's tables, as docs/tables.md holds it."""
    if layer not in LAYERS:
        raise ValueError(f"layer={layer!r} is not one of {LAYERS}")
    rows = [
        "| table | holds | partitioned by | keys | columns | other columns (not guaranteed) |",
        "|---|---|---|---|---|---|",
    ]
    for table, contract in CONTRACT.items():
        if table.split(".")[0] != layer:
            continue
        partitions = ", ".join(f"`{c}`" for c in contract.partitioned_by) or "–"
        keys = ", ".join(f"`{c}`" for c in contract.keys) + ("" if contract.unique else " (not unique)")
        guaranteed = _columns_cell([c for c in contract.schema if not c.optional])
        others = _columns_cell([c for c in contract.schema if c.optional], contract.notes)
        rows.append(f"| `{table}` | {_cell(contract.description)} | {partitions} | {keys} | {guaranteed} | {others} |")
    return "\n".join(rows) + "\n"


def _start(layer: str) -> str:
    return f"<!-- generated by python -m gem_lake.table_contract: {layer}; edit gem_lake/table_contract.py -->"


def generated_block(layer: str) -> str:
    return f"{_start(layer)}\n{layer_markdown(layer)}<!-- end generated -->"


def render_doc(text: str) -> str:
    """`text` (docs/tables.md) with each layer's generated block replaced by the contract's tables."""
    found = [m.group(1) for m in _BLOCK.finditer(text)]
    if sorted(found) != sorted(LAYERS):
        raise ValueError(
            f"expected one generated block per layer {LAYERS}, found {found}; each starts with "
            f"{_start('<layer>')!r} and ends with '<!-- end generated -->'"
        )
    return _BLOCK.sub(lambda m: generated_block(m.group(1)), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gem_lake.table_contract",
        description="Print docs/tables.md's per-layer tables from the contract.",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", metavar="DOC", type=Path, help="replace the generated blocks of DOC in place")
    action.add_argument("--check", metavar="DOC", type=Path, help="exit 1 when DOC's generated blocks are stale")
    args = parser.parse_args(argv)
    if args.write is None and args.check is None:
        print("\n\n".join(generated_block(layer) for layer in LAYERS))
        return 0
    doc: Path = args.write or args.check
    text = doc.read_text()
    rendered = render_doc(text)
    if args.write is not None:
        if rendered != text:
            doc.write_text(rendered)
        return 0
    if rendered != text:
        print(f"{doc}: the generated tables differ from gem_lake/table_contract.py; run `{FIX}`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
