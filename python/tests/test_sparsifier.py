"""Sparsifier and decode: sparsecomm's selection with error feedback for
training loops that move the selections themselves."""

import pytest
import torch
import torch.distributed as dist

import sparsecomm


def test_topk_on_one_rank_keeps_exactly_what_it_did_not_select():
    sparsifier = sparsecomm.Sparsifier("topk", density=0.1)
    generator = torch.Generator().manual_seed(3)
    first = torch.randn(200, generator=generator)
    indices, values = sparsifier.select(first, 0)
    assert indices.dtype == torch.int64 and values.dtype == torch.float32
    assert indices.numel() == 20 == sparsifier.target(200)
    assert torch.equal(indices, torch.sort(first.abs().topk(20).indices).values)
    assert torch.equal(values, first[indices])
    # sent + kept == gradient, bit for bit
    assert torch.equal(sparsecomm.decode(indices, values, 200) + sparsifier.kept(), first)
    second = torch.randn(200, generator=generator)
    accumulated = sparsifier.kept() + second
    indices, values = sparsifier.select(second, 1)
    assert torch.equal(values, accumulated[indices])
    assert sparsifier.counts == [20]


def _matches_the_allgather_exchange(rank, world, method):
    """Every rank's selection, gathered by torch.distributed and decoded,
    is the average sparsecomm's own all-gather exchange computes."""
    group = dist.distributed_c10d._get_default_group()
    sparsifier = sparsecomm.Sparsifier(method, density=0.05)
    reference = sparsecomm.Synchronizer(sparsecomm.Communicator(group), method,
                                        {"density": "0.05", "exchange": "allgather"})
    generator = torch.Generator().manual_seed(11 + rank)
    numel = 3000
    for step in range(5):
        gradient = torch.randn(numel, generator=generator) * (1 + torch.arange(numel) % 5)
        average = gradient.clone()
        reference.synchronize(average, step, layers=[1000, 2000])
        indices, values = sparsifier.select(gradient, step, layers=[1000, 2000])
        selections = [None] * world
        dist.all_gather_object(selections, (indices, values))
        decoded = sparsecomm.decode([s[0] for s in selections], [s[1] for s in selections],
                                    numel, divisor=world)
        assert torch.allclose(decoded, average, rtol=1e-6, atol=1e-6), step
        assert torch.equal(sparsifier.kept(), reference.kept()), step
        assert sum(sparsifier.counts) == sum(s[0].numel() for s in selections) or method == "deft"


@pytest.mark.parametrize("method", ["topk", "exdyna", "deft"])
def test_gathered_selections_are_the_allgather_exchange(run_world, method):
    run_world(2, _matches_the_allgather_exchange, method)


def _resumes_exactly(rank, world):
    generator = torch.Generator().manual_seed(5 + rank)
    gradients = [torch.randn(2000, generator=generator) for _ in range(8)]
    straight = sparsecomm.Sparsifier("exdyna", density=0.02)
    for step in range(4):
        straight.select(gradients[step], step)
    saved = straight.state_dict()
    resumed = sparsecomm.Sparsifier("exdyna", density=0.02)
    resumed.load_state_dict(saved)
    for step in range(4, 8):
        a = straight.select(gradients[step], step)
        b = resumed.select(gradients[step], step)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), step


def test_a_state_dict_round_trip_resumes_exactly(run_world):
    run_world(2, _resumes_exactly)


def test_bad_methods_and_options_say_what_is_valid():
    with pytest.raises(ValueError, match="unknown scheme 'topq'.*topk"):
        sparsecomm.Sparsifier("topq")
    with pytest.raises(ValueError, match="an exchange, not a sparsification scheme"):
        sparsecomm.Sparsifier("skipreduce")
    with pytest.raises(ValueError, match="option of the exchange"):
        sparsecomm.Sparsifier("topk", exchange="union")
    with pytest.raises(ValueError, match="density"):
        sparsecomm.Sparsifier("topk", density=2)
    with pytest.raises(ValueError, match="compresses in its exchange's value codec"):
        sparsecomm.Sparsifier("qsgd")
    sparsifier = sparsecomm.Sparsifier("topk")
    with pytest.raises(ValueError, match="sum to 5 but the gradient has 10"):
        sparsifier.select(torch.zeros(10), 0, layers=[2, 3])
    with pytest.raises(ValueError, match="outside"):
        sparsecomm.decode(torch.tensor([12]), torch.tensor([1.0]), 10)
    with pytest.raises(ValueError, match="of method 'exdyna'"):
        sparsifier.load_state_dict({"method": "exdyna", "state": b""})


def test_a_nonfinite_gradient_stops_or_is_skipped():
    stopping = sparsecomm.Sparsifier("topk", density=0.5)
    with pytest.raises(RuntimeError, match="non-finite"):
        stopping.select(torch.tensor([1.0, float("nan"), 2.0, 3.0]), 0)
    skipping = sparsecomm.Sparsifier("topk", density=0.5, nonfinite="skip")
    indices, values = skipping.select(torch.tensor([1.0, float("inf"), 2.0, 3.0]), 0)
    assert indices.numel() == 0 and skipping.skipped
