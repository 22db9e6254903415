#!/usr/bin/env python3
"""Loads for bench/restart.sh.

pause MNT CAIRN N: creates, writes (4 KiB) and fsyncs files in a loop while
`CAIRN restart MNT` runs N times, a second apart; prints each restart's
time and the loop's median and slowest operations.
small MNT N: creates N files of 4 KiB, then (caches dropped) reads them;
prints both rates in files/s.
"""
import os
import subprocess
import sys
import threading
import time


def pause(mnt, cairn, n):
    lat, stop = [], threading.Event()

    def loop():
        i = 0
        while not stop.is_set():
            t = time.perf_counter()
            fd = os.open(f"{mnt}/p{i % 50}", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            os.write(fd, b"x" * 4096)
            os.fsync(fd)
            os.close(fd)
            lat.append(time.perf_counter() - t)
            i += 1

    th = threading.Thread(target=loop)
    th.start()
    time.sleep(1)
    took = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([cairn, "restart", mnt], check=True, capture_output=True)
        took.append(time.perf_counter() - t)
        time.sleep(1)
    stop.set()
    th.join()
    lat.sort()
    print("cairn restart took (ms): " + ", ".join(f"{x * 1e3:.0f}" for x in took))
    print(f"client operations: {len(lat)}, median {lat[len(lat) // 2] * 1e3:.2f} ms, "
          f"slowest {lat[-1] * 1e3:.0f} ms (next: {', '.join(f'{x * 1e3:.0f}' for x in lat[-5:-1])})")


def small(mnt, n):
    d = f"{mnt}/small"
    os.mkdir(d)
    t = time.perf_counter()
    for i in range(n):
        fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b"y" * 4096)
        os.close(fd)
    create = n / (time.perf_counter() - t)
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")
    t = time.perf_counter()
    for i in range(n):
        with open(f"{d}/f{i}", "rb") as f:
            f.read()
    read = n / (time.perf_counter() - t)
    print(f"{create:.0f} {read:.0f}")


if __name__ == "__main__":
    if sys.argv[1] == "pause":
        pause(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        small(sys.argv[2], int(sys.argv[3]))
