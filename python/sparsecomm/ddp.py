"""DDP communication hooks (torch 1.13's ``register_comm_hook``).

Design (docs/python.md, "DDP hooks"): the hook synchronizes the whole
model at once, not bucket by bucket. DDP calls it once per bucket, in
bucket order, with the bucket's flattened gradients; the hook answers the
first buckets with futures it leaves pending, and at the last bucket
gathers every parameter's gradient in the model's parameter order (a
layout DDP's bucket rebuild after the first iteration cannot change),
runs one sparsified exchange over it, writes the averages back into the
buckets and completes all the futures. DDP waits for the futures only
after backward, so nothing blocks. Consequences:

- the scheme's state (residuals, density controller, partitions) belongs
  to the model's parameters, so ``state_dict()`` / ``load_state_dict()``
  resume exactly, whatever buckets the new DDP builds;
- a global scheme (ExDyna, MiCRO) partitions the whole model, as the CLI
  does without ``--bucket-mb``;
- the exchange does not overlap the backward pass (the CLI's pipelined
  buckets do; not built here yet).

Parameters excluded from sparsification (``exclude`` name patterns,
``min_numel``) are averaged by a dense ring all-reduce in the same hook.
"""

import fnmatch
import json

import torch
import torch.distributed as dist

from ._sparsecomm import Communicator, Synchronizer, allreduce


def _option_text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _plain_name(name):
    """A DDP-wrapped model's names start with 'module.'; matching uses the
    inner model's names."""
    return name[len("module."):] if name.startswith("module.") else name


class HookState:
    """What the hook keeps between steps. ``metrics`` holds the last step's
    figures (a dict: K/k, imbalance, bytes, time per phase; see
    docs/python.md); set ``epoch`` each epoch for schemes whose schedule
    depends on it (DGC's warm-up)."""

    def __init__(self, model, method, group=None, nonfinite="stop", exclude=(), min_numel=0,
                 **options):
        if group is None:
            if not dist.is_initialized():
                raise RuntimeError(
                    "sparsecomm: torch.distributed is not initialized; call "
                    "torch.distributed.init_process_group('gloo', ...) first, or pass group=")
            group = dist.distributed_c10d._get_default_group()
        if isinstance(exclude, str):
            exclude = (exclude,)
        self.comm = Communicator(group)
        self.method = method
        self.options = {key: _option_text(value) for key, value in options.items()}
        self.sparse, self.dense = [], []
        for name, parameter in model.named_parameters():
            if not parameter.requires_grad:
                continue
            name = _plain_name(name)
            excluded = parameter.numel() < min_numel or any(
                fnmatch.fnmatchcase(name, pattern) for pattern in exclude)
            (self.dense if excluded else self.sparse).append((name, parameter))
        if not self.sparse:
            raise ValueError(
                f"sparsecomm: exclude={list(exclude)!r} and min_numel={min_numel} leave no "
                "parameter to sparsify; exclude fewer")
        # Builds the scheme now, so a bad method or option raises ValueError
        # here rather than inside backward.
        self.synchronizer = Synchronizer(self.comm, method, self.options, nonfinite)
        # DGC's momentum correction (memory=momentum) applies momentum in
        # the hook: the optimizer must then run without it.
        self.applies_momentum = self.synchronizer.applies_momentum
        self.step = 0
        self.epoch = 0.0
        self.metrics = None
        self._pending = []  # (bucket, future) of this step's buckets so far
        # The flat gradients, allocated once: a fresh tensor of the model's
        # size every step costs its page faults every step (0.25 s for the
        # wide MLP's 74 MB on a VM here, more than its forward and backward).
        self._flat = {}

    def state_dict(self):
        """Everything the next steps depend on: the scheme's state (residuals,
        thresholds, partitions) and the step counter."""
        return {"method": self.method, "options": dict(self.options), "step": self.step,
                "epoch": self.epoch, "sparse": [name for name, _ in self.sparse],
                "synchronizer": self.synchronizer.state()}

    def load_state_dict(self, state):
        """Restores a state_dict() of the same method, options and parameters
        (ValueError naming the difference otherwise)."""
        for key, mine in (("method", self.method), ("options", self.options),
                          ("sparse", [name for name, _ in self.sparse])):
            if state.get(key) != mine:
                raise ValueError(f"sparsecomm: the saved hook state has {key} "
                                 f"{state.get(key)!r}, this hook {mine!r}")
        self.synchronizer.load_state(state["synchronizer"])
        self.step = state["step"]
        self.epoch = state["epoch"]

    def _synchronize(self):
        gradients = {}
        for bucket, _ in self._pending:
            for parameter, gradient in zip(bucket.parameters(), bucket.gradients()):
                gradients[id(parameter)] = gradient
        views = [gradients[id(p)] for _, p in self.sparse]
        flat = self._flatten("sparse", views)
        self.metrics = json.loads(self.synchronizer.synchronize(flat, self.step, self.epoch))
        _scatter(flat, views)
        if self.dense:
            views = [gradients[id(p)] for _, p in self.dense]
            flat = self._flatten("dense", views)
            allreduce(self.comm, flat)
            flat /= self.comm.size
            _scatter(flat, views)
        for bucket, future in self._pending:
            future.set_result(bucket.buffer())
        self._pending.clear()
        self.step += 1

    def _flatten(self, part, views):
        """The views' values, in order, in this part's persistent buffer."""
        numel = sum(v.numel() for v in views)
        flat = self._flat.get(part)
        if flat is None or flat.numel() != numel:
            flat = self._flat[part] = torch.empty(numel, dtype=views[0].dtype)
        torch.cat([v.reshape(-1) for v in views], out=flat)
        return flat


def _scatter(flat, views):
    offset = 0
    for view in views:
        view.copy_(flat[offset:offset + view.numel()].view_as(view))
        offset += view.numel()


def _hook(state, bucket):
    future = torch.futures.Future()
    state._pending.append((bucket, future))
    if bucket.is_last():
        try:
            state._synchronize()
        except Exception as error:  # every pending future fails, not only the last
            for _, pending in state._pending:
                pending.set_exception(error)
            state._pending.clear()
    return future


def ddp_comm_hook(model, method, group=None, nonfinite="stop", exclude=(), min_numel=0,
                  **options):
    """(state, hook) for ``model.register_comm_hook(state, hook)``.

    ``model``: the DDP model (or the module it wraps); ``method``: a scheme
    name (``sparsecomm.methods()``); ``options``: the CLI's ``-o`` options
    (density=0.01, exchange=..., values=bf16, ...); ``exclude``: parameter
    name patterns (fnmatch, e.g. ``"fc2.*"``) and ``min_numel``: a size
    below which a parameter is averaged densely instead. Raises ValueError
    for an unknown method or option."""
    return HookState(model, method, group, nonfinite, exclude, min_numel, **options), _hook


def register(model, method, **kwargs):
    """Registers the hook on the DDP model and returns its state."""
    state, hook = ddp_comm_hook(model, method, **kwargs)
    model.register_comm_hook(state, hook)
    return state
