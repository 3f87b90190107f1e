"""Runs a function in `world` processes joined by torch.distributed over
gloo, each test rendezvousing through its own FileStore (a file in the
test's tmp_path), so parallel test runs never collide on a port."""

import os

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank, world, store_path, fn, args):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=world)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


@pytest.fixture
def run_world(tmp_path):
    """run_world(world, fn, *args): fn(rank, world, *args) in `world`
    processes; an exception in any of them fails the test."""

    def run(world, fn, *args):
        store = tmp_path / f"store-{world}-{fn.__name__}"
        mp.start_processes(_entry, args=(world, str(store), fn, args), nprocs=world,
                           join=True, start_method="spawn")

    return run
