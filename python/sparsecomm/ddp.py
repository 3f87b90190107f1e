"""DDP communication hooks (torch 1.13's ``register_comm_hook``).

Design (docs/python.md, "DDP hooks"). The hook exchanges *groups* of
parameters that it fixes when it is made, never DDP's buckets, which DDP
rebuilds after the first iteration:

- ``bucket_mb=None`` (the default): one group of every sparsified
  parameter in the model's order, so a global scheme (ExDyna, MiCRO)
  partitions the whole model as the CLI does without ``--bucket-mb``.
- ``bucket_mb=X``: groups of whole parameters closed once they hold X MB
  or more, formed from the last parameter back (the order backward
  produces gradients), each with its own scheme instance: the CLI's
  ``--bucket-mb`` rule, called from C++. Only for schemes that may run in
  pieces (not ExDyna or MiCRO).

DDP calls the hook once per bucket, in bucket order, on every rank alike.
The hook notes the bucket's gradients and hands every group they complete,
in group order (so all ranks exchange in the same order), to its worker
(C++ ``_HookWorker``, python/src/exchange_worker.h): it gathers the
group's gradients into a flat buffer kept between steps, and the worker
runs the exchange on a thread of its own while backward goes on
(``overlap=True``; ``overlap=False`` runs it on backward's thread, with
the same results), writes the averages back into the buckets' gradients
and completes a bucket's future once every group it touches is done. DDP
waits for the futures after backward. Because the state (residuals,
density controller, partitions) belongs to groups of named parameters,
``state_dict()`` / ``load_state_dict()`` resume exactly whatever buckets a
new DDP builds. Nothing Python runs on the worker but the making of a
failed exchange's ``HookError``.

Hooks that hand DDP a step direction rather than a gradient need an
optimizer that applies it as it is, ``p -= lr * (u + wd * p)`` (SGD without
momentum: ``direction_optimizer()`` makes one and pairs it):

- ``compress="update"`` (AdamW; docs/algorithms.md, "Optimizers and
  compression"): each group keeps this rank's AdamW moments (C++
  ``UpdateDirection``) and the method synchronizes the direction AdamW
  would apply instead of the raw gradient;
- ``"demo"`` (docs/algorithms.md, "DeMo"): each rank's own momentum, the
  sign of the ranks' mean of its largest DCT components.

Their first backward fails with a ``HookError`` until ``pair()`` has
accepted the optimizer; ``pair()`` refuses one that would apply momentum
or Adam's scaling on top, or that misses parameters of the model.

Parameters excluded from sparsification (``exclude`` name patterns,
``min_numel``: the CLI's rule, called from C++) form their own groups, averaged by sparsecomm's dense ring
all-reduce, finiteness checked; a non-finite value in any group stops or
skips the whole step.
"""

import json
import math
import weakref

import torch
import torch.distributed as dist

from ._sparsecomm import (Communicator, DeviceSynchronizer, Synchronizer, UpdateDirection,
                          _fail_future, _HookTimeline, _HookWorker, dense_tensors,
                          device_methods, tensor_buckets)
from ._common import option_texts, process_group
from ._hosts import Hosts, ranks_per_host_of


class HookError(RuntimeError):
    """An exchange of the DDP hook failed: raised by ``backward()`` (DDP
    waits for the hook's futures there) at that step and at every later
    one, since the ranks no longer agree on where they are. The message
    names the step; ``__cause__`` is the error the exchange raised (a
    ``CommError``, a ``ValueError`` ...)."""




def _plain_name(name):
    """A DDP-wrapped model's names start with 'module.'; matching uses the
    inner model's names."""
    return name[len("module."):] if name.startswith("module.") else name


def _split(parameters, cap_bytes):
    """Runs of (name, parameter) as the CLI's --bucket-mb groups tensors (the
    C++ tensor_buckets): from the last parameter back, each closed once it
    holds cap_bytes or more, in that (backward) order; one run of all
    without a cap."""
    sizes = [parameter.numel() * parameter.element_size() for _, parameter in parameters]
    return [parameters[begin:end] for begin, end in tensor_buckets(sizes, cap_bytes or 0)]


