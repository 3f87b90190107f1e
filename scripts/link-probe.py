#!/usr/bin/python3
"""Times messages sent after an idle spell over one emulated link, to see
whether a burst leaves at the link rate (as from a NIC) or at memory speed
(a token bucket refilled while the link was idle).

    ip netns exec sc1 scripts/link-probe.py serve 10.77.0.2 &
    ip netns exec sc0 scripts/link-probe.py probe 10.77.0.2

`probe` sends messages of 4 KiB to 1 MiB, each after 50 ms of silence, and
waits for a one-byte reply; it prints the median time of 12 and the rate it
implies. The reply and the Python overhead add a fixed ~0.2 ms, which
dominates the smallest sizes. `serve` answers until the prober leaves.
"""
import socket
import sys
import time

PORT = 5555
SIZES = [4096, 16384, 32768, 65536, 262144, 1 << 20]


def serve(address):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, PORT))
    listener.listen(1)
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        header = conn.recv(8, socket.MSG_WAITALL)
        if len(header) < 8:
            return
        size = int.from_bytes(header, "little")
        got = 0
        while got < size:
            chunk = conn.recv(min(1 << 20, size - got))
            if not chunk:
                return
            got += len(chunk)
        conn.sendall(b"k")


def probe(address):
    for _ in range(50):  # the server may still be starting
        try:
            conn = socket.create_connection((address, PORT))
            break
        except ConnectionRefusedError:
            time.sleep(0.1)
    else:
        sys.exit(f"link-probe: nothing listens on {address}:{PORT}; start `serve` first")
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    print(f"{'bytes':>8}  {'median us':>10}  {'Mbit/s':>8}")
    for size in SIZES:
        times = []
        for _ in range(12):
            time.sleep(0.05)  # idle: a token bucket refills
            start = time.perf_counter()
            conn.sendall(size.to_bytes(8, "little") + b"x" * size)
            conn.recv(1)
            times.append(time.perf_counter() - start)
        median = sorted(times)[len(times) // 2]
        print(f"{size:8d}  {median * 1e6:10.0f}  {size * 8 / median / 1e6:8.1f}")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("serve", "probe"):
        sys.exit(__doc__)
    (serve if sys.argv[1] == "serve" else probe)(sys.argv[2])


if __name__ == "__main__":
    main()
