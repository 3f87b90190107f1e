#!/usr/bin/python3
"""The CLI's CNN (or wide MLP) on Fashion-MNIST with PyTorch DDP and a sparsecomm hook.

    /usr/bin/python3 examples/ddp_fashion_mnist/train.py --processes 4 --hook exdyna
    mpirun -n 4 /usr/bin/python3 examples/ddp_fashion_mnist/train.py --hook exdyna
    ... --hook default     # DDP's own all-reduce, for comparison
    ... --model wide-mlp --max-steps 40   # what scripts/ddp-cluster.sh times
    torchrun --nproc_per_node 4 examples/ddp_fashion_mnist/train.py   # where torchrun works

(Debian 12's torchrun, torch 1.13 on Python 3.11, fails before it starts
a worker: "'NoneType' object has no attribute 'get'" in elastic's to_map;
--processes starts the workers itself.)

Needs PYTHONPATH=build/python (or `cmake --install build`). The model, data
and optimizer are the CLI's defaults (`sparsecomm train --model cnn`): two
3x3 convolutions (32, 64 channels) with max-pooling, a 128-unit hidden
layer; per-process batch 64; SGD with Nesterov momentum 0.9, weight decay
5e-4, lr 0.1 with a 0.5-epoch linear warm-up and cosine decay; every
epoch a fresh shuffle split over the processes. Rendezvous: torchrun's
environment, or under mpirun or with --processes a file in --out (one
machine) unless MASTER_ADDR/MASTER_PORT are set. Rank 0 writes --out/metrics.jsonl: a
line per step (loss, lr, the hook's K/k, imbalance, bytes, phase times;
wall time; the bytes the NIC named by GLOO_SOCKET_IFNAME sent) and per
epoch (test accuracy), and --out/summary.json.
"""

import argparse
import gzip
import json
import math
import os
import pathlib
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

DATA = pathlib.Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist
PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(split, data=DATA):
    prefix = "train" if split == "train" else "t10k"
    images = torch.from_numpy(read_idx(data / f"{prefix}-images-idx3-ubyte.gz").copy())
    labels = torch.from_numpy(read_idx(data / f"{prefix}-labels-idx1-ubyte.gz").copy())
    inputs = (images.float().unsqueeze(1) / 255.0 - PIXEL_MEAN) / PIXEL_STD
    return inputs, labels.long()


class WideMlp(torch.nn.Module):
    """The CLI's wide-mlp: five 2,048-unit ReLU layers (18.4M parameters), a
    model whose gradients, not its compute, dominate a step on a slow
    network."""

    def __init__(self, classes=10, hidden=(2048,) * 5):
        super().__init__()
        sizes = (28 * 28,) + tuple(hidden)
        for i in range(len(hidden)):
            self.add_module(f"fc{i + 1}", torch.nn.Linear(sizes[i], sizes[i + 1]))
        self.add_module(f"fc{len(hidden) + 1}", torch.nn.Linear(sizes[-1], classes))

    def forward(self, x):
        layers = list(self.children())
        x = x.flatten(1)
        for layer in layers[:-1]:
            x = F.relu(layer(x))
        return layers[-1](x)


