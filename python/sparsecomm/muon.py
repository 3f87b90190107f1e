"""Muon for the hook's users (docs/python.md, "Muon"): the optimizer of the
CLI's ``--optimizer muon`` (src/sparsecomm/optim/muon.h) in torch.

Each hidden matrix steps on its orthogonalized momentum, scaled so that the
update has about AdamW's RMS (AdamW's learning rate and weight decay carry
over); embedding tables, the output layer, biases and norms step with AdamW:

    M = mu M + (1 - mu) G;  U = (1 - mu) G + mu M  (Nesterov)
    W -= lr wd W;  W -= lr 0.2 sqrt(max(rows, cols)) NS(U)

NS is five Newton-Schulz iterations (newton_schulz.h). It pairs with every
hook that hands DDP an average gradient (dense, the sparsifiers, the
quantizers, PowerSGD); a hook that hands a direction (demo,
compress="update") steps with ``direction_optimizer`` instead.
"""

import math

import torch

_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalize(matrix, steps=5):
    """The Newton-Schulz orthogonalization of a 2-D tensor (float32)."""
    if matrix.dim() != 2:
        raise ValueError(
            f"orthogonalize takes a matrix, not a tensor of shape {tuple(matrix.shape)}")
    a, b, c = _COEFFICIENTS
    x = matrix.float()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.t()
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        gram = x @ x.t()
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.t() if tall else x


class Muon(torch.optim.Optimizer):
    """Muon on the groups with ``muon=True`` (tensors of two or more
    dimensions, seen as rows x the rest), AdamW on the others. Build it with
    ``muon_optimizer`` to split a model the CLI's way."""

    def __init__(self, params, lr, weight_decay=0.01, momentum=0.95, nesterov=True, ns_steps=5,
                 betas=(0.9, 0.999), eps=1e-8):
        if not lr > 0:
            raise ValueError(f"Muon: learning rate {lr} must be > 0")
        if not 0 <= momentum < 1:
            raise ValueError(f"Muon: momentum {momentum} must lie in [0, 1)")
        if ns_steps < 1:
            raise ValueError(
                f"Muon: {ns_steps} Newton-Schulz iterations: need at least 1 (5 is Muon's)")
        if weight_decay < 0:
            raise ValueError(f"Muon: weight decay {weight_decay} must be >= 0")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_steps=ns_steps, betas=betas, eps=eps, muon=False)
        super().__init__(params, defaults)
        for group in self.param_groups:
            if group["muon"]:
                flat = [p for p in group["params"] if p.dim() < 2]
                if flat:
                    raise ValueError(
                        f"Muon: a muon=True group holds a tensor of shape {tuple(flat[0].shape)}; "
                        "orthogonalization needs matrices: put vectors in a muon=False group "
                        "(muon_optimizer splits a model for you)")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if group["muon"]:
                    self._muon_step(p, state, group, lr, wd)
                else:
                    self._adamw_step(p, state, group, lr, wd)
        return loss

    @staticmethod
    def _muon_step(p, state, group, lr, wd):
        mu = group["momentum"]
        g = p.grad.reshape(p.shape[0], -1)
        if "momentum" not in state:
            state["momentum"] = torch.zeros_like(g)
        buffer = state["momentum"]
        buffer.mul_(mu).add_(g, alpha=1 - mu)
        update = g * (1 - mu) + buffer * mu if group["nesterov"] else buffer
        update = orthogonalize(update, group["ns_steps"]).to(p.dtype)
        p.mul_(1 - lr * wd)
        p.add_(update.view_as(p), alpha=-lr * 0.2 * math.sqrt(max(g.shape)))

    @staticmethod
    def _adamw_step(p, state, group, lr, wd):
        b1, b2 = group["betas"]
        if "step" not in state:
            state["step"] = 0
            state["m"] = torch.zeros_like(p)
            state["v"] = torch.zeros_like(p)
        state["step"] += 1
        t = state["step"]
        m, v = state["m"], state["v"]
        p.mul_(1 - lr * wd)
        m.mul_(b1).add_(p.grad, alpha=1 - b1)
        v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
        denominator = (v / (1 - b2 ** t)).sqrt_().add_(group["eps"])
        p.addcdiv_(m, denominator, value=-lr / (1 - b1 ** t))


def muon_optimizer(model, lr, weight_decay=0.01, **options):
    """Muon for ``model`` (pass a DDP model's ``.module``), split as the CLI
    splits its models: the weights of linear, convolution and recurrent
    layers are matrices; embedding tables and the last linear layer (the
    output, unless it shares its weight with an embedding) go to AdamW with
    every vector. Other options: those of ``Muon``."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    ends = set()
    last_linear = None
    for module in model.modules():
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            ends.add(id(module.weight))
        if isinstance(module, torch.nn.Linear):
            last_linear = module
    if last_linear is not None and id(last_linear.weight) not in ends:
        ends.update(id(p) for p in last_linear.parameters())
    matrices, rest, seen = [], [], set()
    for p in model.parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        (rest if p.dim() < 2 or id(p) in ends else matrices).append(p)
    if not matrices:
        raise ValueError("muon_optimizer: the model has no hidden matrix to orthogonalize; "
                         "use torch.optim.AdamW")
    groups = [{"params": matrices, "muon": True}]
    if rest:
        groups.append({"params": rest, "muon": False})
    return Muon(groups, lr=lr, weight_decay=weight_decay, **options)
