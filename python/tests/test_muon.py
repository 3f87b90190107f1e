"""Muon for the hook's users (sparsecomm/muon.py): the orthogonalization,
one step against its formula, the AdamW half against torch.optim.AdamW,
and how muon_optimizer splits a model."""

import math

import pytest
import torch

import sparsecomm
from sparsecomm.muon import orthogonalize


def test_orthogonalize_pushes_every_singular_value_near_one():
    torch.manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(20, 20))
    v, _ = torch.linalg.qr(torch.randn(50, 20))
    spread = torch.logspace(0, -2, 20)  # singular values from 1 to 0.01
    matrix = u @ torch.diag(spread) @ v.t()
    for m in (matrix, matrix.t()):
        singular = torch.linalg.svdvals(orthogonalize(m))
        assert singular.min() > 0.6 and singular.max() < 1.25, singular
    with pytest.raises(ValueError, match="matrix"):
        orthogonalize(torch.ones(3))


def test_a_muon_step_is_the_scaled_orthogonalized_gradient():
    torch.manual_seed(1)
    w = torch.nn.Parameter(torch.randn(6, 9))
    w0 = w.detach().clone()
    w.grad = torch.randn(6, 9)
    optimizer = sparsecomm.Muon([{"params": [w], "muon": True}], lr=0.01, weight_decay=0.1,
                                momentum=0.0, nesterov=False)
    optimizer.step()
    expected = w0 * (1 - 0.01 * 0.1) - 0.01 * 0.2 * math.sqrt(9) * orthogonalize(w.grad)
    assert torch.allclose(w.detach(), expected, atol=1e-6)


def test_the_other_group_steps_as_torch_adamw():
    torch.manual_seed(2)
    a = torch.nn.Parameter(torch.randn(5))
    b = torch.nn.Parameter(a.detach().clone())
    ours = sparsecomm.Muon([{"params": [a], "muon": False}], lr=0.02, weight_decay=0.1,
                           betas=(0.9, 0.99))
    reference = torch.optim.AdamW([b], lr=0.02, weight_decay=0.1, betas=(0.9, 0.99))
    for step in range(5):
        g = torch.randn(5, generator=torch.Generator().manual_seed(step))
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        reference.step()
    assert torch.allclose(a, b, atol=1e-6)


class _Tiny(torch.nn.Module):
    def __init__(self, tied):
        super().__init__()
        self.embedding = torch.nn.Embedding(11, 8)
        self.hidden = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.out = torch.nn.Linear(8, 11, bias=False)
        if tied:
            self.out.weight = self.embedding.weight


@pytest.mark.parametrize("tied", [False, True])
def test_muon_optimizer_gives_the_ends_and_the_vectors_to_adamw(tied):
    model = _Tiny(tied)
    optimizer = sparsecomm.muon_optimizer(model, lr=1e-3)
    muon, rest = optimizer.param_groups
    assert muon["muon"] and not rest["muon"]
    assert [id(p) for p in muon["params"]] == [id(model.hidden.weight)]
    expected_rest = {id(model.embedding.weight), id(model.hidden.bias), id(model.norm.weight),
                     id(model.norm.bias), id(model.out.weight)}
    assert {id(p) for p in rest["params"]} == expected_rest
    assert len(rest["params"]) == len(expected_rest)  # a tied weight once


def test_bad_groups_and_options_are_refused():
    with pytest.raises(ValueError, match="matrices"):
        sparsecomm.Muon([{"params": [torch.nn.Parameter(torch.ones(3))], "muon": True}], lr=0.1)
    with pytest.raises(ValueError, match="momentum"):
        sparsecomm.Muon([torch.nn.Parameter(torch.ones(3, 3))], lr=0.1, momentum=1.0)
    with pytest.raises(ValueError, match="no hidden matrix"):
        sparsecomm.muon_optimizer(torch.nn.Linear(3, 2), lr=0.1)
