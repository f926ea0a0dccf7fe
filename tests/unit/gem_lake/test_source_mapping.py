"""The declarative source: a mapping file's errors name the key and the fix, and a user's own log lands strictly.

The log is written by the test (text user ids, yes/no labels, surface codes, its own time column), never
a copy of the shared samples; Frappe, a built-in mapping, is checked with the other datasets in
tests/unit/gem_lake/test_sources.py.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from gem_lake.delta import read_table
from gem_lake.features.build import land_bronze
from gem_lake.sources.lines import SourceFormatError, check_header
from gem_lake.sources.mapped import BUILT_IN, Source, mapping_of
from gem_lake.sources.mapping import MappingError, load_mapping
from gem_model.config import ConfigError, GemConfig
from gem_model.documents import MAX_BYTES
from gem_model.paths import GemPaths

MAPPING = {
    "name": "shop_logs",
    "impressions": {
        "folder": "logs",
        "files": ["january.tsv", "february.tsv"],
        "separator": "\t",
        "header": True,
        "columns": {
            "shown_at": "bigint",
            "customer": "string",
            "product": "bigint",
            "placement": "int",
            "clicked": "string",
            "bought": "string",
            "country": "string",
            "hour": "int",
        },
        "order_by": "shown_at",
    },
    "user_id": "customer",
    "ad_id": "product",
    "surface": {"column": "placement", "values": {"1": "feed", "2": "reels"}},
    "clicked": {"column": "clicked", "positive": ["yes"], "negative": ["no"]},
    "converted": {"column": "bought", "positive": ["yes"], "negative": ["no"]},
    "features": {"hour": "hour"},
    "users": {"attributes": {"country": "country"}},
}


def _write(tmp_path: Path, mapping: dict, suffix: str = ".yaml") -> Path:
    path = tmp_path / f"mapping{suffix}"
    path.write_text(json.dumps(mapping) if suffix == ".json" else yaml.safe_dump(mapping, sort_keys=False))
    return path


def _land(
    spark, tmp_path: Path, mapping: dict, n_days: int, daily: tuple[str, ...], whole: tuple[str, ...] = ()
) -> tuple[GemConfig, GemPaths]:
    """Land `mapping`'s source over `n_days` (the last the holdout): `whole` tables, then `daily` ones each day."""
    cfg = GemConfig.load("tiny", mapping=str(_write(tmp_path, mapping)))
    cfg = GemConfig.from_dict({"world": {"n_days": n_days, "holdout_days": 1}}, base=cfg)
    paths = GemPaths(tmp_path / "gem")
    for table in whole:
        land_bronze(spark, cfg, paths, table, None)
    for ds in cfg.world.days:
        for table in daily:
            land_bronze(spark, cfg, paths, table, ds)
    return cfg, paths


def _changed(**changes) -> dict:
    mapping = json.loads(json.dumps(MAPPING))
    for dotted, value in changes.items():
        node, *path, last = [mapping, *dotted.split("__")]
        for key in path:
            node = node[key]
        if value is None:
            node.pop(last)
        else:
            node[last] = value
    return mapping


def test_yaml_and_json_mappings_read_the_same(tmp_path):
    from_yaml = load_mapping(_write(tmp_path, MAPPING))
    from_json = load_mapping(_write(tmp_path, MAPPING, ".json"))
    assert from_yaml == from_json
    assert from_yaml.layout.separator == "\t" and from_yaml.layout.labels == ("clicked", "bought")
    assert from_yaml.layout.label_values == ("yes", "no") and from_yaml.files == ("january.tsv", "february.tsv")
    assert from_yaml.users.attributes == (("age_bucket", None), ("country", "country"), ("device", None))


