"""The device path on a CUDA device (scripts/gpu-check.sh runs these on a
GPU machine). Without a CUDA device every test here is skipped, and says
so: the same code runs on CPU tensors in test_device_selection.py."""

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import sparsecomm
from sparsecomm._sparsecomm import DeviceSynchronizer

from test_ddp_hook import _batches, _model, _parameters
from test_device_selection import _heavy_tailed, _single

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (scripts/gpu-check.sh)")


@pytest.mark.parametrize("n, k", [(1_000_000, 1_000), (1_000_000, 100_000), (5_000, 4_999)])
def test_selection_on_the_gpu_matches_the_cpu(n, k):
    sync = DeviceSynchronizer(_single(), "topk", {"density": "0.5"})
    accumulated = _heavy_tailed(n, n + k)
    on_gpu = sync._select(accumulated.cuda(), k)
    assert on_gpu.is_cuda
    assert torch.equal(on_gpu.cpu(), sync._select(accumulated, k))


def _train_on_gpu(rank, steps, method=None, **options):
    torch.cuda.set_device(0)  # both processes share the one GPU
    model = DDP(_model().cuda(), device_ids=[0])
    state = sparsecomm.register(model, method, **options) if method else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in _batches(rank, steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
        optimizer.step()
    return state, _parameters(model).cpu()


def _gpu_hook(rank, world):
    # gloo carries CUDA tensors; NCCL wants a GPU per process.
    _, default = _train_on_gpu(rank, 4)
    state, hooked = _train_on_gpu(rank, 4, "topk", density=1.0, bucket_mb=0.0001)
    assert state.selection == "device"
    assert torch.allclose(hooked, default, rtol=1e-5, atol=1e-6), (hooked - default).abs().max()
    # Mass conservation on CUDA tensors.
    group = dist.distributed_c10d._get_default_group()
    sync = DeviceSynchronizer(group, "topk", {"density": "0.01"})
    generator = torch.Generator().manual_seed(rank)
    total_in, total_out = torch.zeros(100_000), torch.zeros(100_000)
    for step in range(3):
        gradient = torch.randn(100_000, generator=generator)
        total_in += gradient
        averaged = gradient.cuda()
        sync.synchronize(averaged, step)
        total_out += averaged.cpu()
    dist.all_reduce(total_in)
    residuals = sync.kept()
    dist.all_reduce(residuals)
    assert torch.allclose(total_in, world * total_out + residuals, atol=1e-4)


def test_the_hook_on_cuda_gradients_matches_ddp_and_conserves_mass(run_world):
    run_world(2, _gpu_hook)


def _host_selection_of_cuda_gradients(rank, world):
    # ExDyna has no device path: "auto" selects on the host, the gradients
    # crossing to it and back; the result is the CPU run's, within the
    # rounding of the GPU's forward and backward.
    state, on_gpu = _train_on_gpu(rank, 4, "exdyna", density=0.1)
    assert state.selection == "host"
    torch.manual_seed(0)
    model = DDP(_model())
    sparsecomm.register(model, "exdyna", density=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in _batches(rank, 4):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    assert torch.allclose(on_gpu, _parameters(model), rtol=1e-4, atol=1e-5)


def test_a_method_without_a_device_path_selects_cuda_gradients_on_the_host(run_world):
    run_world(2, _host_selection_of_cuda_gradients)


def _host_selection_refuses_nccl(rank, world):
    nccl = dist.new_group(backend="nccl")
    torch.cuda.set_device(0)
    model = DDP(_model().cuda(), device_ids=[0], process_group=nccl)
    with pytest.raises(ValueError, match="NCCL cannot carry"):
        sparsecomm.register(model, "exdyna", group=nccl)
    state = sparsecomm.register(model, "topk", group=nccl, density=0.1)  # the device path
    x, y = _batches(rank, 1)[0]
    torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
    assert state.selection == "device" and state.metrics["selected"] > 0


def test_an_nccl_group_takes_the_device_path_and_refuses_the_host_one(run_world):
    run_world(1, _host_selection_refuses_nccl)