class Cnn(torch.nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = torch.nn.Linear(64 * 7 * 7, 128)
        self.fc2 = torch.nn.Linear(128, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


MODELS = {"cnn": Cnn, "wide-mlp": WideMlp}


def rendezvous(out, spawned=None):
    """spawned: (rank, world) of a process --processes started."""
    if spawned is None and "RANK" in os.environ:  # torchrun
        dist.init_process_group("gloo", init_method="env://")
        return
    if spawned is not None:
        rank, world = spawned
        tag = "spawn"
    elif "OMPI_COMM_WORLD_RANK" in os.environ:  # mpirun: Debian's torch has no MPI backend
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
        tag = "mpirun"
    else:
        sys.exit("train.py: give --processes N, or start it with mpirun or torchrun "
                 "(see the docstring)")
    method = ("env://" if "MASTER_ADDR" in os.environ
              else f"file://{out.resolve()}/rendezvous-{tag}")
    dist.init_process_group("gloo", init_method=method, rank=rank, world_size=world)


def nic_bytes_sent():
    """Bytes this host's NIC has sent (Linux counters) when GLOO_SOCKET_IFNAME
    names the interface gloo uses, as on the emulated cluster; else None."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    if not interface:
        return None
    try:
        return int(pathlib.Path(f"/sys/class/net/{interface}/statistics/tx_bytes").read_text())
    except (OSError, ValueError):
        return None


def learning_rate(step, steps_per_epoch, total_steps, base, warmup_epochs):
    warmup = warmup_epochs * steps_per_epoch
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1.0, total_steps - warmup)
    return base * 0.5 * (1.0 + math.cos(math.pi * progress))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hook", default="exdyna",
                        help="a sparsecomm method (sparsecomm.methods(), powersgd among them), "
                             "or PyTorch's own hooks: default, torch-fp16, torch-powersgd")
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("-o", "--option", action="append", default=[],
                        help="the method's options as key=value (the CLI's -o)")
    parser.add_argument("--exclude", action="append", default=[],
                        help="parameter name patterns averaged densely (fnmatch, e.g. 'fc2.*')")
    parser.add_argument("--min-numel", type=int, default=0,
                        help="parameters with fewer elements are averaged densely")
    parser.add_argument("--bucket-mb", type=float, default=None,
                        help="sparsecomm hooks: exchange groups of at most this size, each with "
                             "its own scheme (default: the whole model at once)")
    parser.add_argument("--ddp-bucket-mb", type=float, default=25.0,
                        help="DDP's own bucket size (bucket_cap_mb): a hook's group is exchanged "
                             "once DDP has handed in every bucket holding its gradients")
    parser.add_argument("--device", default="cpu",
                        help="where the model trains: cpu, or cuda (every process on GPU 0 "
                             "unless LOCAL_RANK says otherwise; gloo carries CUDA tensors)")
    parser.add_argument("--selection", default="auto", choices=["auto", "host", "device"],
                        help="sparsecomm hooks: where the method selects (docs/python.md)")
    parser.add_argument("--no-overlap", action="store_true",
                        help="sparsecomm hooks: exchange on backward's thread instead of beside "
                             "it (overlap is the default; it changes no result)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=0,
                        help="stop after this many steps (0: run every epoch), then evaluate")
    parser.add_argument("--batch", type=int, default=64, help="per process")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--warmup-epochs", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--limit", type=int, default=0,
                        help="use only the first N training images (0: all 60,000)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/ddp-example"))
    parser.add_argument("--data", type=pathlib.Path, default=DATA,
                        help="Fashion-MNIST's four .gz files (default: Debian's "
                        "dataset-fashion-mnist)")
    parser.add_argument("--processes", type=int, default=0,
                        help="start this many worker processes on this machine")
    args = parser.parse_args()
    missing = [name for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
               if not (args.data / name).is_file()]
    if missing:
        parser.error(f"--data {args.data} lacks {', '.join(missing)}: install Debian's "
                     "dataset-fashion-mnist, or point --data at a folder with the four files")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.processes > 0:
        for stale in args.out.glob("rendezvous-*"):
            stale.unlink()
        import torch.multiprocessing as mp
        mp.start_processes(train, args=(args.processes, args), nprocs=args.processes,
                           start_method="spawn")
    else:
        train(None, None, args)


def train(spawned_rank, spawned_world, args):
    torch.set_num_threads(1)
    rendezvous(args.out, None if spawned_rank is None else (spawned_rank, spawned_world))
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("ddp example: --device cuda, but torch sees no CUDA device")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    model = MODELS[args.model]().to(device)
    model = DDP(model, bucket_cap_mb=args.ddp_bucket_mb,
                device_ids=[device.index] if device.type == "cuda" else None)
    state = None
    if args.hook == "torch-fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.hook == "torch-powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        # Compression from the second step (the default, 1,000, is past
        # this example's 702 steps).
        model.register_comm_hook(
            powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=2),
            powerSGD_hook.powerSGD_hook)
    elif args.hook != "default":
        import sparsecomm
        options = dict(item.split("=", 1) for item in args.option)
        if "density" in sparsecomm.method_options(args.hook):  # not skipreduce's
            options.setdefault("density", args.density)
        state = sparsecomm.register(model, args.hook, exclude=args.exclude,
                                    min_numel=args.min_numel, bucket_mb=args.bucket_mb,
                                    overlap=not args.no_overlap, selection=args.selection,
                                    **options)

    train_x, train_y = load("train", args.data)
    if args.limit > 0:
        train_x, train_y = train_x[:args.limit], train_y[:args.limit]
    test_x, test_y = load("test", args.data)
    steps_per_epoch = len(train_x) // (args.batch * world)
    total_steps = steps_per_epoch * args.epochs
    # DGC's momentum correction (memory=momentum) applies the momentum in
    # the hook, as the CLI's trainer does; the optimizer then has none.
    momentum = 0.0 if state is not None and state.applies_momentum else 0.9
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=momentum,
                                nesterov=momentum > 0, weight_decay=5e-4)
    log = open(args.out / "metrics.jsonl", "w") if rank == 0 else None
    start = time.perf_counter()
    step = 0
    accuracy = float("nan")
    for epoch in range(args.epochs):
        if state is not None:
            state.epoch = float(epoch)
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed + epoch))
        mine = order[rank * steps_per_epoch * args.batch:(rank + 1) * steps_per_epoch * args.batch]
        model.train()
        for i in range(steps_per_epoch):
            if args.max_steps and step >= args.max_steps:
                break
            lr = learning_rate(step, steps_per_epoch, total_steps, args.lr, args.warmup_epochs)
            for group in optimizer.param_groups:
                group["lr"] = lr
            rows = mine[i * args.batch:(i + 1) * args.batch]
            sent_before = nic_bytes_sent()
            t0 = time.perf_counter()
            optimizer.zero_grad()
            loss = F.cross_entropy(model(train_x[rows].to(device)), train_y[rows].to(device))
            loss.backward()
            optimizer.step()
            if log:
                line = {"kind": "step", "step": step, "epoch": epoch + (i + 1) / steps_per_epoch,
                        "loss": loss.item(), "lr": lr, "step_s": time.perf_counter() - t0,
                        "wall_s": time.perf_counter() - start}
                if sent_before is not None:
                    line["nic_bytes_sent"] = nic_bytes_sent() - sent_before
                if state is not None and state.metrics:
                    line["sync"] = state.metrics
                log.write(json.dumps(line) + "\n")
            step += 1
        model.eval()
        with torch.no_grad():  # every process evaluates a slice; the counts are summed
            lo, hi = len(test_x) * rank // world, len(test_x) * (rank + 1) // world
            predicted = model(test_x[lo:hi].to(device)).argmax(1).cpu()
            correct = torch.tensor([(predicted == test_y[lo:hi]).sum().item()])
        dist.all_reduce(correct)
        accuracy = 100.0 * correct.item() / len(test_x)
        if log:
            log.write(json.dumps({"kind": "eval", "epoch": epoch + 1, "test_accuracy": accuracy,
                                  "wall_s": time.perf_counter() - start}) + "\n")
            log.flush()
            print(f"epoch {epoch + 1}: test accuracy {accuracy:.2f}%  "
                  f"[{time.perf_counter() - start:.0f}s]", flush=True)
        if args.max_steps and step >= args.max_steps:
            break
    if log:
        log.close()
        summary = {"hook": args.hook, "density": args.density, "options": args.option,
                   "exclude": args.exclude, "min_numel": args.min_numel,
                   "bucket_mb": args.bucket_mb, "ddp_bucket_mb": args.ddp_bucket_mb,
                   "device": args.device, "selection": args.selection,
                   "overlap": not args.no_overlap,
                   "model": args.model, "processes": world, "epochs": args.epochs, "steps": step, "final_test_accuracy": accuracy,
                   "wall_s": time.perf_counter() - start}
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
