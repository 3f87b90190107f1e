"""LocalSteps: DiLoCo's outer loop around a training loop of one's own,
over gloo (sparsecomm/local_steps.py on the C++ OuterLoop)."""

import copy

import pytest
import torch
import torch.distributed as dist

import sparsecomm


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _batch(rank, step):
    generator = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(8, 12, generator=generator)
    return x, (x[:, :3].sum(dim=1) > 0).long() + (x[:, 3] > 1).long()


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _local_steps(rank, world):
    loss_fn = torch.nn.CrossEntropyLoss()

    # 1. One local step per round, outer lr 1, no outer momentum, plain SGD:
    #    synchronous data parallelism (the ranks average lr * g), and every
    #    rank starts from rank 0's parameters.
    model = _model(seed=rank)  # different on each rank: LocalSteps broadcasts rank 0's
    outer = sparsecomm.LocalSteps(model, "dense", 1, outer_lr=1.0, outer_momentum=0.0,
                                  outer_nesterov=False)
    reference = _model(seed=0)
    assert torch.equal(_flat(model), _flat(reference))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(5):
        x, y = _batch(rank, step)
        loss_fn(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        assert outer.step() is not None  # every step ends a round
        loss_fn(reference(x), y).backward()
        for p in reference.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        reference_optimizer.step()
        reference_optimizer.zero_grad()
    assert torch.allclose(_flat(model), _flat(reference), atol=1e-6)
    assert outer.rounds == 5

    # 2. Top-k with error feedback on rounds of 3 steps, outer lr 1 and no
    #    outer momentum: what the ranks' pseudo-gradients add up to equals n
    #    times how far the anchor moved plus what error feedback still holds.
    model = _model(seed=3)
    outer = sparsecomm.LocalSteps(model, "topk", 3, outer_lr=1.0, outer_momentum=0.0,
                                  outer_nesterov=False, density=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = outer.anchor().double()
    pseudo_gradients = torch.zeros_like(start)
    rounds = 0
    for step in range(12):
        x, y = _batch(rank, step)
        loss_fn(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        before = outer.anchor().double() - _flat(model).double()
        metrics = outer.step()
        assert (metrics is not None) == (step % 3 == 2)
        if metrics is not None:
            pseudo_gradients += before
            rounds += 1
            assert metrics["bytes_sent"] > 0
            assert torch.equal(_flat(model), outer.anchor())  # restarted from the anchor
    assert rounds == 4
    total = pseudo_gradients - outer.kept().double()
    dist.all_reduce(total)
    moved = start - outer.anchor().double()
    assert torch.allclose(total, world * moved, atol=1e-5), (total - world * moved).abs().max()
    assert outer.kept().abs().sum() > 0  # 10% left something behind

    # 3. A state_dict taken inside a round continues exactly.
    x, y = _batch(rank, 99)
    loss_fn(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
    outer.step()
    saved_model, saved_optimizer = copy.deepcopy(model), copy.deepcopy(optimizer.state_dict())
    state = outer.state_dict()
    twin = _model(seed=3)
    twin.load_state_dict(saved_model.state_dict())
    twin_outer = sparsecomm.LocalSteps(twin, "topk", 3, outer_lr=1.0, outer_momentum=0.0,
                                       outer_nesterov=False, density=0.1)
    twin_outer.load_state_dict(state)
    twin.load_state_dict(saved_model.state_dict())  # the broadcast reset it to rank 0's
    twin_optimizer = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)
    twin_optimizer.load_state_dict(saved_optimizer)
    for step in range(100, 105):
        for m, o, l in ((model, optimizer, outer), (twin, twin_optimizer, twin_outer)):
            x, y = _batch(rank, step)
            loss_fn(m(x), y).backward()
            o.step()
            o.zero_grad()
            l.step()
    assert torch.equal(_flat(model), _flat(twin))
    with pytest.raises(ValueError, match="rounds of 3 local steps, this LocalSteps has 4"):
        sparsecomm.LocalSteps(_model(0), "topk", 4, density=0.1).load_state_dict(state)

    # 4. What cannot work says why.
    with pytest.raises(ValueError, match="local steps"):
        sparsecomm.LocalSteps(_model(0), "dense", 0)
    with pytest.raises(ValueError, match="memory='ef'"):
        sparsecomm.LocalSteps(_model(0), "dgc", 4)
    with pytest.raises(ValueError, match="float32 CPU"):
        sparsecomm.LocalSteps(_model(0).double(), "dense", 4)


def test_local_steps(run_world):
    run_world(2, _local_steps)


def test_rounds_take_the_clis_option_rule():
    # The spike clip is off on rounds unless named (sync/gradient_sync.h,
    # round_options), for LocalSteps as for the CLI's --local-steps.
    from sparsecomm._sparsecomm import round_options

    assert round_options("topk", {"density": "0.01"}) == {"density": "0.01", "clip_ratio": "0"}
    assert round_options("topk", {"clip_ratio": "3"}) == {"clip_ratio": "3"}
    assert round_options("dense", {}) == {}  # takes no clip
    with pytest.raises(ValueError, match="unknown synchronization method"):
        round_options("nonesuch", {})
