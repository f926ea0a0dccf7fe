"""Two gloo ranks: the DMP-sharded model predicts what an unsharded copy of its checkpoint predicts."""

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gem_model.config import GemConfig
from gem_model.data.loader import features_to_kjt
from gem_model.models.gem import GemModel
from gem_model.testing.examples import random_examples
from gem_model.train.trainer import DistEnv, build_sharded_model, init_distributed, save_checkpoint

pytestmark = pytest.mark.dist
CFG = GemConfig.from_dict({"train": {"batch_size": 32}})


def _join(rank: int, port: int) -> DistEnv:
    """This spawned process as one of two gloo ranks, on one thread."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    return DistEnv(rank, 2, torch.device("cpu"), "gloo")


def _sharding_types(dmp) -> dict[str, str]:
    return {t: s.sharding_type for plans in dmp.plan.plan.values() for t, s in plans.items()}


def _worker(rank: int, port: int, root: Path) -> None:
    dmp, optimizer = build_sharded_model(CFG, _join(rank, port))
    for step in range(3):  # train a little so the tables are not at their initial values
        table = random_examples(CFG.features, 32, seed=10 * step + rank, max_len=60)
        n = table.num_rows
        loss, _ = dmp(
            features_to_kjt(table, CFG.features),
            torch.ones(n) * (step % 2),
            torch.zeros(n),
            torch.ones(n, dtype=torch.bool),
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dmp.eval()
    table = random_examples(CFG.features, 32, seed=100 + rank, max_len=60)
    with torch.no_grad():
        _, out = dmp(
            features_to_kjt(table, CFG.features), torch.zeros(32), torch.zeros(32), torch.ones(32, dtype=torch.bool)
        )
    torch.save({"logits": out.logits, "user": out.user_embedding}, root / f"rank{rank}.pt")
    save_checkpoint(dmp, root / "checkpoint")
    torch.save(_sharding_types(dmp), root / "plan.pt")
    dist.destroy_process_group()


@pytest.mark.slow
def test_sharded_predictions_match_an_unsharded_copy(tmp_path, free_port):
    import torch.distributed.checkpoint as dcp

    mp.spawn(_worker, args=(free_port(), tmp_path), nprocs=2, join=True)
    plan = torch.load(tmp_path / "plan.pt")
    assert {"row_wise", "table_wise"} <= set(plan.values()), plan  # the planner mixed shardings
    model = GemModel(CFG.features, CFG.model)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    dcp.load({"model": state}, checkpoint_id=str(tmp_path / "checkpoint"))
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    model.eval()
    for rank in range(2):
        sharded = torch.load(tmp_path / f"rank{rank}.pt")
        with torch.no_grad():
            table = random_examples(CFG.features, 32, seed=100 + rank, max_len=60)
            out = model(features_to_kjt(table, CFG.features))
        assert torch.allclose(out.logits, sharded["logits"], atol=1e-5)
        assert torch.allclose(out.user_embedding, sharded["user"], atol=1e-5)


def _world_of_one(index: int, together, root: Path) -> None:
    """A plain run (no torchrun): its own world of one, alive while the other one is."""
    env = init_distributed()
    total = torch.ones(1)
    dist.all_reduce(total)
    together.wait()  # both worlds exist at once
    torch.save({"world_size": env.world_size, "rank": env.rank, "total": total.item()}, root / f"world{index}.pt")
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_plain_runs_on_one_machine_each_have_a_world_of_one(tmp_path):
    """A run outside torchrun takes no port, so two at once do not collide."""
    context = mp.get_context("spawn")
    together = context.Barrier(2)
    procs = [context.Process(target=_world_of_one, args=(i, together, tmp_path)) for i in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=600)  # a rank stuck at the barrier, its peer dead; not the machine's speed
    assert [proc.exitcode for proc in procs] == [0, 0]
    worlds = [torch.load(tmp_path / f"world{i}.pt") for i in range(2)]
    assert worlds == [{"world_size": 1, "rank": 0, "total": 1.0}] * 2
