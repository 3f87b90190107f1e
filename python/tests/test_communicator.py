"""sparsecomm's collectives over a torch.distributed (gloo) process group."""

import pytest
import torch

import sparsecomm


def _ring_allreduce(rank, world):
    import torch.distributed as dist

    comm = sparsecomm.Communicator(dist.distributed_c10d._get_default_group())
    assert (comm.rank, comm.size) == (rank, world)
    # 1,000 elements with fractional values: the sum over ranks in any
    # order is within float rounding of the exact one.
    x = torch.arange(1000, dtype=torch.float32) / 7 + rank
    sparsecomm.allreduce(comm, x)
    expected = world * (torch.arange(1000, dtype=torch.float64) / 7) + sum(range(world))
    assert torch.allclose(x.double(), expected, rtol=1e-6, atol=1e-4)
    # A tensor of another dtype is refused with the reason.
    with pytest.raises(ValueError, match="contiguous float32 CPU tensor"):
        sparsecomm.allreduce(comm, torch.zeros(4, dtype=torch.float64))


@pytest.mark.parametrize("world", [2, 4])
def test_ring_allreduce_over_gloo_sums_every_rank(run_world, world):
    run_world(world, _ring_allreduce)
