"""The launcher interface and what its implementations share: the torchrun command's tail, job names,
the Pipes message file and argument checks.

A launcher runs one of the entry points in `jobs/` as a module under torchrun, outside the Dagster
process: `torchrun <options> -m jobs.train <args>`, as `python -m jobs.train <args>` would run it on
one process. The module is imported from the launched interpreter's environment, where the project
is installed, so no launcher needs to know where a checkout lives.
"""

import hashlib
import re
import warnings
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import dagster as dg

# Kubernetes object names are DNS-1123 labels (<= 63). Jobs stay <= 52 so that indexed pods'
# hostnames `<job>-<index>` and the `job-name` label derived from them remain valid too.
MAX_JOB_NAME = 52
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class JobLaunchError(RuntimeError):
    """A cluster job ran and failed (its logs are kept for inspection)."""


class JobLauncher(dg.ConfigurableResource):
    """Runs a job module under torchrun through Dagster Pipes, so that rank 0's log lines and reported
    metrics appear in the Dagster run."""

    @abstractmethod
    def launch(
        self, context: dg.AssetExecutionContext, module: str, args: Sequence[str], nproc: int
    ) -> dg.PipesClientCompletedInvocation:
        """Run `module` (e.g. `jobs.train`) with `args` on `nproc` ranks per node; return when it has exited
        successfully, raise when it failed."""

    def single_process(self) -> "JobLauncher":
        """This launcher for a job that must run exactly once (one node, one process: the students), whatever
        `nnodes` and `nproc_per_node` it is configured with for the distributed jobs."""
        fields = type(self).model_fields
        updates = {k: v for k, v in {"nnodes": 1, "nproc_per_node": None}.items() if k in fields}
        return self.model_copy(update=updates) if updates else self


def module_args(module: str, args: Sequence[str]) -> list[str]:
    """The end of a torchrun command: run `module` as `python -m` would, with `args`."""
    if not MODULE_NAME.fullmatch(module):
        raise ValueError(
            f"module={module!r} is not a Python module name: launchers start modules, "
            "e.g. 'jobs.train' for jobs/train.py"
        )
    return ["-m", module, *args]


def c10d_args(nnodes: int | str, node_rank: str, nproc_per_node: int, endpoint: str, rdzv_id: str) -> list[str]:
    """torchrun's options for one node of a multi-node job: c10d rendezvous at `endpoint`, `rdzv_id` naming
    the job (shell or Kubernetes variables may stand for values only the node knows)."""
    return [
        f"--nnodes={nnodes}",
        f"--node-rank={node_rank}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
    ]


@contextmanager
def pipes_quietly() -> Iterator[None]:
    """Dagster's Pipes session reads a preview attribute of its own message reader, and warns of it at every
    launch; nothing here uses a preview API."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        yield


def dns_label(text: str, max_len: int = 63) -> str:
    """`text` as a DNS-1123 label: lowercase alphanumerics and '-', alphanumeric at both ends."""
    label = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")
    return label[:max_len].rstrip("-") or "gem"


def job_label(module: str) -> str:
    """What a job is called in names and labels: its module's last component (`jobs.train` -> `train`)."""
    return dns_label(module.rpartition(".")[2])


def job_name(module: str, args: Sequence[str], run_id: str) -> str:
    """`gem-<module>-<run id>-<hash of module and args>`: one name per launch within a Dagster run."""
    digest = hashlib.sha1("\0".join([module, *args]).encode()).hexdigest()[:6]
    prefix = dns_label(f"gem-{job_label(module)}-{run_id}", MAX_JOB_NAME - len(digest) - 1)
    return f"{prefix}-{digest}"


def check_positive(owner: str, **values: int | None) -> None:
    for name, value in values.items():
        if value is not None and value < 1:
            raise ValueError(f"{owner}.{name}={value}: must be >= 1 (or unset to use the default)")


def pipes_message_file(gem_home: str, name: str) -> Path:
    """Where a cluster job's rank 0 writes its Pipes messages: on the shared `gem_home`, which the Dagster
    process reads at the same path."""
    path = Path(gem_home) / "staging" / "pipes" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
