"""The table contract: what it requires, the docs generated from it, the descriptions the Dagster UI shows."""

from pathlib import Path

import dagster as dg
import pytest

from gem_lake.table_contract import CONTRACT, FIX, Column, TableContract, main, render_doc, schema_violations

DOC = Path(__file__).parents[3] / "docs" / "tables.md"
IDX = "(by its `encoding`, hashed or modulo; 0 when it is null)"


def test_docs_tables_md_holds_the_tables_the_contract_generates():
    text = DOC.read_text()
    assert render_doc(text) == text, f"docs/tables.md is stale: run `{FIX}`"


def test_check_fails_on_a_stale_copy_and_write_mends_only_the_generated_blocks(tmp_path, capsys):
    doc = tmp_path / "tables.md"
    fresh = DOC.read_text()
    stale = fresh.replace("the user's age bucket", "the age bucket, edited by hand")
    assert stale != fresh
    doc.write_text(stale + "\nA hand-written closing line.\n")
    assert main(["--check", str(doc)]) == 1
    assert "python -m gem_lake.table_contract --write docs/tables.md" in capsys.readouterr().err
    assert main(["--write", str(doc)]) == 0
    assert doc.read_text() == fresh + "\nA hand-written closing line.\n"
    assert main(["--check", str(doc)]) == 0


def test_a_doc_without_a_layer_block_is_refused(tmp_path):
    doc = tmp_path / "tables.md"
    doc.write_text(DOC.read_text().replace("gem_lake.table_contract: silver;", "gem_lake.table_contract: silverish;"))
    with pytest.raises(ValueError, match="one generated block per layer"):
        main(["--write", str(doc)])


def test_optional_columns_are_described_but_not_required():
    silver = CONTRACT["silver.user_features"]
    assert silver.columns == {"user_id": "bigint", "user_id_idx": "bigint"}
    assert silver.descriptions["age_bucket_idx"] == f"embedding row of `age_bucket` {IDX}"
    assert schema_violations("silver.user_features", {"user_id": "bigint", "user_id_idx": "bigint"}) == []
    assert schema_violations("silver.user_features", {"user_id": "bigint", "age_bucket_idx": "bigint"}) == [
        "missing column user_id_idx (bigint)"
    ]
    assert "seq_category_idx" not in CONTRACT["gold.user_sequences"].columns
    position = CONTRACT["gold.training_examples"].descriptions["position"]
    assert position == "the ad's slot; null where the source logs none"


def test_a_key_must_be_a_required_column():
    with pytest.raises(ValueError, match=r"keys/partitioned_by \['a'\] are not required columns"):
        TableContract("t", (Column("a", "bigint", "an id", optional=True),), ("a",))
    with pytest.raises(ValueError, match=r"columns \['a'\] have no description"):
        TableContract("t", (Column("a", "bigint", " "),), ("a",))


@pytest.mark.spark
def test_materialised_table_metadata_carries_the_contract_descriptions(spark, tmp_path):
    from dagster_project.defs.lake_tables import table_metadata
    from dagster_project.resources.lake import LakeResource

    lake = LakeResource(home=str(tmp_path / "gem"))
    df = spark.createDataFrame(
        [(1, 7, "25-34", 0.5), (2, 9, None, 1.5)],
        "user_id bigint, user_id_idx bigint, age_bucket string, dataset_score double",
    )
    df.write.format("delta").save(str(lake.paths.table("silver.user_features")))

    metadata = table_metadata(lake, "silver.user_features", 2)

    schema = metadata["dagster/column_schema"]
    assert isinstance(schema, dg.TableSchema)
    columns = {c.name: c for c in schema.columns}
    assert [c.name for c in schema.columns] == ["user_id", "user_id_idx", "age_bucket", "dataset_score"]
    assert columns["user_id"].description == "key: the user"
    assert columns["user_id"].constraints.nullable is False
    assert columns["user_id_idx"].description == f"embedding row of `user_id` {IDX}"
    assert columns["age_bucket"].description == "the user's age bucket"  # optional: described, not required
    assert columns["age_bucket"].constraints.nullable is True
    assert columns["dataset_score"].description is None  # a column the contract does not know
    assert columns["dataset_score"].type == "double"
    assert metadata["dagster/row_count"] == 2 and metadata["table_rows"] == 2


