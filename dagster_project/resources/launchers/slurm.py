"""torchrun on Slurm: an sbatch script that `srun`s torchrun once per node with c10d rendezvous on the
allocation's first node, submitted with `sbatch --wait` from a host that can reach the scheduler. The
Pipes context is exported in the script and rank 0 writes its messages to a file under
`$GEM_HOME/staging/pipes`, which the Dagster process reads.
"""

import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import dagster as dg

from dagster_project.resources.launchers.base import (
    JobLauncher,
    JobLaunchError,
    c10d_args,
    check_positive,
    job_name,
    module_args,
    pipes_message_file,
    pipes_quietly,
)

RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s?")


class SlurmTorchrunLauncher(JobLauncher):
    """torchrun on `nnodes` Slurm nodes (one task per node, `nproc_per_node` ranks each; default:
    the asset's `nproc`), submitted with `sbatch --wait` from a host that can reach the scheduler.

    `python` (default: this interpreter), with the project installed in its environment, and
    `gem_home` must exist at the same paths on the compute nodes, i.e. on the shared file system.
    The job module runs in `workdir` (default: sbatch's, this process's working directory), which
    `-m` searches first. The batch script and its log (`--output`) are written under
    `$GEM_HOME/staging/slurm/`. Each rank gets `OMP_NUM_THREADS` = the node's allocated CPUs /
    ranks per node (torchrun would set 1), unless `env` sets it. A job pending for a reason that
    needs an administrator (`NEVER_STARTS`) is cancelled at once, any other after
    `queue_timeout_s`; a failed job's error names its id, state, exit code, sbatch's stderr and the
    traceback of the exception it died of (`root_cause`).
    """

    gem_home: str
    nnodes: int = 1
    nproc_per_node: int | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    time_limit: str | None = None
    partition: str | None = None
    account: str | None = None
    extra_directives: list[str] = []
    python: str | None = None
    workdir: str | None = None
    env: dict[str, str] = {}
    rdzv_port: int = 29400
    sbatch: str = "sbatch"
    queue_timeout_s: float | None = 3600.0  # cancel a job still pending after this long (None: wait forever)
    poll_interval_s: float = 10.0

    def render(
        self, module: str, args: Sequence[str], nproc: int, run_id: str, env: Mapping[str, str] | None = None
    ) -> str:
        """The sbatch script; `env` (e.g. a Pipes session's bootstrap variables) is exported in it."""
        check_positive(
            "SlurmTorchrunLauncher",
            nnodes=self.nnodes,
            nproc_per_node=self.nproc_per_node,
            gpus_per_node=self.gpus_per_node,
            cpus_per_task=self.cpus_per_task,
            nproc=nproc,
        )
        name = job_name(module, args, run_id)
        directives = [
            f"--job-name={name}",
            f"--nodes={self.nnodes}",
            "--ntasks-per-node=1",
            f"--output={self.log_file(name)}",
            "--export=ALL",
        ]
        optional = {
            "gpus-per-node": self.gpus_per_node,
            "cpus-per-task": self.cpus_per_task,
            "mem": self.mem,
            "time": self.time_limit,
            "partition": self.partition,
            "account": self.account,
        }
        directives += [f"--{k}={v}" for k, v in optional.items() if v is not None]
        directives += [d if d.startswith("-") else f"--{d}" for d in self.extra_directives]
        exports = {"GEM_HOME": self.gem_home, **self.env, **(env or {})}
        ranks = self.nproc_per_node or nproc
        threads = (
            []
            if "OMP_NUM_THREADS" in exports
            else [
                "# Every rank gets its share of the node's CPUs (torchrun alone would give it 1 thread).",
                f"export OMP_NUM_THREADS=$(( ${{SLURM_CPUS_ON_NODE:-{ranks}}} / {ranks} > 0 ? "
                f"${{SLURM_CPUS_ON_NODE:-{ranks}}} / {ranks} : 1 ))",
            ]
        )
        torchrun = [
            shlex.quote(self.python or sys.executable),
            "-m",
            "torch.distributed.run",
            *c10d_args(
                '"$SLURM_NNODES"', '"$SLURM_NODEID"', ranks, f'"$GEM_RDZV_HOST":{self.rdzv_port}', '"$SLURM_JOB_ID"'
            ),
            *(shlex.quote(a) for a in module_args(module, args)),
        ]
        lines = [
            "#!/bin/bash",
            *(f"#SBATCH {d}" for d in directives),
            "set -euo pipefail",
            *([f"cd {shlex.quote(self.workdir)}"] if self.workdir else []),
            *(f"export {k}={shlex.quote(v)}" for k, v in exports.items()),
            *threads,
            "# The first node of the allocation hosts the c10d rendezvous.",
            'export GEM_RDZV_HOST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"',
            # Single quotes: SLURM_NODEID is expanded by each srun task, on its own node.
            # Since Slurm 22.05 a step does not inherit the job's CPUs per task: give torchrun the node's.
            'srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" --kill-on-bad-exit=1 bash -c '
            + shlex.quote("exec " + " ".join(torchrun)),
        ]
        return "\n".join(lines) + "\n"

    def log_file(self, name: str) -> Path:
        return Path(self.gem_home) / "staging" / "slurm" / f"{name}.out"

    def launch(
        self, context: dg.AssetExecutionContext, module: str, args: Sequence[str], nproc: int
    ) -> dg.PipesClientCompletedInvocation:
        sbatch = shutil.which(self.sbatch)
        if sbatch is None:
            raise FileNotFoundError(
                f"SlurmTorchrunLauncher: {self.sbatch!r} is not on PATH; run Dagster on a "
                "host with the Slurm client tools (a login node), set `sbatch` to its path, "
                "or set GEM_LAUNCHER=local"
            )
        name = job_name(module, args, context.run_id)
        batch_file = self.log_file(name).with_suffix(".sbatch")
        batch_file.parent.mkdir(parents=True, exist_ok=True)
        reader = dg.PipesFileMessageReader(str(pipes_message_file(self.gem_home, name)))
        with (
            pipes_quietly(),
            dg.open_pipes_session(
                context=context, context_injector=dg.PipesEnvContextInjector(), message_reader=reader
            ) as session,
        ):
            batch_file.write_text(
                self.render(module, args, nproc, context.run_id, env=session.get_bootstrap_env_vars())
            )
            # --parsable prints the job id at submission; --wait then blocks and exits with the job's code.
            process = subprocess.Popen(
                [sbatch, "--wait", "--parsable", str(batch_file)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert process.stdout is not None
            job_id = process.stdout.readline().strip().split(";")[0]
            if not job_id:
                _, stderr = process.communicate()
                raise JobLaunchError(
                    f"sbatch refused {batch_file} (exit code {process.returncode}): {stderr.strip() or 'no message'}"
                )
            context.log.info(f"submitted Slurm job {job_id} ({batch_file}); log: {self.log_file(name)}")
            try:
                self._wait(process, job_id)
            except BaseException:
                subprocess.run(["scancel", job_id], check=False)
                process.send_signal(signal.SIGINT)
                process.wait()
                raise
            _, stderr = process.communicate()
            if process.returncode != 0:
                raise JobLaunchError(self._failure(job_id, name, process.returncode, stderr))
        return dg.PipesClientCompletedInvocation(
            session, metadata={"slurm_job_id": job_id, "slurm_log": str(self.log_file(name))}
        )

    def _wait(self, process: subprocess.Popen, job_id: str) -> None:
        """Until sbatch exits; JobLaunchError if the job pends for a reason that needs an administrator
        or for longer than `queue_timeout_s` (the caller cancels it)."""
        submitted = time.monotonic()
        while process.poll() is None:
            state, reason = _squeue(job_id)
            if state == "PENDING":
                waited = time.monotonic() - submitted
                if reason in NEVER_STARTS or (self.queue_timeout_s is not None and waited > self.queue_timeout_s):
                    why = (
                        "it can never start as submitted"
                        if reason in NEVER_STARTS
                        else f"it waited {waited:.0f} s > queue_timeout_s={self.queue_timeout_s}"
                    )
                    raise JobLaunchError(
                        f"Slurm job {job_id} is pending with Reason={reason}: {why}; cancelling it. Check the "
                        f"launcher's partition/nnodes/gpus_per_node/mem/time_limit against `scontrol show partition` "
                        f"(`scontrol show job {job_id}` explains the reason)"
                    )
            try:
                process.wait(timeout=self.poll_interval_s)
            except subprocess.TimeoutExpired:
                pass

    def _failure(self, job_id: str, name: str, code: int, stderr: str) -> str:
        """What a failed job's error says: its id, state, exit code and reason, sbatch's stderr, the job's traceback."""
        job = scontrol_job(job_id)
        state = ", ".join(f"{k} {job[k]}" for k in ("JobState", "ExitCode", "Reason") if k in job)
        log = self.log_file(name)
        cause = root_cause(log.read_text(errors="replace")) if log.is_file() else ""
        return "\n".join(
            filter(
                None,
                [
                    f"Slurm job {job_id} ({name}) failed: {state or 'state unknown'}; sbatch exit code {code}",
                    f"sbatch: {stderr.strip()}" if stderr.strip() else "",
                    f"the job's error:\n{cause}" if cause else "",
                    f"full log: {log}; `sacct -j {job_id}` for the accounting record",
                ],
            )
        )


# Pending reasons that need an administrator or a resubmission (no amount of waiting starts the job).
NEVER_STARTS = frozenset(
    {
        "PartitionConfig",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
        "AccountNotAllowed",
        "QOSNotAllowed",
        "DependencyNeverSatisfied",
    }
)


def _squeue(job_id: str) -> tuple[str, str]:
    """(state, reason) of a queued job; ("", "") when squeue cannot tell (the job left the queue)."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "", ""
    state, _, reason = done.stdout.strip().partition("|")
    return state, reason


def scontrol_job(job_id: str) -> dict[str, str]:
    """`scontrol show job`'s fields of a job Slurm still remembers (MinJobAge), else {}."""
    try:
        done = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(field.split("=", 1) for field in done.stdout.split() if "=" in field)


def root_cause(log: str, max_lines: int = 40) -> str:
    """The last Python traceback in `log` through its exception line (at most `max_lines` lines), passing over
    torchrun's own ChildFailedError, which only reports that a rank failed; `[rankN]:` prefixes dropped."""
    lines = [RANK_PREFIX.sub("", line) for line in log.splitlines()]
    blocks = []
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("Traceback (most recent call last)"):
            continue
        block = [line]
        for following in lines[i + 1 :]:
            block.append(following)
            if following[:1].strip() and not following.startswith("Traceback"):
                break  # the exception line: the first one not indented
        blocks.append(block)
    causes = [b for b in blocks if "ChildFailedError" not in b[-1]] or blocks
    return "\n".join(causes[-1][-max_lines:]) if causes else ""
