"""Sparsification without sparsecomm's exchange, for training loops that
move the selections over a transport of their own (docs/python.md,
"Sparsifier").

    sparsifier = sparsecomm.Sparsifier("topk", density=0.01)
    for step, batch in enumerate(loader):
        ...
        indices, values = sparsifier.select(flat_gradient, step)
        # send (indices, values) to the other ranks, gather theirs, then
        average = sparsecomm.decode(all_indices, all_values, flat_gradient.numel(),
                                    divisor=world)

``select`` adds the gradient to what error feedback kept, picks this
rank's coordinates by the scheme's rule and keeps the rest for the next
step. Summing every rank's selection and dividing by the number of ranks
gives exactly what sparsecomm's all-gather exchange gives. Schemes that
coordinate the ranks (ExDyna's and MiCRO's partitions and threshold,
CLT-k's leader, Random-k's shared draw) run their own small collectives
over ``group``, so every rank calls ``select`` every step.
"""

import torch
import torch.distributed as dist

from ._common import option_texts
from ._sparsecomm import Communicator
from ._sparsecomm import Sparsifier as _Sparsifier


class Sparsifier:
    """A sparsification scheme with its error feedback, one per rank.

    ``method``: a scheme of ``sparsecomm.methods()`` (not ``dense`` or
    ``skipreduce``, which are exchanges). ``group``: the process group its
    coordination runs over (default: torch.distributed's default group, or a
    world of one rank when torch.distributed is not initialized).
    ``options``: the scheme's options as keyword arguments (``density=0.01``,
    ``memory="none"``, ...); the exchange's options (``exchange``,
    ``values``, ``encode_indices``) are refused, since the exchange is yours.
    ``nonfinite``: what every rank does when some rank's gradient has NaN or
    inf: ``"stop"`` raises RuntimeError on every rank, ``"skip"`` selects
    nothing and leaves the memory as it was.
    """

    def __init__(self, method, group=None, nonfinite="stop", **options):
        if group is None:
            comm = (Communicator(dist.distributed_c10d._get_default_group())
                    if dist.is_initialized() else Communicator.single())
        else:
            comm = Communicator(group)
        self.method = method
        self.rank, self.world = comm.rank, comm.size
        self._impl = _Sparsifier(comm, method, option_texts(options), nonfinite)

    def select(self, gradient, step, epoch=0.0, layers=None):
        """This rank's selection from ``gradient`` (a contiguous float32 CPU
        tensor, flattened; the same size every step) plus what was kept:
        ``(indices, values)``, indices ascending (int64), values float32.
        ``layers``: the sizes of the tensors the gradient is made of, in
        order (DEFT selects per tensor; other schemes ignore it)."""
        return self._impl.select(gradient.reshape(-1), step, float(epoch),
                                 None if layers is None else [int(n) for n in layers])

    def kept(self):
        """What error feedback holds back now (the residual; DGC's
        momentum memory: its velocity), a float32 tensor of the gradient's
        size; empty before the first step."""
        return self._impl.kept()

    @property
    def counts(self):
        """Every rank's number of selected coordinates in the last step."""
        return list(self._impl.counts)

    @property
    def skipped(self):
        """True when the last step was skipped (``nonfinite="skip"``)."""
        return self._impl.skipped

    def target(self, numel, step=0, epoch=0.0):
        """The number of coordinates the scheme aims at over all ranks for
        a gradient of ``numel`` elements at this step (k = density x numel;
        DGC's warm-up changes it over time)."""
        return self._impl.target(numel, step, float(epoch))

    def state_dict(self):
        """Everything needed to resume exactly (memory, thresholds,
        partitions), in the layout of sparsecomm's checkpoints."""
        return {"method": self.method, "state": self._impl.state()}

    def load_state_dict(self, state):
        if state.get("method") != self.method:
            raise ValueError(f"sparsecomm: the state is of method {state.get('method')!r}, "
                             f"this Sparsifier runs {self.method!r}")
        self._impl.load_state(state["state"])


def decode(indices, values, numel, divisor=1):
    """The dense vector of ``numel`` elements holding the sum of the given
    selections, divided by ``divisor`` (the number of ranks gives their
    average). ``indices`` and ``values``: one selection's tensors, or lists
    of them (one per rank)."""
    if isinstance(indices, (list, tuple)):
        indices, values = torch.cat(list(indices)), torch.cat(list(values))
    if indices.numel() != values.numel():
        raise ValueError(f"sparsecomm: {indices.numel()} indices but {values.numel()} values")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= numel):
        raise ValueError(f"sparsecomm: an index lies outside [0, {numel}); were the "
                         "selections made for a gradient of this size?")
    dense = torch.zeros(numel, dtype=torch.float32)
    dense.index_add_(0, indices.long(), values.float())
    if divisor != 1:
        dense /= divisor
    return dense
