"""Runs a function in `world` processes joined by torch.distributed over
gloo, each test rendezvousing through its own FileStore (a file in the
test's tmp_path), so parallel test runs never collide on a port.

The processes come from a fork server that has imported torch and
sparsecomm once (multiprocessing's forkserver with a preload), so a test
pays a fork, not an interpreter start and a torch import, per rank."""

import multiprocessing
import os

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

# Read before the fork server starts (at the first test that needs it).
multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "sparsecomm"])


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
                           join=True, start_method="forkserver")

    return run