def test_every_built_in_mapping_reads():
    names = [load_mapping(p).name for p in sorted(BUILT_IN.glob("*.yaml"))]
    assert names == ["ali_ccp", "aliexpress", "frappe", "movielens"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"user_idd": "customer"}, "user_idd: is not a key of a source mapping; use one of"),
        ({"user_id": None}, "user_id: is missing; add `user_id:`"),
        ({"ad_id": "item"}, "ad_id: names column 'item', which `impressions.columns` does not have; use one of"),
        ({"clicked__positive": ["yes", "no"]}, "clicked: positive ['yes', 'no'] and negative ['no'] must be non-empty"),
        ({"impressions__separator": ";;"}, "impressions.separator: ';;' is not one character"),
        ({"impressions__columns__hour": "integer"}, "impressions.columns.hour: type 'integer' is not one of"),
        ({"features": {"country": "country"}}, "features.country: collides with a bronze column"),
        ({"users__attributes__age": "country"}, "users.attributes.age: is not a key of a source mapping"),
        ({"impressions__order_by": "when"}, "impressions.order_by: names column 'when'"),
        ({"name": "Shop Logs"}, "name: 'Shop Logs' is not made of a-z, 0-9 and _"),
        ({"users__id": "customer"}, "users.id: applies only to a file of its own; add `users.file:` or drop it"),
        ({"users__file": "customers.csv"}, "users.columns: is missing"),
        ({"events": {"rows": "views"}}, "events.rows: 'views' is not 'clicks' or 'all'"),
        ({"events": {"rows": "all", "action": {"column": "stars"}}}, "events.action.column: names column 'stars'"),
        ({"impressions__encoding": "latin-9"}, "impressions.encoding: 'latin-9' is not one of"),
        ({"clicked": "all", "converted": None}, "clicked: is `all` (every row a click) but `converted` is not given"),
        ({"clicked": "yes"}, "clicked: 'yes' is not a label; write `all` for a log whose every row is a click"),
        ({"impressions__format": "csv"}, "impressions.format: 'csv' is not one of ['text', 'parquet', 'delta']"),
        ({"impressions__format": "parquet"}, "impressions.separator: applies to text files only, not parquet; drop it"),
        ({"impressions__version": 3}, "impressions.version: 3 pins no Delta table version"),
        (
            {
                "events": {
                    "file": "views.tsv",
                    "columns": {"who": "string", "what": "bigint", "at": "bigint"},
                    "user": "who",
                    "item": "what",
                    "order_by": "when",
                }
            },
            "events.order_by: names column 'when', which `events.columns`",
        ),
        (
            {
                "events": {
                    "file": "views.tsv",
                    "columns": {"who": "string", "what": "bigint", "at": "int"},
                    "user": "who",
                    "item": "what",
                    "order_by": "at",
                }
            },
            "events.order_by: 'at' is int, impressions.order_by 'shown_at'",
        ),
        (
            {
                "events": {
                    "file": "views.tsv",
                    "columns": {"who": "string", "what": "bigint", "at": "bigint"},
                    "user": "who",
                    "item": "what",
                    "order_by": "at",
                }
            },
            "events.surface: is missing, and the impressions' surface",
        ),
        ({"impressions__header": ["shown", "who"]}, "impressions.header: ['shown', 'who'] does not name each of the 8"),
        ({"ad_id": ["product", "hours"]}, "ad_id[1]: names column 'hours', which `impressions.columns` does not have"),
        (
            {"impressions__holdout_files": ["march.tsv"]},
            "impressions.holdout_files: ['march.tsv'] must be some, not all",
        ),
        (
            {"impressions__holdout_files": ["january.tsv", "february.tsv"]},
            "must be some, not all, of impressions.files",
        ),
    ],
)
def test_a_bad_mapping_names_the_key_and_the_fix(tmp_path, changes, message):
    path = _write(tmp_path, _changed(**changes))
    with pytest.raises(MappingError) as error:
        load_mapping(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)


