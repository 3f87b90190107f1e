"""Two levels in the DDP hook (docs/python.md, "Two levels"): the hosts,
from ``ranks_per_host`` or the ranks' host names, and their
torch.distributed subgroups: one per host (NCCL for CUDA gradients, gloo on
CPUs) for the host's average and its leader's broadcast, and the leaders'
gloo group for the method between hosts. C++ ``_HostLevels``
(python/src/host_levels.h) runs a step."""

import torch.distributed as dist

from ._sparsecomm import (Communicator, Synchronizer, _HostLevels, _this_host_name,
                          _topology_of_hosts)


def ranks_per_host_of(group, ranks_per_host):
    """``ranks_per_host`` checked against the group, or for 0 ("auto") the
    hosts' rule of the CLI's ``--ranks-per-host auto`` applied to the
    ranks' host names (ValueError for a placement it refuses)."""
    world = dist.get_world_size(group)
    if ranks_per_host == 0:
        names = [None] * world
        dist.all_gather_object(names, _this_host_name(), group=group)
        first = {}
        return _topology_of_hosts([first.setdefault(name, len(first)) for name in names])
    if ranks_per_host < 1 or world % ranks_per_host:
        raise ValueError(f"sparsecomm: {ranks_per_host} ranks per host do not divide the world of "
                         f"{world} ranks into hosts; give a divisor of {world} or 'auto'")
    return ranks_per_host


class Hosts:
    """This rank's host group and, on a host's leader (its first rank), the
    leaders' communicator. Every process of the job makes it at the same
    point (torch.distributed.new_group is collective over the world)."""

    def __init__(self, group, ranks_per_host, device_type):
        world = dist.get_world_size(group)
        if world != dist.get_world_size():
            raise ValueError(
                f"sparsecomm: ranks_per_host makes subgroups of the whole job, but the hook's group "
                f"holds {world} of its {dist.get_world_size()} processes; give the hook a group of "
                "every process")
        self.ranks_per_host = ranks_per_host
        rank = dist.get_rank(group)
        backend = "nccl" if device_type == "cuda" else "gloo"
        self.host = None
        for first in range(0, world, ranks_per_host):
            made = dist.new_group(list(range(first, first + ranks_per_host)), backend=backend)
            if first == rank - rank % ranks_per_host:
                self.host = made
        leaders = dist.new_group(list(range(0, world, ranks_per_host)), backend="gloo")
        self.leaders = Communicator(leaders) if rank % ranks_per_host == 0 else None

    def synchronizer(self, method, options, nonfinite):
        """What the worker runs (a ``_HostLevels``) and the Synchronizer that
        keeps the method's state: the leaders' on a leader; elsewhere one
        over this process alone that never runs (its properties, its empty
        state)."""
        leads = self.leaders is not None
        owner = Synchronizer(self.leaders if leads else Communicator.single(), method, options,
                             nonfinite)
        return _HostLevels(self.host, owner if leads else None), owner
