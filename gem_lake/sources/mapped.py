"""A `gem_lake.sources.Source` defined by a source mapping (`gem_lake.sources.mapping`), no Python needed.

`data.source = "mapping"` reads the mapping at `data.mapping` (or $GEM_SOURCE_MAPPING), its files found
under the mapping file's folder; a built-in source whose format a mapping can express is a mapping under
`gem_lake/sources/mappings/` (Ali-CCP, AliExpress, Frappe, MovieLens), its files under the datasets folder.
That folder is the mapping's data root: a path leading out of it is refused unless
`data.allow_outside_data_root` (`gem_lake.sources.mapping.data_folder`), and no error quotes a file outside
it. The files are read strictly (`gem_lake.sources.lines`, `gem_lake.sources.columnar`), laid out on the
calendar like every real dataset's (`gem_lake.sources.timeline`); the behaviour events are the clicks,
every row, or the lines of a file of their own laid out with the impressions by time (`events`).
"""

from __future__ import annotations

from datetime import date
from functools import cached_property
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from gem_lake import table_contract as contract
from gem_lake.quarantine import LINE_COLUMN
from gem_lake.sources import data_dir
from gem_lake.sources.files import TextFile
from gem_lake.sources.lines import parsed, read_text_files
from gem_lake.sources.mapping import Dimension, Events, Label, SourceMapping, Surface, data_folder, load_mapping
from gem_lake.sources.timeline import click_events, derived_id, spread_over_days
from gem_model.config import ConfigError, GemConfig

BUILT_IN = Path(__file__).with_name("mappings")
INTEGRAL = ("int", "bigint")


def mapping_of(cfg: GemConfig, datasets: Path | None) -> tuple[SourceMapping, Path, Path]:
    """The source's mapping, its data root (the user's mapping file's folder, else the datasets folder:
    `datasets`, or `gem_lake.sources.data_dir`) and its files' folder, every path the mapping names checked to
    lie in that root."""
    if cfg.data.source != "mapping":
        path, root = BUILT_IN / f"{cfg.data.source}.yaml", datasets or data_dir(cfg)
    elif not cfg.data.mapping:
        raise ConfigError(
            "data.source='mapping' needs the mapping file: set data.mapping or GEM_SOURCE_MAPPING "
            "(docs/datasets.md has a complete example)"
        )
    else:
        path = Path(cfg.data.mapping).expanduser().resolve()
        root = path.parent
    mapping = load_mapping(path)
    return mapping, root.resolve(), data_folder(mapping, path, root, cfg.data.allow_outside_data_root)