def test_a_dimension_file_and_events_of_every_row_read(tmp_path):
    users = {
        "file": "customers.csv",
        "columns": {"customer": "string", "segment": "string"},
        "key": ["customer"],
        "id": "customer",
        "attributes": {"device": "segment"},
        "encoding": "ISO-8859-1",
    }
    events = {"rows": "all", "action": {"column": "hour"}}
    mapping = load_mapping(_write(tmp_path, _changed(users=users, events=events)))
    assert mapping.users.file.name == "customers.csv" and mapping.users.file.encoding == "iso-8859-1"
    assert mapping.users.file.key == ("customer",) and mapping.users.file.labels == ()
    assert mapping.users.attributes == (("age_bucket", None), ("country", None), ("device", "segment"))
    assert (mapping.events.rows, mapping.events.action, mapping.events.action_column) == ("all", None, "hour")
    default = load_mapping(_write(tmp_path, MAPPING)).events
    assert (default.rows, default.action, default.action_column) == ("clicks", "click", None)


def test_an_unreadable_mapping_says_so(tmp_path):
    with pytest.raises(MappingError, match="cannot be read"):
        load_mapping(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(MappingError, match="is not valid YAML"):
        load_mapping(broken)


def test_gem_source_mapping_selects_the_mapping_source(monkeypatch, tmp_path):
    monkeypatch.setenv("GEM_SOURCE_MAPPING", str(tmp_path / "m.yaml"))
    cfg = GemConfig.from_env()
    assert (cfg.data.source, cfg.data.mapping) == ("mapping", str(tmp_path / "m.yaml"))
    assert cfg.fingerprint != GemConfig.load("tiny", mapping=str(tmp_path / "other.yaml")).fingerprint
    with pytest.raises(ConfigError, match="data.mapping='m.yaml' is set but data.source='synthetic'"):
        GemConfig.from_dict({"data": {"mapping": "m.yaml"}})


# -- Hostile or odd mapping files: refused with the file, the line and the fix, never with their content --


def _refused(path: Path, message: str) -> str:
    """The MappingError of `path`, which must name the file and hold `message`."""
    with pytest.raises(MappingError) as error:
        load_mapping(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)
    return str(error.value)


def _file(tmp_path: Path, content: str | bytes, name: str = "mapping.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def test_an_alias_bomb_is_refused_at_its_first_anchor_without_expanding_it(tmp_path):
    levels = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi")]
    message = _refused(
        _file(tmp_path, "\n".join([*levels, "name: *i"]) + "\n"),
        "uses an anchor or alias (& or *) at line 1; write the value out in full",
    )
    assert "lol" not in message and len(message) < 400  # 9**9 copies of "lol" were never built


@pytest.mark.parametrize(
    "suffix, text",
    [(".yaml", "name: " + "[" * 50_000 + "]" * 50_000), (".json", '{"name": ' + "[" * 50_000 + "]" * 50_000 + "}")],
)
def test_a_deeply_nested_mapping_is_a_mapping_error_not_a_recursion_error(tmp_path, suffix, text):
    _refused(_file(tmp_path, text, f"mapping{suffix}"), "nest")  # libyaml stops flow nesting at 1,000 itself


def test_a_compressed_binary_or_latin_1_mapping_is_refused_naming_the_file(tmp_path):
    text = yaml.safe_dump(MAPPING, sort_keys=False)
    _refused(_file(tmp_path, gzip.compress(text.encode()), "mapping.yaml.gz"), "is gzip-compressed; decompress it")
    _refused(
        _file(tmp_path, text.replace("shop_logs", "boutique_été").encode("latin-1")),
        "is not UTF-8 text (byte 0xe9 at line 1); save it as UTF-8",
    )
    _refused(_file(tmp_path, b"\x7fELF\x02\x01\x01\x00"), "is binary (a NUL byte at line 1)")
    _refused(_file(tmp_path, "# " + "x" * MAX_BYTES), f"is larger than {MAX_BYTES} bytes")


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path, suffix):
    lines = (
        yaml.safe_dump(MAPPING, sort_keys=False).splitlines()
        if suffix == ".yaml"
        else json.dumps(MAPPING, indent=1).splitlines()
    )
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith(("user_id:", '"user_id":')))
    lines.insert(at + 1, lines[at].replace("customer", "product"))  # user_id again, on the next line
    _refused(
        _file(tmp_path, "\n".join(lines), f"mapping{suffix}"),
        f"repeats the key 'user_id' at line {at + 2}, first given at line {at + 1}",
    )


