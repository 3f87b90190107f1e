"""Time to accuracy from Python (docs/python.md, "Choosing the density"):
pilot runs of one's own loop recorded as a convergence profile, and the
density a profile and the performance model predict to reach a target
soonest on a given network, as the CLI's ``train --density auto`` chooses
it (docs/algorithms.md, "Time to accuracy")."""

import json
import math
import os
import tempfile

import torch.distributed as dist

from ._sparsecomm import _check_convergence_profile, _choose_configuration


class PilotRun:
    """One pilot run of a loop of one's own, for a convergence profile: its
    configuration and its held-out evaluations.

    ``method`` and ``density`` as the hook takes them (``"dense"`` with
    density 1); ``steps``: the run's length; ``local_steps``: rounds of
    ``LocalSteps`` (0: every step synchronizes); ``options``: what else
    sets the configuration apart, as ``"key=value,..."`` ("" for the
    defaults)."""

    def __init__(self, method, density=1.0, *, seed, steps, local_steps=0, options=""):
        self.method = method
        self.density = float(density)
        self.seed = int(seed)
        self.steps = int(steps)
        self.local_steps = int(local_steps)
        self.options = options
        self.curve = []

    def record(self, step, *, test_loss, test_accuracy=None):
        """An evaluation after ``step`` steps: the held-out loss, and the
        accuracy as a fraction in [0, 1] (None when the model has none)."""
        def number(value):
            return None if value is None or not math.isfinite(value) else float(value)
        self.curve.append([int(step), number(test_loss), number(test_accuracy)])

    def _json(self):
        return {"method": self.method, "density": self.density, "local_steps": self.local_steps,
                "overlap": False, "options": self.options, "seed": self.seed,
                "steps": self.steps, "curve": self.curve}


def write_convergence_profile(path, runs, *, model, ranks, batch, compute_s, schedule="",
                              source="sparsecomm.write_convergence_profile"):
    """Writes the pilot runs ``runs`` (``PilotRun``) of the model named
    ``model`` as the profile ``plan --convergence``, ``train --density
    auto`` and ``choose_density`` read: ``ranks`` and ``batch`` (per rank)
    of every run, ``compute_s``, the median forward + backward of a step.
    The file is checked as they check it (a ``ValueError`` names the field)
    and replaced atomically."""
    profile = {"format": "sparsecomm convergence profile", "version": 1, "model": model,
               "ranks": int(ranks), "batch": int(batch), "compute_s": float(compute_s),
               "schedule": schedule, "source": source, "runs": [run._json() for run in runs]}
    text = json.dumps(profile, indent=1)
    _check_convergence_profile(text, os.fspath(path))
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".convergence-")
    try:
        with os.fdopen(handle, "w") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def choose_density(convergence, model, method="exdyna", *, link_gbit=None, latency_us=5.0,
                   network_profile=None, target_loss=None, target_accuracy=None, world_size=None,
                   local_steps=0, options="", compute_s=None):
    """The configuration to train ``model`` with, as a dict: ``method``,
    ``density``, ``options`` (as the profile labels them), ``configuration``
    (its label), the profile's ``steps`` to the target, the predicted
    ``step_s`` and ``time_s``.

    ``convergence``: a profile of pilot runs (``sparsecomm convergence``);
    one of ``target_loss`` (held-out loss at or below) and
    ``target_accuracy`` (percent, at or above); the network: ``link_gbit``
    and ``latency_us``, or ``network_profile``, the cost profile
    ``sparsecomm calibrate`` measured on the cluster; ``compute_s``: the
    step's forward + backward there (default: the pilots'). ``method=None`` chooses among every method
    of the profile, each configuration with its own options. ``options``
    (with a method named): the configuration's options as the profile
    labels them (``"decay=0.95,memory=ef"``; "" for the defaults). The
    world size defaults to the process group's (else the profile's). A
    profile without a configuration that reached the target on every seed
    raises ``ValueError``."""
    if (link_gbit is None) == (network_profile is None):
        raise ValueError("choose_density: give the network as link_gbit (and latency_us) or as "
                         "network_profile (from `sparsecomm calibrate`), not both or neither")
    if compute_s is not None and not (compute_s > 0 and math.isfinite(compute_s)):
        raise ValueError(f"choose_density: compute_s must be a time > 0 in seconds, got {compute_s}")
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if numel == 0:
        raise ValueError("sparsecomm: the model has no parameter that requires grad")
    if world_size is None:
        world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 0
    return _choose_configuration(convergence, method or "", target_loss, target_accuracy,
                                 float(link_gbit or 0.0), float(latency_us),
                                 os.fspath(network_profile) if network_profile else "",
                                 None if compute_s is None else float(compute_s),
                                 int(world_size), float(numel), int(local_steps), options)
