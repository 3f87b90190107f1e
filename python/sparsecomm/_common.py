"""What the DDP hook, LocalSteps and the Sparsifier share."""

import torch.distributed as dist


def option_texts(options):
    """Keyword options as the CLI's ``-o key=value`` texts (booleans as
    true/false)."""

    def text(value):
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return {key: text(value) for key, value in options.items()}


def process_group(group):
    """``group``, or torch.distributed's default group when it is None;
    RuntimeError saying what to do when torch.distributed is not set up."""
    if group is not None:
        return group
    if not dist.is_initialized():
        raise RuntimeError(
            "sparsecomm: torch.distributed is not initialized; call "
            "torch.distributed.init_process_group('gloo', ...) first, or pass group=")
    return dist.distributed_c10d._get_default_group()