def test_yes_no_on_off_and_leading_zeros_stay_the_text_written(tmp_path):
    """YAML 1.1 reads `yes` as true, which became the code "True"; here labels and codes are the file's text."""
    mapping = load_mapping(
        _file(
            tmp_path,
            """
name: yes_no
impressions: {folder: logs, files: [a.csv], columns: {slot: string, user: bigint, item: bigint, clicked: string},
              header: [slot, 101, D109_14, 1.0]}
user_id: user
ad_id: item
surface: {column: slot, values: {yes: feed, no: reels, 07: stories, 1.0: feed}}
clicked: {column: clicked, positive: [yes, on, Y], negative: [no, off, 0]}
""",
        )
    )
    assert mapping.surface.values == (("yes", "feed"), ("no", "reels"), ("07", "stories"), ("1.0", "feed"))
    assert (mapping.clicked.positive, mapping.clicked.negative) == (("yes", "on", "Y"), ("no", "off", "0"))
    assert mapping.layout.header == ("slot", "101", "D109_14", "1.0")


@pytest.mark.parametrize(
    "suffix, changes, message",
    [
        (
            ".yaml",
            {"clicked__positive": [True]},
            "clicked.positive[0]: True is a boolean, not text as the file writes "
            'it; quote it as the file writes it, e.g. "true"',
        ),
        (".json", {"clicked__negative": [0.0]}, "clicked.negative[0]: 0.0 is a number with a fraction, not text"),
        (".yaml", {"surface__values": {True: "feed"}}, "surface.values: True is a boolean, not text"),
    ],
)
def test_a_boolean_or_fraction_where_the_file_has_text_is_refused_with_quote_it(tmp_path, suffix, changes, message):
    _refused(_write(tmp_path, _changed(**changes), suffix), message)


def test_a_path_that_is_no_mapping_is_not_quoted(tmp_path):
    secret = _file(
        tmp_path, "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n", "passwd"
    )
    message = _refused(secret, "(top level): is a string, not a mapping of keys")
    assert "root:x" not in message and "daemon" not in message


def _located(tmp_path: Path, allow_outside: bool = False, **changes) -> tuple[Path, Path]:
    """(data root, files' folder) of MAPPING with `changes`, written in `tmp_path`/mine."""
    (tmp_path / "mine").mkdir(exist_ok=True)
    cfg = GemConfig.load("tiny", mapping=str(_write(tmp_path / "mine", _changed(**changes))))
    cfg = GemConfig.from_dict({"data": {"allow_outside_data_root": allow_outside}}, base=cfg)
    _, root, folder = mapping_of(cfg, None)
    return root, folder


@pytest.mark.parametrize(
    "changes, key, resolved",
    [
        ({"impressions__files": ["january.tsv", "../../" * 20 + "etc/passwd"]}, "impressions.files[1]", "/etc/passwd"),
        ({"impressions__folder": "/etc"}, "impressions.folder", "/etc"),
        ({"impressions__folder": "/etc", "impressions__files": ["passwd"]}, "impressions.folder", "/etc"),
        (
            {"users": {"file": "../../elsewhere.csv", "columns": {"customer": "string"}, "id": "customer"}},
            "users.file",
            "elsewhere.csv",
        ),
    ],
)
def test_a_mapping_path_outside_its_data_root_is_refused_naming_the_key(tmp_path, changes, key, resolved):
    with pytest.raises(MappingError) as error:
        _located(tmp_path, **changes)
    root = (tmp_path / "mine").resolve()
    assert str(error.value).startswith(f"{root / 'mapping.yaml'}: {key}: ")
    assert f"{resolved}, outside the data root {root}; keep the data" in str(error.value)
    assert "data.allow_outside_data_root: true" in str(error.value)