def _selection_for(selection, method, named, compress, ranks_per_host=1):
    """Where the hook selects: 'host' (sparsecomm's C++ schemes, every
    method; a device's gradients cross to the host and back) or 'device'
    (on the gradients' own device, DeviceSynchronizer: ``device_methods()``);
    'auto' picks the device for gradients off the CPU where the method has
    a device path."""
    if selection not in ("auto", "host", "device"):
        raise ValueError(f"sparsecomm: selection={selection!r}: valid are 'auto', 'host' (the "
                         "C++ schemes, on the host) and 'device' (on the gradient's device)")
    devices = {parameter.device for _, parameter in named}
    if len(devices) > 1:
        raise ValueError(f"sparsecomm: the model's parameters are on {sorted(map(str, devices))}; "
                         "the hook takes a model on one device")
    on_cpu = next(iter(devices)).type == "cpu"
    if selection == "auto":
        device_path = (not on_cpu and method in device_methods() and compress == "gradient"
                       and ranks_per_host == 1)
        selection = "device" if device_path else "host"
    if selection == "device" and ranks_per_host != 1:
        raise ValueError("sparsecomm: ranks_per_host (two levels) runs on the host; use "
                         "selection='host'")
    if selection == "device" and compress == "update":
        raise ValueError("sparsecomm: compress='update' keeps the AdamW moments on the host; use "
                         "selection='host'")
    return selection


class _Group:
    """Parameters exchanged together, by one synchronizer (a sparsecomm
    method with its own state) or, for excluded parameters (synchronizer
    None), by `dense`: sparsecomm's dense ring, which checks finiteness too."""

    def __init__(self, parameters, synchronizer, dense=None, moments=None, owner=None,
                 takes_device=False):
        self.names = [name for name, _ in parameters]
        self.ids = [id(parameter) for _, parameter in parameters]
        self.layers = [parameter.numel() for _, parameter in parameters]  # DEFT's tensors
        # PowerSGD's matrices: each tensor as its first dimension x the rest.
        self.rows = [parameter.shape[0] if parameter.dim() >= 2 else 0
                     for _, parameter in parameters]
        self.synchronizer = synchronizer
        # Two levels: the Synchronizer that keeps the state (kept, state,
        # load_state) of what the worker runs; else the synchronizer itself.
        self.owner = owner if owner is not None else synchronizer
        # Two levels take the device's gradient themselves (no staging).
        self.takes_device = takes_device
        self.dense = dense
        self.moments = moments  # compress="update": this rank's AdamW moments
        self.flat = None  # the gathered gradients, made once
        self.staging = None  # host selection of a device's gradients: their CPU copy

    def flatten(self, views):
        numel = sum(v.numel() for v in views)
        if (self.flat is None or self.flat.numel() != numel or self.flat.dtype != views[0].dtype
                or self.flat.device != views[0].device):
            self.flat = torch.empty(numel, dtype=views[0].dtype, device=views[0].device)
        torch.cat([v.reshape(-1) for v in views], out=self.flat)
        return self.flat

    def staging_for(self, flat, selection):
        """The CPU buffer a host selection of a device's gradients runs on
        (pinned where CUDA is, for the copies); None on the CPU, and on two
        levels (their leader copies after the host's average)."""
        if selection != "host" or flat.device.type == "cpu" or self.takes_device:
            return None
        if self.staging is None or self.staging.numel() != flat.numel():
            self.staging = torch.empty(flat.numel(), dtype=flat.dtype,
                                       pin_memory=torch.cuda.is_available())
        return self.staging