class Source:
    def __init__(self, spark: SparkSession, cfg: GemConfig, root: Path | None) -> None:
        self.spark, self.world = spark, cfg.world
        self.mapping, self.root, self.folder = mapping_of(cfg, root)
        surfaces = (
            [self.mapping.surface.constant]
            if self.mapping.surface.constant
            else [s for _, s in self.mapping.surface.values]
        )
        unknown = sorted(set(surfaces) - set(cfg.world.surfaces))
        if unknown:
            raise ConfigError(
                f"source mapping {self.mapping.name!r}: surface {unknown} is not one of world.surfaces "
                f"{list(cfg.world.surfaces)}; map the codes onto those (or add the surface there)"
            )

    @cached_property
    def _rows(self) -> DataFrame:
        return read_text_files(self.spark, self.folder, self.mapping.name, self.mapping.text_files, self.root)

    @cached_property
    def _laid_out(self) -> DataFrame:
        """Impression rows on the calendar: with the events' own file's lines where there is one; else the
        `holdout_files`' rows on exactly the holdout days, the rest before them; else all over all days."""
        m, world = self.mapping, self.world
        if m.events.rows == "file":
            return self._with_events.where(F.col("_imp").isNotNull()).select("_imp.*", "ts", "ds")
        order = [*([F.col(m.order_by)] if m.order_by else []), F.col("_file"), F.col("_row")]
        if not m.holdout_files:
            return spread_over_days(self._rows, order, world)
        held = F.col("_file").isin(*[m.files.index(f) for f in m.holdout_files])
        train_days = world.n_days - world.holdout_days
        return spread_over_days(self._rows.where(~held), order, world, 0, train_days).unionByName(
            spread_over_days(self._rows.where(held), order, world, train_days, world.holdout_days)
        )

    @cached_property
    def _with_events(self) -> DataFrame:
        """Impressions (struct `_imp`) and the events' own file's lines (struct `_evt`) laid out together in
        time order (ties: impressions first, then file order), so both keep their real order on one calendar."""
        m, events = self.mapping, self.mapping.events
        event_rows = read_text_files(self.spark, self.folder, m.name, [events.file], self.root)
        imps = self._rows.select(
            F.struct("*").alias("_imp"), F.col(m.order_by).alias("_t"), F.lit(0).alias("_kind"), "_file", "_row"
        )
        evts = event_rows.select(
            F.struct("*").alias("_evt"), F.col(events.order_by).alias("_t"), F.lit(1).alias("_kind"), "_file", "_row"
        )
        together = imps.unionByName(evts, allowMissingColumns=True)
        return spread_over_days(together, [F.col("_t"), F.col("_kind"), F.col("_file"), F.col("_row")], self.world)

    def _id(self, columns: tuple[str, ...]) -> Column:
        return _id(self.mapping.layout, *columns)

    def impressions(self, ds: date) -> DataFrame:
        """bronze.impressions (raw) of day `ds`, with the mapping's features as the dataset's own columns."""
        m = self.mapping
        surface, source_surface = _surface(m.surface)
        converted = _positive(m.converted) if m.converted else F.lit(False)
        return self._laid_out.where(F.col("ds") == F.lit(ds)).select(
            "impression_id",
            "ts",
            "ds",
            self._id(m.user_id).alias("user_id"),
            self._id(m.ad_id).alias("ad_id"),
            surface.alias("surface"),
            F.lit(None).cast("int").alias("position"),
            _positive(m.clicked).alias("clicked"),
            converted.alias("converted"),
            F.lit(None).cast("double").alias("p_click"),
            F.lit(None).cast("double").alias("p_convert"),
            source_surface.alias("source_surface"),
            *[F.col(c).alias(n) for n, c in m.features],
            LINE_COLUMN,
        )

    def events(self, ds: date) -> DataFrame:
        """The day's clicks, every impression of the day whose line parsed, or the lines of the events' own
        file (bad ones for the quarantine), as `events.action`."""
        events = self.mapping.events
        if events.rows == "file":
            return self._file_events(ds)
        if events.rows == "clicks" and events.action == "click":
            return click_events(self.impressions(ds))
        m = self.mapping
        rows = self._laid_out.where((F.col("ds") == F.lit(ds)) & parsed())
        if events.rows == "clicks":
            rows = rows.where(_positive(m.clicked))
        return rows.select(
            self._id(m.user_id).alias("user_id"),
            self._id(m.ad_id).alias("item_id"),
            _action(events).alias("action"),
            _surface(m.surface)[0].alias("surface"),
            "ts",
            "ds",
        )

    def _file_events(self, ds: date) -> DataFrame:
        events = self.mapping.events
        rows = self._with_events.where(F.col("_evt").isNotNull() & (F.col("ds") == F.lit(ds))).select(
            "_evt.*", "ts", "ds"
        )
        surface = _surface(events.surface or self.mapping.surface)[0]
        return rows.select(
            _id(events.file, events.user).alias("user_id"),
            _id(events.file, events.item).alias("item_id"),
            _action(events).alias("action"),
            surface.alias("surface"),
            "ts",
            "ds",
            LINE_COLUMN,
        )

    def users(self) -> DataFrame:
        """bronze.users: from the users' own file, else each user's earliest parsed impression row."""
        return self._dimension(self.mapping.users, self.mapping.user_id, "user_id", contract.USER_ATTRIBUTES)

    def ads(self) -> DataFrame:
        """bronze.ads: from the ads' own file, else each ad's earliest parsed impression row."""
        return self._dimension(self.mapping.ads, self.mapping.ad_id, "ad_id", contract.AD_ATTRIBUTES)

    def _dimension(
        self, dimension: Dimension, id_columns: tuple[str, ...], key: str, contract_columns: tuple[contract.Column, ...]
    ) -> DataFrame:
        attributes, features = dimension.attributes, dimension.features
        types = {c.name: c.type for c in contract_columns}
        if dimension.file is not None:  # one row per line of its own file, bad lines to the quarantine
            rows = read_text_files(self.spark, self.folder, self.mapping.name, [dimension.file], self.root)
            attribute_columns = [(F.col(c) if c else F.lit(None)).cast(types[a]).alias(a) for a, c in attributes]
            return rows.select(_id(dimension.file, dimension.id).alias(key), *attribute_columns, *features, LINE_COLUMN)
        values = [F.col(c).alias(a) for a, c in attributes if c] + [F.col(f) for f in features]
        rows = self._rows.where(parsed()).select(self._id(id_columns).alias(key), "_file", "_row", *values)
        wanted = [F.lit(0).alias("_"), *[a for a, c in attributes if c], *features]  # a struct needs a field
        first = rows.groupBy(key).agg(F.min_by(F.struct(*wanted), F.struct("_file", "_row")).alias("v"))
        return first.select(
            key,
            *[(F.col(f"v.{a}") if c else F.lit(None)).cast(types[a]).alias(a) for a, c in attributes],
            *[F.col(f"v.{f}").alias(f) for f in features],
        )


def _id(layout: TextFile, *columns: str) -> Column:
    """One integral id column as it is; a text id, or several columns together, as a stable derived id."""
    kinds = {f.name: f.type for f in layout.fields}
    if len(columns) == 1 and kinds[columns[0]] in INTEGRAL:
        return F.col(columns[0]).cast("bigint")
    return derived_id(*map(F.col, columns))


def _surface(surface: Surface) -> tuple[Column, Column]:
    """(surface, the source's own code): a constant, or the column's code mapped (null when unmapped)."""
    if surface.constant:
        return F.lit(surface.constant), F.lit(None).cast("string")
    codes = F.create_map(*[F.lit(x) for pair in surface.values for x in pair])
    code = F.col(surface.column).cast("string")
    return F.try_element_at(codes, code), code


def _action(events: Events) -> Column:
    return F.lit(events.action) if events.action is not None else F.col(events.action_column).cast("string")


def _positive(label: Label | None) -> Column:
    """Whether a row's label is positive; None (a click log's `clicked: all`): every row is."""
    return F.lit(True) if label is None else F.col(label.column).cast("string").isin(*label.positive)
