"""The worker side of Dagster Pipes for the entry points a Dagster asset launches (`jobs.train`,
`jobs.score`, `jobs.train_student`): whether Dagster launched this process through Pipes is asked
here alone. Started by hand, a worker has no Pipes context and only prints."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext

from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR, PipesContext, open_dagster_pipes


def open_pipes(reports: bool = True) -> AbstractContextManager[PipesContext | None]:
    """The Pipes context where Dagster launched this process through Pipes and `reports` (under torchrun rank 0
    alone, so that a run logs and materialises once), else None."""
    if reports and DAGSTER_PIPES_CONTEXT_ENV_VAR in os.environ:
        return open_dagster_pipes()
    return nullcontext(None)
