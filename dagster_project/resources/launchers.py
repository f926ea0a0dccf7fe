"""Launchers run the distributed jobs (jobs/train.py, jobs/score.py) outside the Dagster process.

`JobLauncher` is the interface the training and export assets use; `LocalTorchrunLauncher`
runs `torchrun --standalone` on this machine through Dagster Pipes, so the workers' log lines
and reported metrics appear in the Dagster run. Cluster launchers (Kubernetes, Slurm) implement
the same `launch` method.
"""

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import dagster as dg

REPO_ROOT = Path(__file__).resolve().parents[2]


class JobLauncher(dg.ConfigurableResource):
    def launch(self, context: dg.AssetExecutionContext, script: str, args: Sequence[str],
               nproc: int) -> dg.PipesClientCompletedInvocation:
        raise NotImplementedError


class LocalTorchrunLauncher(JobLauncher):
    """torchrun with `nproc` worker processes on this host (gloo on CPU, nccl on GPU)."""

    extra_env: dict[str, str] = {}

    def command(self, script: str, args: Sequence[str], nproc: int) -> list[str]:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        return [*torchrun, str(REPO_ROOT / script), *args]

    def launch(self, context: dg.AssetExecutionContext, script: str, args: Sequence[str],
               nproc: int) -> dg.PipesClientCompletedInvocation:
        env = {**os.environ, "PYTHONWARNINGS": "ignore::FutureWarning,ignore::UserWarning", **self.extra_env}
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
        client = dg.PipesSubprocessClient(cwd=str(REPO_ROOT))
        return client.run(context=context, command=self.command(script, args, nproc), env=env)