def test_a_symlink_out_of_the_data_root_is_refused_and_an_explicit_allowance_lifts_the_rule(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "mine" / "logs").mkdir(parents=True)
    (tmp_path / "mine" / "logs" / "january.tsv").symlink_to(tmp_path / "elsewhere" / "january.tsv")
    with pytest.raises(
        MappingError,
        match=r"impressions.files\[0\]: 'logs/january.tsv' is .*/elsewhere/january.tsv, "
        "outside the data root",
    ):
        _located(tmp_path)
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(MappingError, match="impressions.folder: '../linked' is .*/elsewhere, outside the data root"):
        _located(tmp_path, impressions__folder="../linked", impressions__files=["january.tsv"])
    root, folder = _located(tmp_path, allow_outside=True, impressions__folder="../linked")
    assert (root, folder) == ((tmp_path / "mine").resolve(), (tmp_path / "mine").resolve() / "../linked")
    inside = _located(tmp_path, impressions__folder=str(tmp_path / "mine" / "logs"), impressions__files=["x.tsv"])
    assert inside[1] == tmp_path / "mine" / "logs"  # an absolute path inside the root is fine


def test_a_header_line_that_is_no_delimited_line_names_the_file_and_line_1(tmp_path):
    layout = dataclasses.replace(load_mapping(_write(tmp_path, MAPPING)).layout, name="wide.tsv")
    wide = _file(tmp_path, "a" * 200_000 + "\tb\n1\t2\n", "wide.tsv")  # a field beyond the csv module's limit
    with pytest.raises(
        SourceFormatError,
        match=rf"^{re.escape(str(wide))}: line 1, the header, is not a delimited "
        r"line \(field larger than field limit",
    ):
        check_header(wide, layout)


# (shown_at, customer, product, placement, clicked, bought, country, hour); january then february.
JANUARY = [
    "shown_at\tcustomer\tproduct\tplacement\tclicked\tbought\tcountry\thour",
    "1000\talice\t7\t1\tyes\tno\tFR\t9",
    "1010\tbob\t8\t2\tno\tno\tDE\t10",
    "1020\talice\t8\t1\tyes\tyes\tFR\t11",
    "1030\tcarol\t9\t2\tmaybe\tno\tUK\t12",  # not a label value
    "1040\tbob\t7\t3\tno\tno\tDE\t13",  # placement 3 maps to no surface
    "1010\tbob\t8\t2\tno\tno\tDE\t10",  # a repeat of the second line
]
FEBRUARY = [
    "shown_at\tcustomer\tproduct\tplacement\tclicked\tbought\tcountry\thour",
    "2000\tdave\t9\t1\tno\tno\tUS\t8",
    "2010\talice\t7\t2\tyes\tno\tES\t9",  # alice's country stays her first row's
    "2020\tdave\t9\t1\tno",  # truncated
]


