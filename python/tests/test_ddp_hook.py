"""DDP with sparsecomm's communication hook, in real processes over gloo."""

import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import sparsecomm


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _batches(rank, steps):
    generator = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(16, 20, generator=generator),
             torch.randint(0, 4, (16,), generator=generator)) for _ in range(steps)]


def _run(model, optimizer, batches):
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def _parameters(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _train(rank, steps, method=None, bucket_cap_mb=25, **options):
    """`steps` SGD steps of DDP on rank-specific data (small buckets: one
    per layer or less); the hook's state and the final parameters."""
    model = DDP(_model(), bucket_cap_mb=bucket_cap_mb)
    state = sparsecomm.register(model, method, **options) if method else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _run(model, optimizer, _batches(rank, steps))
    return state, _parameters(model)


def _density_one_matches_default(rank, world):
    _, default = _train(rank, 5)
    state, hooked = _train(rank, 5, "topk", bucket_cap_mb=0.001, density=1.0)
    # DDP divides before it sums, sparsecomm sums then divides: float rounding.
    assert torch.allclose(hooked, default, rtol=1e-5, atol=1e-6), (hooked - default).abs().max()
    assert state.step == 5
    assert state.metrics["union_size"] == state.metrics["numel"] == default.numel()


@pytest.mark.parametrize("world", [2, 4])
def test_topk_at_density_one_gives_the_default_all_reduce(run_world, world):
    run_world(world, _density_one_matches_default)


def _groups_exchange_as_their_gradients_arrive(rank, world):
    _, default = _train(rank, 5)
    # Groups closed at 0.0001 MB (104 bytes) or more, from the last
    # parameter back: 2.bias (16 bytes) needs 2.weight beside it, 0.bias
    # (128 bytes) and 0.weight fill one each. Exchanged in that order, each
    # with its own top-k at density 1.
    state, hooked = _train(rank, 5, "topk", bucket_mb=0.0001, density=1.0)
    assert [names for names, _ in state.groups] == [["2.weight", "2.bias"], ["0.bias"],
                                                    ["0.weight"]]
    assert torch.allclose(hooked, default, rtol=1e-5, atol=1e-6), (hooked - default).abs().max()
    assert state.step == 5
    assert state.metrics["groups"] == 3
    assert state.metrics["union_size"] == state.metrics["numel"] == default.numel()
    # Dense-averaged parameters get groups of their own.
    state, hooked = _train(rank, 2, "topk", bucket_mb=0.0001, exclude="0.*", density=0.1)
    assert state.groups[-2:] == [(["0.bias"], False), (["0.weight"], False)]
    assert state.metrics["groups"] == 3
    assert state.metrics["dense_numel"] == 20 * 32 + 32  # counted, not selected
    assert state.metrics["target"] < state.metrics["numel"] - state.metrics["dense_numel"]


@pytest.mark.parametrize("world", [2, 4])
def test_bucketed_groups_give_the_default_all_reduce_at_density_one(run_world, world):
    run_world(world, _groups_exchange_as_their_gradients_arrive)


def _overlap_exchanges_while_backward_runs(rank, world):
    """With overlap (the default) a group's exchange runs on the hook's
    worker while backward goes on; the results are those of exchanging on
    backward's thread (overlap=False), bit for bit, error feedback and all."""
    def train(overlap, wait_in_backward):
        torch.manual_seed(0)
        # DDP's first step hands the whole model as one bucket; then it
        # rebuilds its buckets in the order gradients arrived, the first
        # closed at 1 MB: 4.* and 2.* (1.4 MB), the second 0.*. The hook's
        # groups are each parameter but 4.* (one group).
        model = DDP(torch.nn.Sequential(torch.nn.Linear(20, 600), torch.nn.ReLU(),
                                        torch.nn.Linear(600, 600), torch.nn.ReLU(),
                                        torch.nn.Linear(600, 4)))
        state = sparsecomm.register(model, "topk", bucket_mb=0.0001, density=0.3,
                                    overlap=overlap)
        if wait_in_backward:
            # 0.weight's gradient comes after DDP handed the hook its first
            # bucket (three groups): from the second step backward stops here until the worker
            # has exchanged one of them, which it can only do beside backward.
            def wait_for_an_exchange(gradient):
                if state.step == 0:
                    return gradient  # one bucket: nothing was handed in yet
                before = time.monotonic()
                while state._worker.exchanged_groups <= exchanged[0]:
                    assert time.monotonic() - before < 60, "no exchange while backward waited"
                    time.sleep(0.001)
                return gradient
            model.module[0].weight.register_hook(wait_for_an_exchange)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        fractions = []
        for x, y in _batches(rank, 4):
            exchanged = [state._worker.exchanged_groups]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            fractions.append(state.metrics["overlap_fraction"])
            assert 0.0 <= state.metrics["hook_overlapped_s"] <= state.metrics["hook_exchange_s"]
        return _parameters(model), state, fractions

    inline, inline_state, inline_fractions = train(False, wait_in_backward=False)
    overlapped, state, fractions = train(True, wait_in_backward=True)
    assert torch.equal(overlapped, inline)
    assert [s.metrics["groups"] for s in (state, inline_state)] == [5, 5]
    assert torch.equal(torch.cat([t.flatten() for t in state.kept().values()]),
                       torch.cat([t.flatten() for t in inline_state.kept().values()]))
    assert inline_fractions == [0.0] * 4
    assert all(f > 0.0 for f in fractions[1:]), fractions


def test_overlapped_exchanges_run_beside_backward_and_change_nothing(run_world):
    run_world(2, _overlap_exchanges_while_backward_runs)


def _a_failed_exchange_ends_the_run(rank, world):
    model = DDP(_model())
    sparsecomm.register(model, "topk", density=0.1, bucket_mb=0.0001)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batches(rank, 1)[0]
    x[0, 0] = float("nan")  # every rank: a non-finite gradient, and nonfinite="stop"
    optimizer.zero_grad()
    with pytest.raises(sparsecomm.HookError) as failure:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    # Its own type and message, not torch's "Unable to cast ... to Tensor";
    # the exchange's error is the cause.
    message = str(failure.value)
    assert message.startswith("sparsecomm: the hook's exchange failed at step 0: "), message
    assert "non-finite" in message, message
    assert "Unable to cast" not in message, message
    assert isinstance(failure.value.__cause__, RuntimeError)
    # The next step fails too (the hook, or DDP's own check): never a hang.
    optimizer.zero_grad()
    with pytest.raises(RuntimeError):
        torch.nn.functional.cross_entropy(model(x), y).backward()


def test_a_failed_exchange_fails_this_step_and_every_later_one(run_world):
    run_world(2, _a_failed_exchange_ends_the_run)


def _skip_reduce_hook(rank, world):
    _, default = _train(rank, 4)
    # skip=0 prunes nothing: Skip-Reduce is then the plain ring all-reduce.
    state, hooked = _train(rank, 4, "skipreduce", skip=0, min_elements=0)
    assert torch.allclose(hooked, default, rtol=1e-5, atol=1e-6), (hooked - default).abs().max()
    assert state.metrics["selected"] == state.metrics["numel"] == default.numel()
    # skip=1 drops one rank's contribution to every chunk; this rank's own
    # dropped chunks are what it keeps back (memory=ef) and it sends less.
    state, pruned = _train(rank, 4, "skipreduce", skip=1, min_elements=0, memory="ef")
    assert state.metrics["selected"] < state.metrics["numel"]
    assert sum(kept.abs().sum() for kept in state.kept().values()) > 0
    assert not torch.allclose(pruned, default)


@pytest.mark.parametrize("world", [2, 4])
def test_skip_reduce_hook_prunes_inside_the_ring(run_world, world):
    run_world(world, _skip_reduce_hook)


def _momentum_correction_is_reported(rank, world):
    model = _model()
    assert sparsecomm.ddp_comm_hook(model, "dgc", density=0.05)[0].applies_momentum
    assert not sparsecomm.ddp_comm_hook(model, "topk", density=0.05)[0].applies_momentum
    assert sparsecomm.ddp_comm_hook(model, "topk", density=0.05, memory="momentum")[0].applies_momentum


def test_a_hook_that_applies_momentum_says_so(run_world):
    run_world(2, _momentum_correction_is_reported)


def test_every_cli_method_is_listed():
    methods = sparsecomm.methods()
    for name in ("dense", "skipreduce", "topk", "exdyna", "micro", "deft", "dgc"):
        assert name in methods
    assert "density" in sparsecomm.method_options("exdyna")
    assert "skip" in sparsecomm.method_options("skipreduce")
    assert "density" not in sparsecomm.method_options("skipreduce")
    with pytest.raises(ValueError, match="skipreduce"):  # the valid names
        sparsecomm.method_options("skip-reduce")


def _resume_is_exact(rank, world, method, bucket_mb):
    batches = _batches(rank, 8)
    options = ({"skip": 1, "min_elements": 0, "memory": "ef"} if method == "skipreduce"
               else {"rank": 1} if method == "powersgd" else {"density": 0.05})
    options["bucket_mb"] = bucket_mb
    # Uninterrupted: 8 steps.
    whole = DDP(_model(), bucket_cap_mb=0.001)
    sparsecomm.register(whole, method, **options)
    optimizer = torch.optim.SGD(whole.parameters(), lr=0.1, momentum=0.9)
    _run(whole, optimizer, batches)
    # 4 steps, everything saved, then a new model, optimizer and hook (and
    # DDP's buckets built anew) loaded and run for 4 more.
    first = DDP(_model(), bucket_cap_mb=0.001)
    state = sparsecomm.register(first, method, **options)
    optimizer = torch.optim.SGD(first.parameters(), lr=0.1, momentum=0.9)
    _run(first, optimizer, batches[:4])
    saved = (first.state_dict(), optimizer.state_dict(), state.state_dict())
    resumed = DDP(_model(), bucket_cap_mb=0.001)
    resumed.load_state_dict(saved[0])
    state = sparsecomm.register(resumed, method, **options)
    state.load_state_dict(saved[2])
    optimizer = torch.optim.SGD(resumed.parameters(), lr=0.1, momentum=0.9)
    optimizer.load_state_dict(saved[1])
    _run(resumed, optimizer, batches[4:])
    assert torch.equal(_parameters(resumed), _parameters(whole)), method
    # Another method's state is refused with the reason.
    other = sparsecomm.ddp_comm_hook(resumed, "randomk", density=0.05)[0]
    with pytest.raises(ValueError, match="method"):
        other.load_state_dict(saved[2])


@pytest.mark.parametrize("method, bucket_mb", [("topk", None), ("exdyna", None),
                                               ("skipreduce", None), ("topk", 0.0001),
                                               ("powersgd", None)])
def test_a_state_dict_round_trip_resumes_bit_for_bit(run_world, method, bucket_mb):
    run_world(2, _resume_is_exact, method, bucket_mb)


def _excluded_layers_are_averaged_densely(rank, world):
    _, default = _train(rank, 1)
    # Only the last layer's bias is sparsified (and at density 1 it is
    # exact too); the rest go through the dense ring.
    state, hooked = _train(rank, 1, "topk", exclude=["0.*", "2.weight"], density=1.0)
    assert [name for name, _ in state.sparse] == ["2.bias"]
    assert state.metrics["numel"] == default.numel()
    assert state.metrics["dense_numel"] == default.numel() - 4
    assert state.metrics["target"] == state.metrics["union_size"] == 4  # K/k: the method's
    assert torch.allclose(hooked, default, rtol=1e-5, atol=1e-6)
    state, _ = _train(rank, 1, "topk", min_numel=100, density=0.5)
    assert [name for name, _ in state.sparse] == ["0.weight", "2.weight"]


def test_excluded_layers_are_averaged_densely(run_world):
    run_world(2, _excluded_layers_are_averaged_densely)


def _nonfinite_dense_group(rank, world, nonfinite, selection):
    """A NaN in an excluded (densely averaged) tensor on one rank: the dense
    group checks it like the method's groups do, and the whole step is
    skipped or stopped on every rank; on the host and on the device path."""
    model = DDP(_model())
    state = sparsecomm.register(model, "topk", density=0.5, min_numel=100, nonfinite=nonfinite,
                                selection=selection)
    if rank == 0:
        model.module[2].bias.register_hook(lambda g: g * float("nan"))
    x, y = _batches(rank, 1)[0]
    loss = torch.nn.functional.cross_entropy(model(x), y)
    if nonfinite == "stop":
        with pytest.raises(sparsecomm.HookError, match="exchange failed at step 0"):
            loss.backward()
        return
    loss.backward()
    assert state.metrics["skipped_nonfinite"]
    assert state.metrics["dense_numel"] == 32 + 4  # the two biases
    for name, parameter in model.named_parameters():
        assert torch.count_nonzero(parameter.grad) == 0, name


@pytest.mark.parametrize("selection", ["host", "device"])
@pytest.mark.parametrize("nonfinite", ["skip", "stop"])
def test_a_nonfinite_excluded_tensor_skips_or_stops_the_whole_step(run_world, nonfinite,
                                                                   selection):
    run_world(2, _nonfinite_dense_group, nonfinite, selection)


def _sparse_steps_send_their_density(rank, world):
    state, _ = _train(rank, 3, "topk", density=0.05)
    assert 0 < state.metrics["selected"] <= state.metrics["target"] < state.metrics["numel"]
    assert state.metrics["bytes_sent"] > 0


def test_topk_selects_its_density(run_world):
    run_world(2, _sparse_steps_send_their_density)


def _bad_settings(rank, world):
    model = _model()
    with pytest.raises(ValueError, match="topk"):  # the message lists the valid names
        sparsecomm.ddp_comm_hook(model, "top-k")
    with pytest.raises(ValueError, match="density"):
        sparsecomm.ddp_comm_hook(model, "topk", density=2.0)
    with pytest.raises(ValueError, match="no_such_option"):
        sparsecomm.ddp_comm_hook(model, "topk", no_such_option=1)
    with pytest.raises(ValueError, match="no tensor of the DDP model to sparsify"):
        sparsecomm.ddp_comm_hook(model, "topk", exclude="*")
    with pytest.raises(ValueError, match="exclude pattern 'nosuch' matches no tensor"):
        sparsecomm.ddp_comm_hook(model, "topk", exclude="nosuch")
    with pytest.raises(ValueError, match="bucket_mb"):
        sparsecomm.ddp_comm_hook(model, "topk", bucket_mb=0)
    with pytest.raises(ValueError, match="whole model"):  # a global scheme
        sparsecomm.ddp_comm_hook(model, "exdyna", bucket_mb=1)


def test_bad_methods_and_options_raise_value_errors(run_world):
    run_world(2, _bad_settings)


def test_without_a_process_group_the_hook_says_what_to_do():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        sparsecomm.ddp_comm_hook(_model(), "topk")


def _update_direction_at_density_one(rank, world):
    """compress="update" at density 1 on one group: the parameters move by
    the mean over ranks of each rank's AdamW direction, computed here with
    torch's own AdamW on each rank's gradient (lr 1, no weight decay: its
    step is minus the direction)."""
    batches = _batches(rank, 4)
    model = DDP(_model(), bucket_cap_mb=0.001)
    state = sparsecomm.register(model, "topk", density=1.0, compress="update", betas=(0.9, 0.99))
    optimizer = sparsecomm.direction_optimizer(model.parameters(), lr=0.01, weight_decay=0.0,
                                               hook=state)
    # The reference: a plain copy of the model, a local AdamW per rank for the
    # direction, and an all-reduce of the directions.
    reference = _model()
    probe = _model()
    local = torch.optim.AdamW(probe.parameters(), lr=1.0, betas=(0.9, 0.99), weight_decay=0.0)
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        # Reference: the gradient at the reference parameters, through torch's AdamW.
        reference.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        with torch.no_grad():
            for p, q in zip(probe.parameters(), reference.parameters()):
                p.copy_(q)
                p.grad = q.grad.clone()
        before = [p.detach().clone() for p in probe.parameters()]
        local.step()
        with torch.no_grad():
            for p, q, b in zip(reference.parameters(), probe.parameters(), before):
                direction = b - q  # lr 1: the step is minus the direction
                dist.all_reduce(direction)
                p -= 0.01 * direction / world
    assert torch.allclose(_parameters(model), _parameters(reference), rtol=1e-4, atol=1e-6), (
        _parameters(model) - _parameters(reference)).abs().max()


def test_compressing_the_update_sends_each_ranks_adamw_direction(run_world):
    run_world(2, _update_direction_at_density_one)


def _direction_resume(rank, method, **options):
    """Six steps of a hook that hands DDP a direction, whole and stopped
    after three then resumed from the model's, the hook's and the
    optimizer's state dicts; (resumed model, whole model, the hook's saved
    state)."""
    batches = _batches(rank, 6)

    def fresh():
        model = DDP(_model(), bucket_cap_mb=0.001)
        state = sparsecomm.register(model, method, **options)
        return model, state, sparsecomm.direction_optimizer(model.parameters(), lr=0.01,
                                                            hook=state)

    whole, _, optimizer = fresh()
    _run(whole, optimizer, batches)
    first, state, optimizer = fresh()
    _run(first, optimizer, batches[:3])
    saved = (first.state_dict(), state.state_dict(), optimizer.state_dict())
    resumed, state, optimizer = fresh()
    resumed.load_state_dict(saved[0])
    state.load_state_dict(saved[1])
    optimizer.load_state_dict(saved[2])
    _run(resumed, optimizer, batches[3:])
    return resumed, whole, saved[1]


def _update_resume_is_exact(rank, world):
    resumed, whole, saved = _direction_resume(rank, "topk", density=0.05, compress="update",
                                              min_numel=50)
    assert torch.equal(_parameters(resumed), _parameters(whole))
    plain = sparsecomm.ddp_comm_hook(resumed, "topk", density=0.05, min_numel=50)[0]
    with pytest.raises(ValueError, match="compress"):
        plain.load_state_dict(saved)


def test_a_compressed_update_resumes_bit_for_bit(run_world):
    run_world(2, _update_resume_is_exact)


def _bad_update_settings(rank, world):
    model = DDP(_model())
    with pytest.raises(ValueError, match="compress='momentum'"):
        sparsecomm.ddp_comm_hook(model, "topk", compress="momentum")
    with pytest.raises(ValueError, match="beta1"):
        sparsecomm.ddp_comm_hook(model, "topk", compress="update", betas=(1.5, 0.999))
    with pytest.raises(ValueError, match="memory='ef'"):
        sparsecomm.ddp_comm_hook(model, "dgc", compress="update")


def test_bad_update_settings_raise_value_errors(run_world):
    run_world(2, _bad_update_settings)


def _demo_steps_by_signs(rank, world):
    """DeMo through the hook: every coordinate moves by lr times the sign of
    the ranks' mean (weight decay 0), the replicas agree, and the step's
    bytes are the chunks' entries."""
    model = DDP(_model())
    state = sparsecomm.register(model, "demo", chunk=16, topk=2)
    optimizer = sparsecomm.direction_optimizer(model.parameters(), lr=0.01, weight_decay=0.0,
                                               hook=state)
    for x, y in _batches(rank, 3):
        before = _parameters(model)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        moved = (_parameters(model) - before).abs()
        assert torch.all(((moved - 0.01).abs() < 1e-6) | (moved == 0)), moved
        assert (moved > 0).float().mean() > 0.9  # the IDCT of a chunk's few entries is dense
    replicas = [torch.empty_like(_parameters(model)) for _ in range(world)]
    dist.all_gather(replicas, _parameters(model))
    assert all(torch.equal(r, replicas[0]) for r in replicas)
    numel = _parameters(model).numel()
    entries = sum(min(2, min(16, p.numel() - at)) for p in model.parameters()
                  for at in range(0, p.numel(), 16))
    assert state.metrics["selected"] == entries and state.metrics["numel"] == numel
    # fp32 values and 4-bit positions, to the other rank
    assert state.metrics["bytes_sent"] == (4 * entries + (4 * entries + 7) // 8) * (world - 1)


def test_demo_steps_every_coordinate_by_the_sign_of_the_mean(run_world):
    run_world(2, _demo_steps_by_signs)


def _demo_pairing(rank, world):
    model = DDP(_model())
    state = sparsecomm.register(model, "demo")
    with pytest.raises(ValueError, match="AdamW would rescale"):
        state.pair(torch.optim.AdamW(model.parameters(), lr=1e-3))
    with pytest.raises(ValueError, match="momentum=0.9 would add momentum"):
        state.pair(torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))
    with pytest.raises(ValueError, match="does not step 2.weight, 2.bias"):
        state.pair(torch.optim.SGD(list(model.parameters())[:2], lr=1e-3))
    with pytest.raises(ValueError, match="Muon would rescale"):
        state.pair(sparsecomm.muon_optimizer(model, lr=1e-3))
    # Never paired: the first backward says how to pair.
    x, y = _batches(rank, 1)[0]
    with pytest.raises(sparsecomm.HookError, match="no optimizer was paired"):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(ValueError, match="drop exclude and min_numel"):
        sparsecomm.ddp_comm_hook(DDP(_model()), "demo", min_numel=50)
    with pytest.raises(ValueError, match="leave compress unset"):
        sparsecomm.ddp_comm_hook(DDP(_model()), "demo", compress="update")
    # A hook that hands DDP a gradient takes any optimizer.
    other = DDP(_model())
    plain = sparsecomm.ddp_comm_hook(other, "topk")[0]
    adamw = torch.optim.AdamW(other.parameters(), lr=1e-3)
    assert plain.pair(adamw) is adamw
    muon = sparsecomm.muon_optimizer(other, lr=1e-3)
    assert plain.pair(muon) is muon


def test_demo_refuses_an_optimizer_that_does_not_pair(run_world):
    run_world(2, _demo_pairing)


def _demo_resume_is_exact(rank, world):
    resumed, whole, _ = _direction_resume(rank, "demo", chunk=8, values="int8-sr", momentum=0.9)
    assert torch.equal(_parameters(resumed), _parameters(whole))


def test_demo_resumes_bit_for_bit(run_world):
    run_world(2, _demo_resume_is_exact)


def _ef21_at_density_one_matches_default(rank, world):
    """memory="ef21" through the hook: at density 1 each rank's estimate is its
    gradient, so the hook hands DDP the plain mean (any optimizer, AdamW here)."""
    def train(**options):
        model = DDP(_model(), bucket_cap_mb=0.001)
        if options:
            sparsecomm.register(model, "topk", **options)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        _run(model, optimizer, _batches(rank, 4))
        return _parameters(model)

    default = train()
    hooked = train(density=1.0, memory="ef21")
    assert torch.allclose(hooked, default, rtol=1e-4, atol=1e-6), (hooked - default).abs().max()


def test_ef21_through_the_hook_at_density_one_gives_the_default(run_world):
    run_world(2, _ef21_at_density_one_matches_default)


def _powersgd_factors_the_matrices(rank, world):
    # 20x32 and 32x4 weights at rank 1: (32 + 20) + (4 + 32) floats of
    # factors, the biases (32 + 4) whole.
    model = DDP(_model())
    state = sparsecomm.register(model, "powersgd", rank=1)  # (rank: the factors' rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _run(model, optimizer, _batches(rank, 3))
    hooked = _parameters(model)
    assert state.metrics["numel"] == 20 * 32 + 32 + 32 * 4 + 4
    assert state.metrics["selected"] == (32 + 20) + (4 + 32) + 32 + 4
    assert torch.isfinite(hooked).all()
    # Every rank applied the same update.
    gathered = [torch.empty_like(hooked) for _ in range(world)]
    torch.distributed.all_gather(gathered, hooked)
    assert all(torch.equal(g, hooked) for g in gathered)


def test_powersgd_factors_the_matrices_over_gloo(run_world):
    run_world(2, _powersgd_factors_the_matrices)
