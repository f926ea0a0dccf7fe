"""Land one raw batch (a dimension table, or a day of events/impressions) in bronze.

The batch is split by `jobs.features.quarantine`; the accepted rows replace the bronze table
(or its day) and the rejected rows replace that batch's slice of `bronze.rejected_rows`, so a
re-run never duplicates either. The landing then reads both back from Delta and reports row
conservation (rows in = accepted + rejected) and the rejection reasons.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gem_model.paths import GemPaths
from jobs.features.quarantine import REJECTED_TABLE, WHOLE_TABLE, split
from jobs.lake import overwrite_table, read_table, replace_partition


@dataclass(frozen=True)
class Landing:
    table: str
    rows_in: int
    accepted: int  # rows of the batch now in the bronze table (read back)
    rejected: int  # rows of the batch now in bronze.rejected_rows (read back)
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def conserved(self) -> bool:
        return self.rows_in == self.accepted + self.rejected


def land(spark: SparkSession, raw: DataFrame, table: str, paths: GemPaths, surfaces: tuple[str, ...],
         ds: date | None = None) -> Landing:
    raw = raw.cache()
    rows_in = raw.count()
    accepted, rejected = split(raw, table, surfaces, ds)
    slice_ = {"source_table": table, "source_partition": ds.isoformat() if ds else WHOLE_TABLE}
    if ds is None:
        overwrite_table(accepted, paths.table(table))
    else:
        replace_partition(accepted, paths.table(table), {"ds": ds})
    replace_partition(rejected, paths.table(REJECTED_TABLE), slice_)
    raw.unpersist()

    landed = read_table(spark, paths.table(table))
    if ds is not None:
        landed = landed.where(F.col("ds") == F.lit(ds))
    quarantined = read_table(spark, paths.table(REJECTED_TABLE)).where(
        (F.col("source_table") == table) & (F.col("source_partition") == slice_["source_partition"]))
    reasons = {r["reason"]: int(r["count"]) for r in quarantined.groupBy("reason").count().collect()}
    return Landing(table, rows_in, landed.count(), sum(reasons.values()), dict(sorted(reasons.items())))
