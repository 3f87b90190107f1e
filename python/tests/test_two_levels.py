"""Two-level exchanges through the DDP hook (torch.distributed subgroups:
a group per host and the leaders' group, python/src/host_levels.h) and the
Synchronizer (``ranks_per_host``, sync/two_level.h, the CLI's form);
docs/algorithms.md, "Two-level exchanges": 4 gloo processes as 2 hosts of 2
ranks."""

import os

import pytest
import torch
import torch.distributed as dist

import sparsecomm
from sparsecomm import Communicator, Synchronizer

from test_ddp_hook import _train


def _hook_on_two_levels(rank, world):
    _, default = _train(rank, 5)
    # Dense, and Top-k at density 1, on 2 x 2: DDP's average up to rounding.
    for method, options in (("dense", {}), ("topk", {"density": 1.0})):
        state, hooked = _train(rank, 5, method, ranks_per_host=2, **options)
        assert torch.allclose(hooked, default, rtol=1e-5, atol=1e-6), (hooked - default).abs().max()
        assert state.step == 5
    # ExDyna at 5%: every rank ends with the same parameters; between hosts
    # only the leaders (ranks 0 and 2) send.
    state, hooked = _train(rank, 5, "exdyna", ranks_per_host=2, density=0.05)
    everyone = [torch.empty_like(hooked) for _ in range(world)]
    dist.all_gather(everyone, hooked)
    assert all(torch.equal(everyone[0], other) for other in everyone)
    assert (state.metrics["bytes_sent"] > 0) == (rank % 2 == 0)
    # The host's group moves its bytes (NCCL's or gloo's own collectives).
    assert state.metrics.get("host_bytes_sent", 0) == 0
    assert (len(state.kept()) > 0) == (rank % 2 == 0)  # the host's residual, once


def test_the_hook_on_two_hosts_of_two_ranks(run_world):
    run_world(4, _hook_on_two_levels)


def _subgroups_equal_the_clis_two_levels(rank, world):
    # The hook's subgroups and the CLI's two levels (one group, views of it)
    # give the same bits, step after step, ExDyna's state on the leaders.
    from sparsecomm._hosts import Hosts
    hosts = Hosts(dist.distributed_c10d._get_default_group(), 2, "cpu")
    runs, owner = hosts.synchronizer("exdyna", {"density": "0.05"}, "stop")
    cli = Synchronizer(Communicator(dist.distributed_c10d._get_default_group()), "exdyna",
                       {"density": "0.05"}, "stop", 2)
    generator = torch.Generator().manual_seed(rank)
    for step in range(4):
        gradient = torch.randn(1000, generator=generator)
        mine, theirs = gradient.clone(), gradient.clone()
        runs.synchronize(mine, step)
        cli.synchronize(theirs, step)
        assert torch.equal(mine, theirs), (step, (mine - theirs).abs().max())
    assert torch.equal(owner.kept(), cli.kept())
    # A non-finite gradient on a rank that does not lead stops every rank:
    # the host's average carries it to the leader, the leader's outcome to
    # its host.
    gradient = torch.ones(1000)
    if rank == 3:
        gradient[7] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite"):
        runs.synchronize(gradient, 4)


def test_the_hooks_subgroups_equal_the_clis_two_levels(run_world):
    run_world(4, _subgroups_equal_the_clis_two_levels)


def _hook_finds_the_hosts_by_name(rank, world):
    # Two "hosts" of two processes each, named as on a real cluster.
    os.environ["SPARSECOMM_HOST_NAME"] = f"host-{rank // 2}"
    _, given = _train(rank, 5, "exdyna", ranks_per_host=2, density=0.05)
    state, detected = _train(rank, 5, "exdyna", ranks_per_host="auto", density=0.05)
    assert torch.equal(given, detected)
    assert (state.metrics["bytes_sent"] > 0) == (rank % 2 == 0)
    with pytest.raises(ValueError, match="ranks_per_host=2.5"):
        _train(rank, 1, "exdyna", ranks_per_host=2.5)


def test_the_hook_finds_the_hosts_by_name(run_world):
    run_world(4, _hook_finds_the_hosts_by_name)


def _synchronizer_keeps_the_residual_on_leaders(rank, world):
    sync = Synchronizer(Communicator(dist.distributed_c10d._get_default_group()), "topk", {"density": "0.1"}, "stop", 2)
    gradient = torch.arange(100, dtype=torch.float32) * (rank + 1)
    sync.synchronize(gradient, 0)
    assert sync.kept().numel() == (100 if rank % 2 == 0 else 0)
    with pytest.raises(ValueError, match="3 ranks per host do not divide the world of 4"):
        Synchronizer(Communicator(dist.distributed_c10d._get_default_group()), "topk", {}, "stop", 3)


def test_the_synchronizer_keeps_a_hosts_residual_once(run_world):
    run_world(4, _synchronizer_keeps_the_residual_on_leaders)


def test_two_levels_select_on_the_host():
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match="two levels"):
        sparsecomm.ddp._selection_for("device", "topk", list(model.named_parameters()),
                                      "gradient", ranks_per_host=2)
