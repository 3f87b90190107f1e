"""Selection on the gradient's device (DeviceSynchronizer, the hook's
selection="device"): the same ATen code that runs on a CUDA device, run
here on CPU tensors over gloo and held against the host schemes."""

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import sparsecomm
from sparsecomm._sparsecomm import DeviceSynchronizer

from test_ddp_hook import _batches, _model, _parameters, _run, _train


def _heavy_tailed(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=generator) * torch.rand(n, generator=generator) ** 4


def _single():
    """No process group: a DeviceSynchronizer of this process alone."""
    return None


@pytest.mark.parametrize("n, k", [(100_000, 100), (100_000, 5_000), (1_000, 999), (50, 50)])
def test_histogram_topk_selects_exactly_the_k_largest(n, k):
    sync = DeviceSynchronizer(_single(), "topk", {"density": "0.5"})
    accumulated = _heavy_tailed(n, n + k)
    chosen = sync._select(accumulated, k)
    expected = torch.sort(torch.topk(accumulated.abs(), k).indices).values
    assert torch.equal(chosen, expected)


def test_histogram_topk_with_ties_and_zeros_still_selects_k():
    sync = DeviceSynchronizer(_single(), "topk", {"density": "0.5"})
    accumulated = torch.zeros(10_000)
    accumulated[:3000] = 1.0  # ties across the k-th
    chosen = sync._select(accumulated, 2000)
    assert chosen.numel() == 2000 and bool((accumulated[chosen] == 1.0).all())
    assert torch.equal(chosen, torch.sort(chosen).values)
    # Magnitudes over more than the histogram's 40 octaves: the full topk.
    spread = torch.tensor([2.0 ** -e for e in range(0, 120, 3)])
    chosen = sync._select(spread, 30)
    assert torch.equal(chosen, torch.arange(30))


def test_bad_device_settings_raise_value_errors():
    group = _single()
    with pytest.raises(ValueError, match="no device path"):
        DeviceSynchronizer(group, "exdyna", {})
    with pytest.raises(ValueError, match="takes density"):
        DeviceSynchronizer(group, "topk", {"exchange": "allgather"})
    # The registry says what the device path implements (SchemeTraits::device_options).
    assert sparsecomm.device_methods() == ["dense", "topk", "threshold"]
    with pytest.raises(ValueError, match="takes density, memory=ef, not memory=none"):
        DeviceSynchronizer(group, "topk", {"memory": "none"})
    DeviceSynchronizer(group, "threshold", {"lambda": "0.01", "memory": "ef"})
    with pytest.raises(ValueError, match="dense on the gradient's device takes no options"):
        DeviceSynchronizer(group, "dense", {"density": "0.1"})
    with pytest.raises(ValueError, match="density"):
        DeviceSynchronizer(group, "topk", {"density": "0"})
    sync = DeviceSynchronizer(group, "topk", {"density": "0.1"})
    with pytest.raises(ValueError, match="contiguous 1-d float32"):
        sync.synchronize(torch.zeros(10, dtype=torch.float64), 0)
    sync.synchronize(torch.ones(10), 0)
    with pytest.raises(ValueError, match="keeps its length"):
        sync.synchronize(torch.ones(11), 1)


def _conservation(rank, world):
    """sum_r g_r = n * average + sum_r e_r: nothing lost, nothing made."""
    group = dist.distributed_c10d._get_default_group()
    for method, options in (("topk", {"density": "0.05"}), ("threshold", {"lambda": "0.5"})):
        sync = DeviceSynchronizer(group, method, options)
        generator = torch.Generator().manual_seed(10 + rank)
        total_in = torch.zeros(4096)
        total_out = torch.zeros(4096)
        for step in range(3):
            gradient = torch.randn(4096, generator=generator)
            total_in += gradient
            averaged = gradient.clone()
            metrics = sync.synchronize(averaged, step)
            total_out += averaged
        gradients = total_in.clone()
        dist.all_reduce(gradients)
        residuals = sync.kept()
        dist.all_reduce(residuals)
        assert torch.allclose(gradients, world * total_out + residuals, atol=1e-4), method
        assert '"union_size"' in metrics


@pytest.mark.parametrize("world", [2, 4])
def test_device_selection_conserves_mass(run_world, world):
    run_world(world, _conservation)


def _device_matches_default_and_host(rank, world):
    _, default = _train(rank, 4)
    state, device_density_one = _train(rank, 4, "topk", density=1.0, selection="device",
                                       bucket_mb=0.0001)
    assert state.selection == "device" and state.metrics["groups"] == 3
    assert torch.allclose(device_density_one, default, rtol=1e-5, atol=1e-6)
    # At 10%: the same selections and sums as the host's Top-k (sums in
    # another order: float rounding).
    host_state, host = _train(rank, 4, "topk", density=0.1, exchange="allgather")
    device_state, device = _train(rank, 4, "topk", density=0.1, selection="device")
    assert torch.allclose(device, host, rtol=1e-5, atol=1e-6), (device - host).abs().max()
    for name, kept in host_state.kept().items():
        assert torch.allclose(device_state.kept()[name], kept, atol=1e-6), name
    assert device_state.metrics["selected"] == host_state.metrics["selected"]
    assert device_state.metrics["union_size"] == host_state.metrics["union_size"]


@pytest.mark.parametrize("world", [2, 4])
def test_device_selection_through_the_hook_matches_the_host(run_world, world):
    run_world(world, _device_matches_default_and_host)


def _device_hook_resumes_and_refuses(rank, world):
    model = DDP(_model())
    state = sparsecomm.register(model, "topk", density=0.2, selection="device",
                                min_numel=100)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = _batches(rank, 4)
    _run(model, optimizer, batches[:2])
    saved = state.state_dict()
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    _run(model, optimizer, batches[2:])
    expected = _parameters(model)

    resumed = DDP(_model())
    resumed.load_state_dict(saved_model)
    state = sparsecomm.register(resumed, "topk", density=0.2, selection="device",
                                min_numel=100)
    state.load_state_dict(saved)
    _run(resumed, torch.optim.SGD(resumed.parameters(), lr=0.1), batches[2:])
    assert torch.equal(_parameters(resumed), expected)
    with pytest.raises(ValueError, match="selection"):
        sparsecomm.register(DDP(_model()), "topk", density=0.2, selection="host",
                            min_numel=100).load_state_dict(saved)
    with pytest.raises(ValueError, match="no device path"):
        sparsecomm.register(DDP(_model()), "exdyna", selection="device")
    with pytest.raises(ValueError, match="AdamW moments on the host"):
        sparsecomm.register(DDP(_model()), "topk", selection="device", compress="update")
    with pytest.raises(ValueError, match="valid are 'auto'"):
        sparsecomm.register(DDP(_model()), "topk", selection="gpu")


def test_a_device_hook_resumes_bit_for_bit_and_refuses_what_it_cannot_do(run_world):
    run_world(2, _device_hook_resumes_and_refuses)
