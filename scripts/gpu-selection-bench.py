#!/usr/bin/env python3
"""Selection on a GPU against its floor: for n float32 gradient elements,
the device's copy bandwidth (read n, write n: the floor of any pass over a
gradient), torch.topk of |g| at k = density * n (exact Top-k as PyTorch
gives it), and a threshold selection written in torch operations (|g| >=
t, the indices and values of the hits: what a threshold scheme does once
it knows t). Times are CUDA-event medians over --repeats runs after a
warm-up; every ratio is measured in this run. scripts/gpu-check.sh runs
it; --device cpu runs it here (small sizes) to check the script itself.

    scripts/gpu-selection-bench.py [--sizes 25e6,100e6,1e9] [--density 0.001] [--device cuda]
"""

import argparse
import json
import statistics
import sys
import time

import torch


def timed(device, fn, repeats):
    """Median seconds of fn() over `repeats` runs, after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            begin = time.perf_counter()
            fn()
            times.append(time.perf_counter() - begin)
    return statistics.median(times)


def threshold_for(gradient, k):
    """The k-th largest |g| of a sample (the estimate a threshold scheme
    keeps between steps); the bench times the selection given it."""
    sample = gradient[torch.randint(gradient.numel(), (min(gradient.numel(), 1 << 20),),
                                    device=gradient.device)].abs()
    rank = max(1, int(round(sample.numel() * k / gradient.numel())))
    return torch.topk(sample, rank).values[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="25e6,100e6,1e9",
                        help="comma-separated element counts")
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu-selection-bench: torch sees no CUDA device (torch.cuda.is_available() is "
                 "False); run it on a GPU machine, or pass --device cpu")
    if not 0 < args.density < 1:
        sys.exit(f"gpu-selection-bench: --density must be in (0, 1), got {args.density}")
    try:
        sizes = [int(float(s)) for s in args.sizes.split(",")]
    except ValueError:
        sys.exit(f"gpu-selection-bench: --sizes takes numbers like 25e6,100e6, got {args.sizes!r}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"# {name}, torch {torch.__version__}, density {args.density}")
    print("| elements | copy (read + write) | torch.topk | threshold select (torch ops) "
          "| threshold vs copy bandwidth | topk / threshold |")
    print("|---|---|---|---|---|---|")
    for n in sizes:
        generator = torch.Generator(device=device).manual_seed(n)
        gradient = torch.randn(n, device=device, generator=generator)
        k = max(1, int(n * args.density))
        copy = torch.empty_like(gradient)
        copy_s = timed(device, lambda: copy.copy_(gradient), args.repeats)
        del copy
        topk_s = timed(device, lambda: torch.topk(gradient.abs(), k, sorted=False), args.repeats)
        threshold = threshold_for(gradient, k)

        def select():
            indices = torch.nonzero(gradient.abs() >= threshold).squeeze(1)
            return indices, gradient[indices]
        select_s = timed(device, select, args.repeats)
        hits = select()[0].numel()
        bandwidth = 2 * 4 * n / copy_s
        # The selection reads n and writes (index, value) per hit.
        select_bandwidth = (4 * n + 12 * hits) / select_s
        row = {"elements": n, "k": k, "hits": hits, "copy_s": copy_s, "topk_s": topk_s,
               "threshold_select_s": select_s, "copy_gbs": bandwidth / 1e9,
               "select_gbs": select_bandwidth / 1e9}
        print(f"| {n:.3g} | {copy_s * 1e3:.2f} ms ({bandwidth / 1e9:.0f} GB/s) "
              f"| {topk_s * 1e3:.2f} ms | {select_s * 1e3:.2f} ms ({hits} hits) "
              f"| {select_bandwidth / bandwidth:.0%} | {topk_s / select_s:.1f}x |")
        print(json.dumps(row), file=sys.stderr)
        del gradient
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