@pytest.mark.spark
def test_table_stats_agree_with_spark_where_the_log_has_statistics_and_where_it_has_none(spark, tmp_path):
    from datetime import date

    from pyspark.sql import functions as F

    from gem_lake.delta import table_stats

    # 40 columns: Delta keeps per-file statistics for the first 32, so `late_key`'s nulls are read from the files.
    fillers = ", ".join(f"c{i} int" for i in range(36))
    rows = [
        (k if k % 5 else None, *range(36), None if k % 7 == 0 else f"k{k}", date(2026, 11, 1 + k % 2))
        for k in range(1, 60)
    ]
    df = spark.createDataFrame(rows, f"key bigint, {fillers}, late_key string, ds date")
    path = tmp_path / "t"
    df.write.format("delta").partitionBy("ds").save(str(path))
    keys = ("key", "late_key", "ds")
    read = spark.read.format("delta").load(str(path))

    def spark_counts(where):
        c = (
            read.where(where)
            .agg(F.count(F.lit(1)).alias("rows"), *[F.sum(F.col(k).isNull().cast("long")).alias(k) for k in keys])
            .first()
        )
        return c["rows"], {k: c[k] or 0 for k in keys}

    whole = table_stats(path, None, keys)
    assert whole.schema == {f.name: f.dataType.simpleString() for f in read.schema.fields}
    assert (whole.rows, whole.nulls) == spark_counts(F.lit(True)) and whole.nulls["late_key"] > 0
    for day in ("2026-11-01", date(2026, 11, 2)):  # a Dagster partition key's string, or a date
        stats = table_stats(path, {"ds": day}, keys)
        assert (stats.rows, stats.nulls) == spark_counts(F.col("ds") == F.lit(str(day)).cast("date"))
        assert stats.rows > 0 and stats.version == 0
    assert table_stats(path, {"ds": "2026-11-03"}, keys).rows == 0
    with pytest.raises(ValueError, match=r"has no column \['day'\]"):
        table_stats(path, {"day": "2026-11-01"})


@pytest.mark.slow
@pytest.mark.spark
def test_the_contract_check_names_an_empty_table_null_or_repeated_keys_and_a_missing_column(spark, tmp_path):
    from dagster_project.defs.lake_tables import contract_check
    from dagster_project.resources.lake import LakeResource

    lake = LakeResource(home=str(tmp_path / "gem"))
    path = str(lake.paths.table("silver.user_features"))
    check = contract_check("silver.user_features")

    def run() -> dg.AssetCheckResult:
        return check(dg.build_asset_check_context(), lake=lake)

    good = spark.createDataFrame([(1, 7), (2, 9)], "user_id bigint, user_id_idx bigint")
    good.write.format("delta").save(path)
    result = run()
    assert result.passed and result.metadata["rows"].value == 2 and result.metadata["null_user_id"].value == 0
    spark.createDataFrame([(None, 7), (2, 9)], "user_id bigint, user_id_idx bigint").write.format("delta").mode(
        "overwrite"
    ).save(path)
    assert run().description == "1 null values in key column user_id"
    spark.createDataFrame([(2, 7), (2, 9), (2, 9), (3, 1)], "user_id bigint, user_id_idx bigint").write.format(
        "delta"
    ).mode("overwrite").save(path)
    repeated = run()
    assert repeated.description == "2 rows repeat the key (user_id) of an earlier row"
    assert not repeated.passed and repeated.metadata["repeated_keys"].value == 2
    spark.createDataFrame([], "user_id bigint").write.format("delta").mode("overwrite").option(
        "overwriteSchema", "true"
    ).save(path)
    assert run().description == "missing column user_id_idx (bigint); table is empty"
