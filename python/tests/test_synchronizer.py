"""sparsecomm's methods on torch tensors in a training loop of one's own
(Synchronizer), over gloo."""

import pytest
import torch
import torch.distributed as dist

import sparsecomm


def _conserves_mass(rank, world, method, options):
    """Error feedback loses nothing: over T steps the ranks' gradients add
    up to n x the averages they received plus what the ranks still hold."""
    comm = sparsecomm.Communicator(dist.distributed_c10d._get_default_group())
    sync = sparsecomm.Synchronizer(comm, method, options)
    generator = torch.Generator().manual_seed(7 + rank)
    numel, steps = 5000, 6
    given = torch.zeros(numel, dtype=torch.float64)
    received = torch.zeros(numel, dtype=torch.float64)
    for step in range(steps):
        gradient = torch.randn(numel, generator=generator) * (1 + torch.arange(numel) % 7)
        given += gradient.double()
        metrics = sync.synchronize(gradient, step)
        received += gradient.double()  # replaced by the average
        assert '"selected"' in metrics
    kept = sync.kept().double()
    assert kept.numel() == numel
    # sum over ranks of given == n x received + sum over ranks of kept
    total = given - kept
    dist.all_reduce(total)
    assert torch.allclose(total, world * received, rtol=1e-4, atol=1e-3), \
        (total - world * received).abs().max()
    # Something was left behind: the residual is not empty at 5%.
    assert kept.abs().sum() > 0


@pytest.mark.parametrize("method, options", [
    ("topk", {"density": "0.05"}),
    ("exdyna", {"density": "0.05"}),
    # Skip-Reduce keeps back the chunks the ring drops from this rank.
    ("skipreduce", {"skip": "1", "min_elements": "0", "memory": "ef"}),
])
@pytest.mark.parametrize("world", [2, 4])
def test_error_feedback_conserves_gradient_mass(run_world, world, method, options):
    run_world(world, _conserves_mass, method, options)


def _wrong_tensors(rank, world):
    comm = sparsecomm.Communicator(dist.distributed_c10d._get_default_group())
    sync = sparsecomm.Synchronizer(comm, "topk", {"density": "0.1"})
    with pytest.raises(ValueError, match="float32"):
        sync.synchronize(torch.zeros(10, dtype=torch.float64), 0)
    with pytest.raises(ValueError, match="contiguous"):
        sync.synchronize(torch.zeros(10, 2)[:, 0], 0)


def test_a_tensor_of_another_kind_says_what_to_do(run_world):
    run_world(2, _wrong_tensors)
