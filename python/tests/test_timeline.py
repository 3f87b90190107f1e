"""The hook's timeline=PATH (docs/timeline.md): 2 gloo processes write one
Chrome trace holding each rank's group exchanges, what they contain (the
scheme's selection and exchange, the waits on peers) and the buckets'
arrival, every span of a thread nested or apart."""

import json

from test_ddp_hook import _train


def _hook_writes_a_timeline(rank, world, path):
    state, _ = _train(rank, 3, "exdyna", density=0.05, timeline=path)
    missing = state.finish_timeline()
    assert missing == []
    if rank != 0:
        return
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    names = {}
    threads = {}
    waits = 0
    for e in events:
        if e["ph"] == "M":
            continue
        names.setdefault(e["pid"], set()).add(e["name"])
        if e["ph"] == "X":
            threads.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
            waits += e["cat"] == "wait" and "peer" in e["args"]
    assert sorted(names) == [0, 1]
    for pid, seen in names.items():
        for phase in ("buckets ready", "group exchange", "accumulate", "select", "exchange",
                      "agree finite"):
            assert phase in seen, (pid, phase, seen)
    assert waits > 0
    for spans in threads.values():
        spans.sort(key=lambda s: (s[0], -s[1]))
        open_ends = []
        for begin, end in spans:
            while open_ends and open_ends[-1] <= begin + 1e-3:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + 1e-3
            open_ends.append(end)


def test_the_hook_writes_a_timeline(run_world, tmp_path):
    run_world(2, _hook_writes_a_timeline, str(tmp_path / "hook.json"))