@pytest.mark.slow
@pytest.mark.spark
def test_a_users_own_log_lands_through_its_mapping(spark, tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "january.tsv").write_text("\n".join(JANUARY) + "\n")
    (tmp_path / "logs" / "february.tsv").write_text("\n".join(FEBRUARY) + "\n")
    cfg, paths = _land(spark, tmp_path, MAPPING, 2, ("bronze.impressions",), ("bronze.users", "bronze.ads"))
    imps = {r["impression_id"]: r for r in read_table(spark, paths.table("bronze.impressions")).collect()}
    rejected = {
        (r["source_file"], r["source_line"]): r["reason"]
        for r in read_table(spark, paths.table("bronze.rejected_rows")).collect()
        if r["source_table"] == "bronze.impressions"
    }
    assert rejected == {
        ("logs/january.tsv", 5): "invalid_label_clicked",
        ("logs/january.tsv", 6): "null_surface",
        ("logs/january.tsv", 7): "duplicate_line",
        ("logs/february.tsv", 4): "too_few_fields",
    }
    assert sorted(imps) == [
        "shop_logs-february-0",
        "shop_logs-february-1",
        "shop_logs-january-0",
        "shop_logs-january-1",
        "shop_logs-january-2",
    ]
    first = imps["shop_logs-january-2"]
    assert (first["clicked"], first["converted"], first["surface"], first["source_surface"], first["hour"]) == (
        True,
        True,
        "feed",
        "1",
        11,
    )
    assert imps["shop_logs-january-1"]["surface"] == "reels" and not imps["shop_logs-january-1"]["clicked"]
    # Time order: the january file's rows come before february's, on the calendar's days in that order.
    days = [imps[i]["ds"] for i in ("shop_logs-january-0", "shop_logs-february-1")]
    assert days == cfg.world.days
    # Text ids become one stable id per customer; attributes from the customer's first row.
    alice = {imps[i]["user_id"] for i in ("shop_logs-january-0", "shop_logs-january-2", "shop_logs-february-1")}
    users = {r["user_id"]: r for r in read_table(spark, paths.table("bronze.users")).collect()}
    assert len(alice) == 1 and users[alice.pop()]["country"] == "FR"
    assert len(users) == 3  # alice, bob, dave: carol's only line did not parse, so she is no user