class HookState:
    """What the hook keeps between steps. ``metrics`` holds the last step's
    figures (a dict: K/k, imbalance, bytes, time per phase; see
    docs/python.md); set ``epoch`` each epoch for schemes whose schedule
    depends on it (DGC's warm-up)."""

    def __init__(self, model, method, group=None, nonfinite="stop", exclude=(), min_numel=0,
                 bucket_mb=None, compress="gradient", betas=(0.9, 0.999), eps=1e-8,
                 overlap=True, selection="auto", ranks_per_host=1, timeline=None, **options):
        group = process_group(group)
        if isinstance(exclude, str):
            exclude = (exclude,)
        if bucket_mb is not None and not (isinstance(bucket_mb, (int, float))
                                          and math.isfinite(bucket_mb) and bucket_mb > 0):
            raise ValueError(f"sparsecomm: bucket_mb must be a positive number of MB (or None: "
                             f"the whole model at once), got {bucket_mb!r}")
        if compress not in ("gradient", "update"):
            raise ValueError(f"sparsecomm: compress={compress!r}: valid are 'gradient' and "
                             "'update' (each rank's AdamW direction)")
        if compress == "update":
            UpdateDirection(*betas, eps)  # ValueError for betas or eps out of range
        self.compress = compress
        self.method = method
        self.options = option_texts(options)
        named = [(_plain_name(name), parameter) for name, parameter in model.named_parameters()
                 if parameter.requires_grad]
        if not named:
            raise ValueError("sparsecomm: the model has no parameter that requires grad")
        if ranks_per_host == "auto":
            ranks_per_host = 0  # the C++ side detects the hosts from their names
        elif isinstance(ranks_per_host, bool) or not isinstance(ranks_per_host, int):
            raise ValueError(f"sparsecomm: ranks_per_host={ranks_per_host!r}: give the ranks each "
                             "host runs (an int) or 'auto' (from the ranks' host names)")
        self.selection = _selection_for(selection, method, named, compress, ranks_per_host)
        device_type = named[0][1].device.type
        hosts = None
        if self.selection == "host" and ranks_per_host != 1:
            ranks_per_host = ranks_per_host_of(group, ranks_per_host)
            if ranks_per_host > 1:
                if compress == "update" and device_type != "cpu":
                    raise ValueError("sparsecomm: compress='update' keeps the AdamW moments on "
                                     "the host, and two levels average a device's gradients on "
                                     "the device; use compress='gradient' or ranks_per_host=1")
                hosts = Hosts(group, ranks_per_host, device_type)
        self.ranks_per_host = ranks_per_host
        if self.selection == "host" and hosts is None and dist.get_backend(group) == "nccl":
            raise ValueError(
                f"sparsecomm: {method} selects on the host, whose exchange sends CPU tensors, "
                "which NCCL cannot carry; pass group=torch.distributed.new_group(backend='gloo') "
                "to the hook (DDP keeps its NCCL group), or use a method with a device path "
                f"({', '.join(device_methods())})")
        self.comm = Communicator(group) if self.selection == "host" and hosts is None else None
        # The CLI's rule (--min-numel, --exclude): ValueError for a pattern
        # that matches nothing or a rule that leaves nothing to sparsify.
        to_dense = dense_tensors([name for name, _ in named], [p.numel() for _, p in named],
                                 min_numel, list(exclude))
        sparse = [entry for entry, is_dense in zip(named, to_dense) if not is_dense]
        dense = [entry for entry, is_dense in zip(named, to_dense) if is_dense]
        self.sparse, self.dense = sparse, dense
        # Builds the scheme now, so a bad method or option raises ValueError
        # here rather than inside backward.
        # Each group's synchronizer: (what the worker runs, what keeps its state).
        if hosts is not None:
            def synchronizer(name, options):
                return hosts.synchronizer(name, options, nonfinite)
        elif self.selection == "host":
            def synchronizer(name, options):
                made = Synchronizer(self.comm, name, options, nonfinite)
                return made, made
        else:
            def synchronizer(name, options):
                made = DeviceSynchronizer(group, name, options, nonfinite)
                return made, made
        first, first_owner = synchronizer(method, self.options)
        if bucket_mb is not None and self.selection == "host" and not first_owner.bucketable:
            raise ValueError(
                f"sparsecomm: {method} selects over the whole model (its partitions and "
                "threshold span every parameter), so it cannot run per bucket; leave "
                "bucket_mb unset")
        # DGC's momentum correction (memory=momentum) applies momentum in
        # the hook: the optimizer must then run without it.
        self.applies_momentum = self.selection == "host" and first_owner.applies_momentum
        if compress == "update" and self.applies_momentum:
            owner, fix = (("its own decoupled momentum", "leave compress unset")
                          if method == "demo" else ("memory=momentum", "give memory='ef'"))
            raise ValueError(f"sparsecomm: {method} applies momentum itself ({owner}), which an "
                             f"AdamW direction cannot follow; {fix} or compress the gradient")
        # What the hook hands DDP: a step direction (DeMo's signs, the mean
        # AdamW direction) that only SGD without momentum applies as meant.
        self.hands_direction = compress == "update" or method == "demo"
        if method == "demo" and dense:
            raise ValueError(
                "sparsecomm: demo hands DDP signs, which densely averaged gradients would join "
                f"at another scale; drop exclude and min_numel (they excluded "
                f"{', '.join(name for name, _ in dense)})")
        self._paired = None  # the optimizer pair() accepted

        def moments():
            return UpdateDirection(*betas, eps) if compress == "update" else None
        cap = None if bucket_mb is None else max(1, int(bucket_mb * 1024 * 1024))
        self._groups = []
        for index, run in enumerate(_split(sparse, cap)):
            runs, owner = ((first, first_owner) if index == 0
                           else synchronizer(method, self.options))
            self._groups.append(_Group(run, runs, moments=moments(), owner=owner,
                                       takes_device=hosts is not None))
        self._groups += [_Group(run, None, synchronizer("dense", {})[0], moments(),
                                takes_device=hosts is not None)
                         for run in _split(dense, cap)]
        self._group_of = {pid: index for index, g in enumerate(self._groups) for pid in g.ids}
        self.step = 0
        self.epoch = 0.0
        self._metrics = None
        self._finished_order = []
        self._error = None  # the exception that ended the hook's exchanges
        # The worker holds only a weak reference back (no cycle to collect).
        this = weakref.ref(self)

        def on_error(cause, step):
            state = this()
            if state is None:
                return HookError(f"sparsecomm: the hook's exchange failed at step {step}: {cause}")
            return state._failed(cause, step)
        self._group = group
        self._timeline = None
        self.timeline = None if timeline is None else str(timeline)
        if self.timeline is not None:
            dist.barrier(group=group)  # the ranks' common origin
            self._timeline = _HookTimeline(self.timeline, dist.get_rank(group))
        self._worker = _HookWorker(bool(overlap), on_error, self._timeline)
        self._begin_step()

    def pair(self, optimizer):
        """Checks that ``optimizer`` steps on what this hook hands DDP, and
        returns it. With a direction (``compress="update"``, ``"demo"``) or
        the hook's own momentum (``memory="momentum"``) that is SGD without
        momentum over every parameter of the model (``direction_optimizer()``
        makes one); any optimizer pairs with a hook that hands DDP a
        gradient. ValueError saying what is wrong otherwise."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"sparsecomm: pair() takes a torch.optim.Optimizer, got "
                             f"{type(optimizer).__name__}")
        if self.hands_direction or self.applies_momentum:
            what = ("the sign of the ranks' mean momentum (DeMo)" if self.method == "demo"
                    else "the ranks' mean AdamW direction" if self.compress == "update"
                    else "a gradient with momentum already applied (memory=momentum)")
            fix = ("use sparsecomm.direction_optimizer(model.parameters(), lr, weight_decay, "
                   "hook=state)")
            if not isinstance(optimizer, torch.optim.SGD):
                raise ValueError(
                    f"sparsecomm: this {self.method} hook hands DDP {what}, which "
                    f"{type(optimizer).__name__} would rescale or smooth again; {fix}")
            for group in optimizer.param_groups:
                if group.get("momentum", 0.0) != 0.0:
                    raise ValueError(
                        f"sparsecomm: this {self.method} hook hands DDP {what}; SGD with "
                        f"momentum={group['momentum']} would add momentum on top; {fix}")
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        missing = [name for name, p in self.sparse + self.dense if id(p) not in stepped]
        if missing:
            raise ValueError(f"sparsecomm: the optimizer does not step {', '.join(missing)}, "
                             "which the hook synchronizes; build it over model.parameters()")
        self._paired = optimizer
        return optimizer

    @property
    def groups(self):
        """The exchange groups: (parameter names, sparsified?) each."""
        return [(list(g.names), g.synchronizer is not None) for g in self._groups]

    def kept(self):
        """What error feedback holds back now, per sparsified parameter name
        (a tensor of the parameter's shape); empty before the first step
        and for methods without memory."""
        self._settle()
        shapes = dict((name, p.shape) for name, p in self.sparse)
        out = {}
        for g in self._groups:
            flat = g.owner.kept() if g.synchronizer is not None else None
            if flat is None or flat.numel() == 0:
                continue
            offset = 0
            for name in g.names:
                numel = math.prod(shapes[name])
                out[name] = flat[offset:offset + numel].view(shapes[name])
                offset += numel
        return out

    def state_dict(self):
        """Everything the next steps depend on: each group's scheme state
        (residuals, thresholds, partitions) and the step counter."""
        self._settle()
        return {"method": self.method, "options": dict(self.options), "step": self.step,
                "selection": self.selection,
                "epoch": self.epoch, "sparse": [name for name, _ in self.sparse],
                "groups": [g.names for g in self._groups],
                "synchronizers": [g.owner.state() for g in self._groups
                                  if g.synchronizer is not None],
                "compress": self.compress,
                "moments": [g.moments.state() for g in self._groups if g.moments is not None]}

    def load_state_dict(self, state):
        """Restores a state_dict() of the same method, options, parameters and
        groups (ValueError naming the difference otherwise)."""
        self._settle()
        for key, mine in (("method", self.method), ("options", self.options),
                          ("compress", self.compress),
                          ("sparse", [name for name, _ in self.sparse]),
                          ("groups", [g.names for g in self._groups])):
            if state.get(key) != mine:
                raise ValueError(f"sparsecomm: the saved hook state has {key} "
                                 f"{state.get(key)!r}, this hook {mine!r}")
        saved_selection = state.get("selection", "host")  # states before selection= were host
        if saved_selection != self.selection:
            raise ValueError(f"sparsecomm: the saved hook state has selection "
                             f"{saved_selection!r}, this hook {self.selection!r}")
        synchronizers = [g.owner for g in self._groups if g.synchronizer is not None]
        for synchronizer, saved in zip(synchronizers, state["synchronizers"]):
            synchronizer.load_state(saved)
        for g, saved in zip([g for g in self._groups if g.moments is not None],
                            state.get("moments", [])):
            g.moments.load_state(saved)
        self.step = state["step"]
        self.epoch = state["epoch"]

    def finish_timeline(self):
        """With ``timeline=PATH``: waits for the exchanges, then (on every
        rank of the group, at the same point: a barrier) rank 0 merges the
        ranks' parts into PATH, a Chrome trace for Perfetto
        (docs/timeline.md). Returns the ranks whose part rank 0 did not find
        (on other hosts' disks), an empty list elsewhere."""
        if self._timeline is None:
            raise ValueError("sparsecomm: this hook was made without timeline=PATH")
        self._settle()
        dist.barrier(group=self._group)
        return self._timeline.merge(dist.get_world_size(self._group))

    # --- one step: buckets arrive, complete groups are exchanged ---

    def _settle(self):
        """Waits for the exchanges still running (their state is read next)."""
        self.metrics  # noqa: B018 (the property waits)

    @property
    def metrics(self):
        """The last whole step's metrics (None before the first): waits for
        the step's exchanges if they still run."""
        line = self._worker.finished_step()  # the step's groups combined
        if line is not None:
            self._metrics = json.loads(line)
            self._metrics["groups"] = len(self._finished_order)
            exchange_s, overlapped_s = self._worker.finished_times()
            # The hook's own figures: its exchanges' time on the worker and
            # the part of it spent while backward still ran.
            self._metrics["hook_exchange_s"] = exchange_s
            self._metrics["hook_overlapped_s"] = overlapped_s
            self._metrics["overlap_fraction"] = overlapped_s / exchange_s if exchange_s > 0 else 0.0
        return self._metrics

    def _begin_step(self):
        self._gradients = {}  # id(parameter) -> its gradient view in a bucket
        self._missing = [len(g.ids) for g in self._groups]
        self._submitted = 0
        self._step_order = []  # group indices in the order they were exchanged

    def _bucket_ready(self, bucket):
        if self._error is None and self.hands_direction and self._paired is None:
            # Every rank reaches this at its first bucket: all fail alike.
            self._error = HookError(
                f"sparsecomm: this {self.method} hook hands DDP a step direction, not a "
                "gradient, and no optimizer was paired with it; make the optimizer with "
                "sparsecomm.direction_optimizer(model.parameters(), lr, weight_decay, "
                "hook=state), or pass yours to state.pair(optimizer) (SGD without momentum)")
        if self._error is not None:  # the ranks are out of step now: fail, never hang
            future = torch.futures.Future()
            _fail_future(future, self._error)
            return future
        ready = []
        waits_for = set()
        for parameter, gradient in zip(bucket.parameters(), bucket.gradients()):
            index = self._group_of[id(parameter)]
            self._gradients[id(parameter)] = gradient
            waits_for.add(index)
            self._missing[index] -= 1
            if self._missing[index] == 0:
                ready.append(index)
        future = self._worker.bucket_future(bucket.buffer(), sorted(waits_for))
        for index in sorted(ready):
            self._submit(index)
        return future

    def _submit(self, index):
        """Hands group `index` (all its gradients are in) to the worker; the
        step's last group ends the step here."""
        g = self._groups[index]
        views = [self._gradients[pid] for pid in g.ids]
        flat = g.flatten(views)
        self._submitted += 1
        ends_step = self._submitted == len(self._groups)
        staging = g.staging_for(flat, self.selection)
        if g.synchronizer is not None:
            self._worker.submit(index, self.step, self.epoch, g.synchronizer, g.moments, flat,
                                views, g.layers, g.rows, ends_step, staging)
        else:
            self._worker.submit(index, self.step, self.epoch, g.dense, g.moments, flat, views,
                                None, None, ends_step, staging, beside_method=True)
        self._step_order.append(index)
        if ends_step:
            self._finished_order = self._step_order  # what metrics pairs with the lines
            self.step += 1
            self._begin_step()

    def _failed(self, cause, step):
        """The worker's error factory (on its thread, with the GIL): every
        pending and later bucket fails with this HookError."""
        error = HookError(f"sparsecomm: the hook's exchange failed at step {step}: {cause}")
        error.__cause__ = cause
        self._error = error
        return error


def _hook(state, bucket):
    return state._bucket_ready(bucket)


def ddp_comm_hook(model, method, group=None, nonfinite="stop", exclude=(), min_numel=0,
                  bucket_mb=None, compress="gradient", betas=(0.9, 0.999), eps=1e-8, overlap=True,
                  selection="auto", ranks_per_host=1, timeline=None, **options):
    """(state, hook) for ``model.register_comm_hook(state, hook)``.

    ``model``: the DDP model (or the module it wraps); ``method``: a
    method name (``sparsecomm.methods()``); ``options``: the CLI's ``-o``
    options (density=0.01, exchange=..., values=bf16, ...); ``exclude``:
    parameter name patterns (fnmatch, e.g. ``"fc2.*"``) and ``min_numel``:
    a size below which a parameter is averaged densely instead;
    ``bucket_mb``: exchange groups of at most this size, each with its
    own scheme instance (None: the whole model at once);
    ``compress="update"``: synchronize each rank's AdamW direction (with
    ``betas`` and ``eps``) instead of the gradient, and step with
    ``direction_optimizer(..., hook=state)`` (so with ``"demo"``);
    ``overlap``: exchange each group on the
    hook's own thread as soon as it is complete, beside backward (False:
    on backward's thread; the results are the same); ``selection``: where
    the method selects, ``"host"`` (the C++ schemes, every method, CPU
    gradients), ``"device"`` (on the gradients' device, topk and
    threshold, the exchange through the group's all_gather) or ``"auto"``
    (the device for gradients off the CPU); ``ranks_per_host``: hosts of
    that many consecutive ranks of the group, whose ranks average their
    gradients first, the method then running among one leader per host
    (docs/algorithms.md, "Two-level exchanges"; host selection); ``"auto"``
    takes the hosts from the ranks' host names (``SPARSECOMM_HOST_NAME``
    where set); ``timeline``: a path for this rank's phases as a Chrome
    trace (each group's exchange and what it contains, the waits on peers,
    the buckets' arrival), merged by ``state.finish_timeline()``
    (docs/timeline.md). Raises ValueError for an unknown method or
    option."""
    return HookState(model, method, group, nonfinite, exclude, min_numel, bucket_mb, compress,
                     betas, eps, overlap, selection, ranks_per_host, timeline, **options), _hook


def direction_optimizer(parameters, lr, weight_decay=0.01, hook=None):
    """The optimizer of a hook that hands DDP a step direction u
    (``compress="update"``: the mean AdamW direction; ``"demo"``: the sign
    of the ranks' mean momentum): it applies ``p -= lr * (u + weight_decay
    * p)`` (AdamW's decoupled weight decay), SGD without momentum, and
    pairs with ``hook`` (a HookState) when given. With DeMo ``lr`` is the
    size of every coordinate's step. Learning-rate schedulers work on it as
    usual."""
    optimizer = torch.optim.SGD(parameters, lr=lr, momentum=0.0, weight_decay=weight_decay)
    return hook.pair(optimizer) if hook is not None else optimizer


def register(model, method, **kwargs):
    """Registers the hook on the DDP model and returns its state."""
    state, hook = ddp_comm_hook(model, method, **kwargs)
    model.register_comm_hook(state, hook)
    return state
