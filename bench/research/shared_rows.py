"""How many of each feature's values share an embedding row in the lake's training examples.

    GEM_HOME=lakehouse-small python -m bench.research.shared_rows --preset small

A model cannot tell apart two values that the feature tables mapped to one row (`<feature>_idx`,
`SparseFeature.encoding`). This reads each feature's raw column and its row column from
`gold.training_examples` (its latest version; no Spark) and counts the distinct values, the rows
they use, and the values that share a row with another.
"""

from __future__ import annotations

import argparse

import pyarrow as pa

from gem_model.config import GemConfig
from gem_model.data.loader import open_delta, recorded_mapping
from gem_model.paths import GemPaths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    args = parser.parse_args(argv)
    spec = GemConfig.load(args.preset).features
    path = GemPaths.from_env().table("gold.training_examples")
    table = open_delta(path).to_table(columns=[c for f in spec.features for c in (f.name, f.idx_column)])
    print(f"{path}: feature mapping {recorded_mapping(path) or 'not recorded'} (this config's: {spec.mapping})")
    print("| feature | values | rows they use | values sharing a row |\n|---|---|---|---|")
    for f in spec.features:
        pairs = table.group_by([f.name, f.idx_column]).aggregate([])
        pairs = pairs.filter(pa.compute.is_valid(pairs[f.name]))
        per_row = pairs.group_by(f.idx_column).aggregate([(f.name, "count")])[f"{f.name}_count"].to_numpy()
        print(f"| {f.name} | {pairs.num_rows:,} | {len(per_row):,} | {int(per_row[per_row > 1].sum()):,} |")


if __name__ == "__main__":
    main()
