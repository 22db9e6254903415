#!/usr/bin/env python3
"""A small-file NFS client for bench/share.sh, over libnfs (libnfs13,
Debian's libnfs-utils) through ctypes, so that every file is one
create-write-close (or open-read-close) in one NFSv4 session instead of one
process per file as with nfs-cp.

  share_nfs.py URL put DIR N SIZE   create DIR and N files of SIZE bytes in it
  share_nfs.py URL get DIR N SIZE   read them back, checking their length
  share_nfs.py URL write NAME LOCAL 0 0   copy the local file LOCAL to NAME

URL is nfs://HOST/EXPORT?version=4&nfsport=PORT. Prints the seconds taken.
Writes go out in WRITEs of at most CHUNK bytes: libnfs 4.0 (Debian 12)
fails to encode an NFSv4 WRITE of about 4000 bytes or more ("ZDR error:
Failed to encode COMPOUND4args"), which is also why nfs-cp cannot write
a file of 4 KiB or more over NFSv4.
"""
import ctypes
import os
import sys
import time

CHUNK = 3072


class Url(ctypes.Structure):
    _fields_ = [("server", ctypes.c_char_p), ("path", ctypes.c_char_p), ("file", ctypes.c_char_p)]


def library():
    lib = ctypes.CDLL("libnfs.so.13")
    vp, cp = ctypes.c_void_p, ctypes.c_char_p
    lib.nfs_init_context.restype = vp
    lib.nfs_get_error.restype = cp
    lib.nfs_get_error.argtypes = [vp]
    lib.nfs_parse_url_dir.restype = ctypes.POINTER(Url)
    lib.nfs_parse_url_dir.argtypes = [vp, cp]
    lib.nfs_mount.argtypes = [vp, cp, cp]
    lib.nfs_mkdir.argtypes = [vp, cp]
    lib.nfs_open2.argtypes = [vp, cp, ctypes.c_int, ctypes.c_int, ctypes.POINTER(vp)]
    lib.nfs_open.argtypes = [vp, cp, ctypes.c_int, ctypes.POINTER(vp)]
    lib.nfs_write.argtypes = [vp, vp, ctypes.c_uint64, cp]
    lib.nfs_read.argtypes = [vp, vp, ctypes.c_uint64, ctypes.c_void_p]
    lib.nfs_close.argtypes = [vp, vp]
    return lib


def main():
    url, op, d = sys.argv[1], sys.argv[2], sys.argv[3]
    n, size = (0, 0) if op == "write" else (int(sys.argv[4]), int(sys.argv[5]))
    lib = library()
    nfs = lib.nfs_init_context()

    def check(r, what):
        if r < 0:
            sys.exit(f"share_nfs.py: {what}: {lib.nfs_get_error(nfs).decode()}")
        return r

    u = lib.nfs_parse_url_dir(nfs, url.encode())
    if not u:
        sys.exit(f"share_nfs.py: {url}: {lib.nfs_get_error(nfs).decode()}")
    check(lib.nfs_mount(nfs, u.contents.server, u.contents.path), "mount")
    buf = ctypes.create_string_buffer(size + 1)
    fh = ctypes.c_void_p()
    create = os.O_CREAT | os.O_WRONLY | os.O_TRUNC

    def write_all(path, data):
        check(lib.nfs_open2(nfs, path, create, 0o644, ctypes.byref(fh)), f"create {path}")
        for at in range(0, len(data), CHUNK):
            part = data[at:at + CHUNK]
            check(lib.nfs_write(nfs, fh, len(part), part), f"write {path}")
        check(lib.nfs_close(nfs, fh), f"close {path}")

    if op == "write":
        data = open(sys.argv[4], "rb").read()
        t = time.monotonic()
        write_all(f"/{d}".encode(), data)
        print(f"{time.monotonic() - t:.6f}")
        return
    data = os.urandom(size)
    t = time.monotonic()
    if op == "put":
        check(lib.nfs_mkdir(nfs, f"/{d}".encode()), f"mkdir /{d}")
    for i in range(n):
        path = f"/{d}/f{i}".encode()
        if op == "put":
            write_all(path, data)
            continue
        check(lib.nfs_open(nfs, path, os.O_RDONLY, ctypes.byref(fh)), f"open {path}")
        got = check(lib.nfs_read(nfs, fh, size + 1, buf), f"read {path}")
        if got != size:
            sys.exit(f"share_nfs.py: {path}: {got} bytes, not {size}")
        check(lib.nfs_close(nfs, fh), f"close {path}")
    print(f"{time.monotonic() - t:.6f}")


if __name__ == "__main__":
    main()
