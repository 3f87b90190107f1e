"""Time to accuracy from Python (docs/python.md, "Choosing the density"):
the density a convergence profile and the performance model predict to
reach a target soonest on a given network, as the CLI's ``train --density
auto`` chooses it (docs/algorithms.md, "Time to accuracy")."""

import torch.distributed as dist

from ._sparsecomm import _choose_configuration


def choose_density(convergence, model, method="exdyna", *, link_gbit, latency_us=5.0,
                   target_loss=None, target_accuracy=None, world_size=None, local_steps=0,
                   options=""):
    """The configuration to train ``model`` with, as a dict: ``method``,
    ``density``, ``configuration`` (its label), the profile's ``steps`` to
    the target, the predicted ``step_s`` and ``time_s``.

    ``convergence``: a profile of pilot runs (``sparsecomm convergence``);
    one of ``target_loss`` (held-out loss at or below) and
    ``target_accuracy`` (percent, at or above); ``link_gbit`` and
    ``latency_us``: the network. ``method=None`` chooses among every method
    of the profile. ``options``: the configuration's options as the profile
    labels them (``"decay=0.95,memory=ef"``; "" for the defaults). The
    world size defaults to the process group's (else the profile's). A
    profile without a configuration that reached the target on every seed
    raises ``ValueError``."""
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if numel == 0:
        raise ValueError("sparsecomm: the model has no parameter that requires grad")
    if world_size is None:
        world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 0
    return _choose_configuration(convergence, method or "", target_loss, target_accuracy,
                                 float(link_gbit), float(latency_us), int(world_size),
                                 float(numel), int(local_steps), options)
