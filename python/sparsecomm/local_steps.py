"""Local steps for a training loop of one's own: DiLoCo's outer loop
(docs/python.md, "Local steps"; the CLI's ``--local-steps``).

Each rank trains on its own data with its own optimizer. Every
``local_steps`` calls of :meth:`LocalSteps.step` the ranks synchronize the
pseudo-gradient (the anchor, the parameters they last agreed on, minus their
own) through any of the CLI's methods, with its error feedback, and take the
outer step (by default the plain average; DiLoCo's Nesterov step with
``outer_lr=0.7, outer_momentum=0.9, outer_nesterov=True``); every rank then
restarts from the new anchor. The arithmetic is the C++ ``OuterLoop``
(optim/outer_loop.h), the exchange a ``Synchronizer``.
"""

import json

import torch
import torch.distributed as dist

from ._sparsecomm import Communicator, OuterLoop, Synchronizer, round_options
from ._common import option_texts, process_group


class LocalSteps:
    """The outer loop around a model trained by a local optimizer::

        outer = sparsecomm.LocalSteps(model, "topk", local_steps=32, density=0.01)
        for x, y in my_shard_of_the_data:
            loss_fn(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            metrics = outer.step()   # the round's metrics (a dict) at its end, else None
        outer.synchronize()          # close a last, shorter round: the ranks agree again

    The model must not be wrapped in DistributedDataParallel (its ranks
    would average every step) and its trainable parameters must be float32
    CPU tensors. Every rank starts from rank 0's parameters. Keyword options
    are the method's (``density=0.01``, ``decay=0.95`` ...). Methods that
    apply momentum themselves (DGC) are refused: the pseudo-gradient carries
    the local optimizer's momentum already. A NaN or inf in any rank's
    parameters reaches the exchange: ``nonfinite="stop"`` raises there,
    ``"skip"`` drops the round (every rank restarts from the unchanged
    anchor; the local optimizers keep their state).
    """

    def __init__(self, model, method, local_steps, outer_lr=1.0, outer_momentum=0.0,
                 outer_nesterov=False, group=None, nonfinite="stop", **options):
        group = process_group(group)
        self._parameters = [p for p in model.parameters() if p.requires_grad]
        if not self._parameters:
            raise ValueError("sparsecomm: the model has no parameter that requires grad")
        for p in self._parameters:
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError(f"sparsecomm: LocalSteps needs float32 CPU parameters; one is "
                                 f"{p.dtype} on {p.device} (call model.float() / model.cpu())")
        self._sizes = [p.numel() for p in self._parameters]
        self._flat = torch.empty(sum(self._sizes), dtype=torch.float32)
        self._pseudo_gradient = torch.empty_like(self._flat)
        self._gather()
        dist.broadcast(self._flat, 0, group=group)
        self._scatter()
        # The CLI's rule for rounds (the spike clip off unless asked for).
        self._synchronizer = Synchronizer(Communicator(group), method,
                                          round_options(method, option_texts(options)), nonfinite)
        if self._synchronizer.applies_momentum:
            raise ValueError(
                f"sparsecomm: {method} applies momentum to what it sends (memory=momentum); a "
                "pseudo-gradient carries the local optimizer's momentum already: give "
                "memory='ef'")
        # ValueError for local_steps < 1 or an outer lr or momentum out of range.
        self._loop = OuterLoop(self._flat, local_steps, outer_lr, outer_momentum, outer_nesterov)
        self.local_steps = local_steps
        self.inner_steps = 0  # calls of step() so far
        self.rounds = 0       # synchronizations so far
        self.metrics = None   # the last round's

    def step(self, epoch=0.0):
        """Counts one local step; at a round's end synchronizes and returns
        the round's metrics (K/k, bytes ...: docs/python.md), else None.
        ``epoch`` reaches methods whose schedule follows it."""
        self.inner_steps += 1
        if not self._loop.ends_round(self.inner_steps - 1):
            return None
        return self.synchronize(epoch)

    def synchronize(self, epoch=0.0):
        """Ends the current round now (every rank must call it at the same
        point): exchange, outer step, parameters reset to the new anchor."""
        self._gather()
        self._loop.pseudo_gradient(self._flat, self._pseudo_gradient)
        line = self._synchronizer.synchronize(self._pseudo_gradient, self.rounds, epoch, 0,
                                              self._sizes)
        metrics = json.loads(line)
        self._loop.finish_round(self._flat, self._pseudo_gradient, metrics["skipped_nonfinite"])
        self._scatter()
        self.rounds += 1
        self.metrics = metrics
        return metrics

    def anchor(self):
        """A copy of the parameters the ranks last agreed on (flat)."""
        return self._loop.anchor()

    def kept(self):
        """What error feedback holds back for later rounds (flat; empty for
        methods without memory)."""
        return self._synchronizer.kept()

    def state_dict(self):
        return {"outer": self._loop.state(), "synchronizer": self._synchronizer.state(),
                "inner_steps": self.inner_steps, "rounds": self.rounds,
                "local_steps": self.local_steps}

    def load_state_dict(self, state):
        if state.get("local_steps") != self.local_steps:
            raise ValueError(f"sparsecomm: the state is of rounds of {state.get('local_steps')} "
                             f"local steps, this LocalSteps has {self.local_steps}")
        self._loop.load_state(state["outer"])
        self._synchronizer.load_state(state["synchronizer"])
        self.inner_steps = state["inner_steps"]
        self.rounds = state["rounds"]

    def _gather(self):
        offset = 0
        with torch.no_grad():
            for p, size in zip(self._parameters, self._sizes):
                self._flat[offset:offset + size].copy_(p.reshape(-1))
                offset += size

    def _scatter(self):
        offset = 0
        with torch.no_grad():
            for p, size in zip(self._parameters, self._sizes):
                p.copy_(self._flat[offset:offset + size].view_as(p))
                offset += size
