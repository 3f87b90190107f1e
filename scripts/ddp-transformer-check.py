#!/usr/bin/python3
"""The DDP hook as a user's training loop meets it (docs/python.md alone):
a GPT-style transformer with tied embeddings built from torch.nn (by
default the CLI char transformer's shape, 4 blocks of width 128 with 4
heads, 814 K parameters; SHAPE sets another), the next character of
Python's standard library sources (the first 120 modules of
/usr/lib/python3.11), 2 gloo processes, batch 16 x 64 characters per
process, constant learning rate, the loop and optimizers of a user.

    scripts/ddp-transformer-check.py METHOD STEPS [key=value ...]

METHOD dense: DDP's default hook with torch.optim.AdamW(lr, weight decay
0.01). Otherwise the hook of sparsecomm METHOD with the options given; a
hook that hands DDP a direction (demo, compress=update) steps with
sparsecomm.direction_optimizer(lr, 0.01, hook=state), any other with
AdamW (OPTIMIZER=muon: sparsecomm.muon_optimizer, with the same lr and
weight decay). LOCAL_STEPS=H (environment) trains in rounds of H local
steps instead, through sparsecomm.LocalSteps (METHOD dense included: the
rounds' pseudo-gradients averaged whole), the model unwrapped, each rank
with its own AdamW; OUTER=lr,momentum,nesterov sets the outer step (default
LocalSteps's). LR (environment, default 3e-3) sets the learning rate, OUT the
JSON-lines file the result is appended to (default ddp-check.jsonl), PORT
the rendezvous port, SEED the initialization's and data's seed (default 0),
SHAPE the width, blocks and heads (default 128,4,4).
Prints rank 0's line: the mean training loss of the last 20 steps over
both ranks, the loss of the final (agreed) model on 20 fresh batches
(final_loss), and the bytes per step as a share of the dense ring's
4 d 2 (n - 1) / n. PYTHONPATH must reach the package (build/python).
"""
import glob
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

CONTEXT, BATCH, LR = 64, 16, float(os.environ.get("LR", "3e-3"))


def corpus():
    text = []
    for path in sorted(glob.glob("/usr/lib/python3.11/*.py"))[:120]:
        with open(path, encoding="utf-8", errors="replace") as f:
            text.append(f.read())
    data = "".join(text)
    data = "".join(c if 32 <= ord(c) < 127 or c == "\n" else "?" for c in data)
    alphabet = sorted(set(data))
    index = {c: i for i, c in enumerate(alphabet)}
    return torch.tensor([index[c] for c in data], dtype=torch.long), len(alphabet)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, vocab, d, layers, heads):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.position = nn.Parameter(torch.zeros(CONTEXT, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.position, std=0.02)
        self.register_buffer("mask", torch.triu(torch.full((CONTEXT, CONTEXT), float("-inf")), 1))

    def forward(self, ids):
        x = self.embed(ids) + self.position[: ids.shape[1]]
        for block in self.blocks:
            x = block(x, self.mask[: ids.shape[1], : ids.shape[1]])
        return self.head(self.ln(x))


def worker(rank, world, name, steps, options, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29533"))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    data, vocab = corpus()
    seed = int(os.environ.get("SEED", "0"))
    torch.manual_seed(seed)
    shape = [int(v) for v in os.environ.get("SHAPE", "128,4,4").split(",")]
    local_steps = int(os.environ.get("LOCAL_STEPS", "0"))
    model = Gpt(vocab, *shape) if local_steps else DDP(Gpt(vocab, *shape))
    numel = sum(p.numel() for p in model.parameters())
    state, outer = None, None
    def gradient_optimizer():
        if os.environ.get("OPTIMIZER", "adamw") == "muon":
            import sparsecomm
            return sparsecomm.muon_optimizer(model, lr=LR, weight_decay=0.01)
        return torch.optim.AdamW(model.parameters(), lr=LR)

    if local_steps:
        import sparsecomm
        outer_step = {}
        if "OUTER" in os.environ:
            lr, momentum, nesterov = os.environ["OUTER"].split(",")
            outer_step = dict(outer_lr=float(lr), outer_momentum=float(momentum),
                              outer_nesterov=nesterov == "true")
        outer = sparsecomm.LocalSteps(model, name, local_steps, **outer_step, **options)
        optimizer = gradient_optimizer()
    elif name == "dense":
        optimizer = gradient_optimizer()
    else:
        import sparsecomm
        state = sparsecomm.register(model, name, **options)
        if state.hands_direction:
            optimizer = sparsecomm.direction_optimizer(model.parameters(), lr=LR,
                                                       weight_decay=0.01, hook=state)
        else:
            optimizer = gradient_optimizer()
    generator = torch.Generator().manual_seed(1000 + 100 * seed + rank)
    losses, sent = [], 0
    for step in range(steps):
        starts = torch.randint(0, data.numel() - CONTEXT - 1, (BATCH,), generator=generator)
        x = torch.stack([data[s:s + CONTEXT] for s in starts])
        y = torch.stack([data[s + 1:s + CONTEXT + 1] for s in starts])
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if state is not None:
            sent += state.metrics["bytes_sent"]
        if outer is not None:
            metrics = outer.step()
            sent += metrics["bytes_sent"] if metrics else 0
    if outer is not None and outer.inner_steps % local_steps:
        sent += outer.synchronize()["bytes_sent"]
    evaluation = torch.Generator().manual_seed(7)
    with torch.no_grad():
        final = 0.0
        for _ in range(20):
            starts = torch.randint(0, data.numel() - CONTEXT - 1, (BATCH,), generator=evaluation)
            x = torch.stack([data[s:s + CONTEXT] for s in starts])
            y = torch.stack([data[s + 1:s + CONTEXT + 1] for s in starts])
            final += nn.functional.cross_entropy(model(x).reshape(-1, vocab),
                                                 y.reshape(-1)).item() / 20
    tail = torch.tensor(sum(losses[-20:]) / 20)
    dist.all_reduce(tail)
    if rank == 0:
        dense_bytes = 4 * numel * 2 * (world - 1) / world
        result = {"name": name, "lr": LR, "optimizer": os.environ.get("OPTIMIZER", "adamw"),
                  "shape": os.environ.get("SHAPE", "128,4,4"),
                  "options": options, "steps": steps, "params": numel,
                  "seed": seed, "local_steps": local_steps, "outer": os.environ.get("OUTER", ""),
                  "first_loss": losses[0], "last20_loss": tail.item() / world,
                  "final_loss": final,
                  "bytes_share": (sent / steps / dense_bytes) if sent else 1.0}
        print(json.dumps(result))
        with open(out, "a") as f:
            f.write(json.dumps(result) + "\n")
    dist.destroy_process_group()
    # Torch 1.13's DDP can deadlock at exit in its reducer's destructor (the
    # gloo thread's join against the GIL); the result is written: leave now.
    sys.stdout.flush()
    os._exit(0)


def parse(value):
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


if __name__ == "__main__":
    name, steps = sys.argv[1], int(sys.argv[2])
    options = dict(arg.split("=", 1) for arg in sys.argv[3:])
    options = {k: parse(v) for k, v in options.items()}
    mp.spawn(worker, args=(2, name, steps, options, os.environ.get("OUT", "ddp-check.jsonl")),
             nprocs=2)
