"""`torchrun --standalone` on this machine: the default launcher, and the one the tests and benches run."""

import os
import sys
from collections.abc import Sequence

import dagster as dg

from dagster_project.resources.launchers.base import JobLauncher, module_args, pipes_quietly


class LocalTorchrunLauncher(JobLauncher):
    """torchrun with `nproc` worker processes on this host (gloo on CPU, nccl on GPU).

    The workers run this interpreter in this process's working directory, so `-m` finds the job
    module where Dagster found the project's packages.
    """

    extra_env: dict[str, str] = {}

    def command(self, module: str, args: Sequence[str], nproc: int) -> list[str]:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        return [*torchrun, *module_args(module, args)]

    def environment(self, nproc: int) -> dict[str, str]:
        """The workers' environment: this process's, quiet warnings, the cores split between the ranks."""
        env = {**os.environ, "PYTHONWARNINGS": "ignore::FutureWarning,ignore::UserWarning", **self.extra_env}
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
        return env

    def launch(
        self, context: dg.AssetExecutionContext, module: str, args: Sequence[str], nproc: int
    ) -> dg.PipesClientCompletedInvocation:
        client = dg.PipesSubprocessClient()
        with pipes_quietly():
            return client.run(context=context, command=self.command(module, args, nproc), env=self.environment(nproc))