@pytest.mark.slow
def test_a_click_log_lands_with_its_test_file_on_exactly_the_holdout_days(spark, tmp_path):
    """`clicked: all` (every row a click, `converted` its label) and `holdout_files` (a test split)."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "train.csv").write_text("user,item,bought\n1,7,0\n1,8,1\n2,7,0\n")
    (tmp_path / "logs" / "test.csv").write_text("user,item,bought\n2,8,1\n1,9,0\n")
    mapping = {
        "name": "click_log",
        "impressions": {
            "folder": "logs",
            "files": ["train.csv", "test.csv"],
            "holdout_files": ["test.csv"],
            "columns": {"user": "bigint", "item": "bigint", "bought": "int"},
        },
        "user_id": "user",
        "ad_id": "item",
        "surface": "feed",
        "clicked": "all",
        "converted": {"column": "bought", "positive": ["1"], "negative": ["0"]},
    }
    cfg, paths = _land(spark, tmp_path, mapping, 3, ("bronze.impressions", "bronze.events"))
    imps = {r["impression_id"]: r for r in read_table(spark, paths.table("bronze.impressions")).collect()}
    assert {i: (r["clicked"], r["converted"]) for i, r in imps.items()} == {
        "click_log-train-0": (True, False),
        "click_log-train-1": (True, True),
        "click_log-train-2": (True, False),
        "click_log-test-0": (True, True),
        "click_log-test-1": (True, False),
    }
    holdout = cfg.world.days[-1]
    assert {i for i, r in imps.items() if r["ds"] == holdout} == {"click_log-test-0", "click_log-test-1"}
    assert read_table(spark, paths.table("bronze.events")).count() == 5  # every row a click event


# (user, item, label): an id that is no bigint, a label outside its values, and a repeat of the second row.
COLUMNAR_ROWS = [("1", 7, 1), ("2", 8, 0), ("x", 9, 0), ("1", 8, 2), ("2", 8, 0)]


@pytest.mark.slow
@pytest.mark.parametrize("file_format", ["parquet", "delta"])
def test_parquet_and_delta_logs_land_strictly(spark, tmp_path, file_format):
    logs = tmp_path / "logs"
    columns = {
        "user": [r[0] for r in COLUMNAR_ROWS],
        "item": [r[1] for r in COLUMNAR_ROWS],
        "label": [r[2] for r in COLUMNAR_ROWS],
        "unused": ["a"] * len(COLUMNAR_ROWS),
    }
    if file_format == "parquet":
        logs.mkdir()
        pq.write_table(pa.table(columns), logs / "day")
    else:  # version 0 is the rows above; version 1 appends one that a pinned version 0 must not read
        spark.createDataFrame(pa.table(columns).to_pandas()).write.format("delta").save(str(logs / "day"))
        spark.createDataFrame([("3", 9, 1, "a")], list(columns)).write.format("delta").mode("append").save(
            str(logs / "day")
        )
    impressions = {
        "folder": "logs",
        "files": ["day"],
        "format": file_format,
        "columns": {"user": "bigint", "item": "bigint", "label": "int"},
    }
    if file_format == "delta":
        impressions["version"] = 0
    mapping = {
        "name": "columnar",
        "impressions": impressions,
        "user_id": "user",
        "ad_id": "item",
        "surface": "feed",
        "clicked": {"column": "label", "positive": ["1"], "negative": ["0"]},
    }
    _, paths = _land(spark, tmp_path, mapping, 2, ("bronze.impressions",))
    accepted = sorted(
        (r["user_id"], r["ad_id"], r["clicked"]) for r in read_table(spark, paths.table("bronze.impressions")).collect()
    )
    assert accepted == [(1, 7, True), (2, 8, False)]
    rejected = sorted(
        (r["reason"], r["raw_line"], r["source_file"])
        for r in read_table(spark, paths.table("bronze.rejected_rows")).collect()
    )
    assert rejected == [
        ("duplicate_line", '{"user":"2","item":8,"label":0}', "logs/day"),
        ("invalid_label_label", '{"user":"1","item":8,"label":2}', "logs/day"),
        ("unparsable_user", '{"user":"x","item":9,"label":0}', "logs/day"),
    ]
    # A declared column the input lacks: its format changed, and nothing lands.
    impressions["columns"]["when"] = "timestamp"
    cfg = GemConfig.load("tiny", mapping=str(_write(tmp_path, mapping)))
    with pytest.raises(SourceFormatError, match=r"logs/day: the .* input lacks column\(s\) \['when'\]"):
        land_bronze(spark, cfg, GemPaths(tmp_path / "other"), "bronze.impressions", cfg.world.days[0])


@pytest.mark.slow
def test_events_from_a_file_of_their_own_share_the_impressions_calendar_by_time(spark, tmp_path):
    """Views logged apart from the impressions: laid out with them in time order, bad lines quarantined."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "shown.csv").write_text("at,user,item,clicked\n100,1,7,1\n300,1,8,0\n500,2,7,1\n700,2,8,0\n")
    (tmp_path / "logs" / "views.csv").write_text(
        "at,user,item,kind\n50,1,9,view\n350,1,9,cart\n650,2,9,view\nx,2,9,view\n"
    )
    mapping = {
        "name": "two_logs",
        "impressions": {
            "folder": "logs",
            "files": ["shown.csv"],
            "order_by": "at",
            "columns": {"at": "bigint", "user": "bigint", "item": "bigint", "clicked": "int"},
        },
        "user_id": "user",
        "ad_id": "item",
        "surface": "feed",
        "clicked": {"column": "clicked", "positive": ["1"], "negative": ["0"]},
        "events": {
            "file": "views.csv",
            "columns": {"at": "bigint", "user": "bigint", "item": "bigint", "kind": "string"},
            "user": "user",
            "item": "item",
            "order_by": "at",
            "action": {"column": "kind"},
        },
    }
    _, paths = _land(spark, tmp_path, mapping, 2, ("bronze.impressions", "bronze.events"))
    shown = {r["impression_id"]: r["ts"] for r in read_table(spark, paths.table("bronze.impressions")).collect()}
    events = sorted(
        (r["ts"], r["user_id"], r["item_id"], r["action"])
        for r in read_table(spark, paths.table("bronze.events")).collect()
    )
    assert [e[1:] for e in events] == [(1, 9, "view"), (1, 9, "cart"), (2, 9, "view")]  # not a click among them
    # One calendar in time order: the view at 50 before the first impression (100), the cart at 350
    # between the impressions at 300 and 500, the view at 650 between 500 and 700.
    ts = [shown[f"two_logs-shown-{i}"] for i in range(4)]
    assert events[0][0] < ts[0] and ts[1] < events[1][0] < ts[2] and ts[2] < events[2][0] < ts[3]
    rejected = [
        (r["source_table"], r["reason"], r["source_file"], r["source_line"])
        for r in read_table(spark, paths.table("bronze.rejected_rows")).collect()
    ]
    assert rejected == [("bronze.events", "unparsable_at", "logs/views.csv", 5)]


