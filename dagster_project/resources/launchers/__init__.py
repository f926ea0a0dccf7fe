"""Launchers run the distributed jobs (the modules `jobs.train`, `jobs.score`, `jobs.train_student`) outside
the Dagster process.

`JobLauncher` (`base`) is the interface the training, export and student assets use; each
implementation runs `torchrun ... -m <module> <args>` through Dagster Pipes, so rank 0's log lines
and reported metrics appear in the Dagster run. `LocalTorchrunLauncher` (`local`) runs
`torchrun --standalone` on this machine (the default). `KubernetesTorchrunLauncher` (`k8s`) renders
a Kubeflow `PyTorchJob` (or an indexed batch/v1 Job plus a headless Service) whose pods run torchrun
with c10d rendezvous. `SlurmTorchrunLauncher` (`slurm`) renders an sbatch script that `srun`s
torchrun once per node. The cluster launchers inject the Pipes context as environment variables and
read Pipes messages from a file under `$GEM_HOME/staging/pipes`, so `gem_home` must be the same
shared path in the Dagster process and on every node (it is where the jobs read their inputs and
write checkpoints anyway); their `render(...)` methods are pure, for inspection and tests.
`launcher_from_env` (`from_env`) picks one by `GEM_LAUNCHER` (`local`, `kubernetes`, `slurm`).
"""

from dagster_project.resources.launchers.base import JobLauncher, JobLaunchError, job_name
from dagster_project.resources.launchers.from_env import LAUNCHERS, launcher_from_env
from dagster_project.resources.launchers.k8s import KubernetesTorchrunLauncher
from dagster_project.resources.launchers.local import LocalTorchrunLauncher
from dagster_project.resources.launchers.slurm import NEVER_STARTS, SlurmTorchrunLauncher, root_cause, scontrol_job

__all__ = [
    "LAUNCHERS",
    "NEVER_STARTS",
    "JobLaunchError",
    "JobLauncher",
    "KubernetesTorchrunLauncher",
    "LocalTorchrunLauncher",
    "SlurmTorchrunLauncher",
    "job_name",
    "launcher_from_env",
    "root_cause",
    "scontrol_job",
]
