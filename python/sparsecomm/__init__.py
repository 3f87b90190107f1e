"""sparsecomm from PyTorch: sparsified gradient synchronization with error
feedback for DistributedDataParallel (docs/python.md).

    import sparsecomm
    ddp_model = torch.nn.parallel.DistributedDataParallel(model)
    state = sparsecomm.register(ddp_model, "exdyna", density=0.01)
    # or: state, hook = sparsecomm.ddp_comm_hook(ddp_model, "exdyna", density=0.01)
    #     ddp_model.register_comm_hook(state, hook)

Every method of the CLI (``sparsecomm.methods()``: skipreduce, topk, exdyna, ...) with the CLI's options
(``-o key=value`` there, keyword arguments here). The exchange runs over the
DDP process group through sparsecomm's own collectives (point-to-point
sends over gloo), so it works wherever DDP on CPU works.

With a training loop and a transport of one's own: ``Sparsifier`` selects
(with error feedback) and ``decode`` sums the ranks' selections.
Training over slow links: ``LocalSteps`` runs DiLoCo's outer loop around a
local optimizer, the pseudo-gradient synchronized by any method. The
density to train at: ``choose_density`` (from a convergence profile, which
pilot runs of one's own loop write with ``PilotRun`` and
``write_convergence_profile``).
"""

from ._sparsecomm import (  # noqa: F401  (the package's API)
    CommError,
    Communicator,
    DeviceSynchronizer,
    InvalidArgument,
    Synchronizer,
    UpdateDirection,
    allreduce,
    device_methods,
    method_options,
    methods,
)
from .ddp import HookError, HookState, ddp_comm_hook, direction_optimizer, register  # noqa: F401
from .local_steps import LocalSteps  # noqa: F401
from .muon import Muon, muon_optimizer  # noqa: F401
from .planning import PilotRun, choose_density, write_convergence_profile  # noqa: F401
from .sparsifier import Sparsifier, decode  # noqa: F401
