"""Train the per-surface student models of one teacher version; one process, CPU.

    python -m jobs.train_student --model-version gem-tiny-<fingerprint>-d<N>
    python -m jobs.train_student --model-version V --config CONFIG.json --out $GEM_HOME/students/S

Reads `gold.training_examples` of the days after the teacher's training window with that
version's `gold.teacher_logits`, `gold.user_embeddings` and `gold.ad_embeddings` (materialise
`export_job` for those days first), fits the Student Adapter on the freshest training day(s),
trains every `student.variants` student per surface and evaluates them on the last
`student.eval_days` day(s) (`gem_model.distill`). Writes `<out>` (default
`$GEM_HOME/students/<student_version>`, named by the teacher version, the student config and
the calendar) atomically: a re-run replaces it. `--config` is a GemConfig JSON (the Dagster
asset passes the resolved one); without it GEM_PRESET / GEM_CONFIG apply. When launched by
Dagster Pipes, the log lines go to the Dagster run; the asset then commits gold.student_metrics.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from gem_model.config import GemConfig
from gem_model.distill.training import train
from gem_model.paths import GemPaths
from gem_model.pipes import open_pipes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-version", required=True, help="the teacher version ($GEM_HOME/models/<version>)")
    parser.add_argument("--config", type=Path, help="GemConfig JSON; default: GEM_PRESET / GEM_CONFIG")
    parser.add_argument("--out", type=Path, help="output directory; default $GEM_HOME/students/<student_version>")
    args = parser.parse_args(argv)
    cfg = GemConfig.from_dict(json.loads(args.config.read_text())) if args.config else GemConfig.from_env()
    # The students' ops are far too small for intra-op threads, which only contend: on a loaded
    # 2-core machine two threads made a training step ~50x slower than one (~300 ms against ~4 ms).
    torch.set_num_threads(1)
    with open_pipes() as pipes:

        def log(message: str) -> None:
            print(message, flush=True)
            if pipes is not None:
                pipes.log.info(message)

        train(GemPaths.from_env(), cfg, args.model_version, args.out, log)


if __name__ == "__main__":
    main()