@pytest.mark.slow
@pytest.mark.spark
def test_old_mac_line_endings_land_every_line(spark, tmp_path):
    """Bare CR line ends (no LF at all): the header is read as Spark splits lines, and every row lands."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "old_mac.csv").write_bytes(b"user,item,bought\r1,7,0\r1,8,1\r2,7,x\r")
    mapping = {
        "name": "old_mac",
        "impressions": {
            "folder": "logs",
            "files": ["old_mac.csv"],
            "columns": {"user": "bigint", "item": "bigint", "bought": "int"},
        },
        "user_id": "user",
        "ad_id": "item",
        "surface": "feed",
        "clicked": "all",
        "converted": {"column": "bought", "positive": ["1"], "negative": ["0"]},
    }
    _, paths = _land(spark, tmp_path, mapping, 2, ("bronze.impressions",))
    accepted = sorted(
        (r["user_id"], r["ad_id"], r["converted"])
        for r in read_table(spark, paths.table("bronze.impressions")).collect()
    )
    rejected = [
        (r["source_file"], r["source_line"], r["reason"], r["raw_line"])
        for r in read_table(spark, paths.table("bronze.rejected_rows")).collect()
    ]
    assert accepted == [(1, 7, False), (1, 8, True)]
    assert rejected == [("logs/old_mac.csv", 4, "invalid_label_bought", "2,7,x")]


@pytest.mark.spark
def test_a_header_error_never_quotes_a_file_outside_the_data_root(spark, tmp_path):
    """Even where reading outside the root is allowed, the error names the file but does not quote its lines."""
    (tmp_path / "elsewhere").mkdir()
    first_line = "root:x:0:0:root:/root:/bin/bash"
    (tmp_path / "elsewhere" / "passwd").write_text(first_line + "\ndaemon:x:1:1::/:/bin/false\n")
    (tmp_path / "mine").mkdir()
    mapping = _changed(impressions__folder="../elsewhere", impressions__files=["passwd"])
    cfg = GemConfig.load("tiny", mapping=str(_write(tmp_path / "mine", mapping)))
    cfg = GemConfig.from_dict({"data": {"allow_outside_data_root": True}}, base=cfg)
    with pytest.raises(SourceFormatError) as error:
        Source(spark, cfg, None).users()
    assert "passwd: the header is not the one this adapter reads" in str(error.value)
    assert "found 1 (not quoted: the file lies outside the data root" in str(error.value)
    assert "root:x" not in str(error.value) and "daemon" not in str(error.value)
    (tmp_path / "mine" / "passwd").write_text(first_line + "\n")  # inside the root, the line found is quoted
    inside = GemConfig.load(
        "tiny", mapping=str(_write(tmp_path / "mine", _changed(impressions__folder="", impressions__files=["passwd"])))
    )
    with pytest.raises(SourceFormatError, match=re.escape(f"found 1 ['{first_line}']")):
        Source(spark, inside, None).users()
