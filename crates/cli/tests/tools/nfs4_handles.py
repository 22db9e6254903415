#!/usr/bin/env python3
"""A minimal NFSv4.0 client that works by file handle, for sharing.rs: it
asks a server for the handle of a path, and later (after the server and
the Cairn daemon under it were restarted) reads a file or lists a
directory through that handle alone, as a kernel NFS client does after a
server reboot. libnfs's tools cannot: they walk the path again each time.

  nfs4_handles.py PORT handle PATH     print the hex handle of /PATH
  nfs4_handles.py PORT read HEXFH      print the file's bytes
  nfs4_handles.py PORT list HEXFH      print the directory's names, one a line

The server is 127.0.0.1:PORT; AUTH_SYS as root. A read uses the anonymous
(all-zero) stateid, so no client id or open state is needed. An NFS error
prints its name and number on stderr and exits 3; anything else malformed
exits 2.
"""
import os
import socket
import struct
import sys

NFS4_PROGRAM, NFS_V4, COMPOUND = 100003, 4, 1
OP_GETFH, OP_LOOKUP, OP_PUTFH, OP_PUTROOTFH, OP_READ, OP_READDIR = 10, 15, 22, 24, 25, 26
ERRORS = {2: "NFS4ERR_NOENT", 70: "NFS4ERR_STALE", 10001: "NFS4ERR_BADHANDLE",
          10014: "NFS4ERR_FHEXPIRED", 10025: "NFS4ERR_BAD_STATEID"}


class NfsError(Exception):
    def __init__(self, op, status):
        super().__init__(f"op {op}: {ERRORS.get(status, 'error')} ({status})")
        self.status = status


def u32(v):
    return struct.pack(">I", v)


def u64(v):
    return struct.pack(">Q", v)


def opaque(b):
    return u32(len(b)) + b + b"\0" * (-len(b) % 4)


class Reader:
    def __init__(self, buf):
        self.buf, self.at = buf, 0

    def u32(self):
        v, = struct.unpack_from(">I", self.buf, self.at)
        self.at += 4
        return v

    def u64(self):
        v, = struct.unpack_from(">Q", self.buf, self.at)
        self.at += 8
        return v

    def fixed(self, n):
        b = self.buf[self.at:self.at + n]
        if len(b) != n:
            raise ValueError("reply too short")
        self.at += n + (-n % 4)
        return b

    def opaque(self):
        return self.fixed(self.u32())


def call(port, ops):
    """Sends one COMPOUND of (opcode, args) and returns a Reader at the
    first result."""
    cred = u32(0) + opaque(b"cairn-test") + u32(0) + u32(0) + u32(0)
    xid = int.from_bytes(os.urandom(4), "big")
    body = (u32(xid) + u32(0) + u32(2) + u32(NFS4_PROGRAM) + u32(NFS_V4) + u32(COMPOUND)
            + u32(1) + opaque(cred) + u32(0) + u32(0)
            + opaque(b"") + u32(0) + u32(len(ops)) + b"".join(u32(op) + args for op, args in ops))
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(u32(0x80000000 | len(body)) + body)
        reply = b""
        while True:
            mark = recv_exact(s, 4)
            n, = struct.unpack(">I", mark)
            reply += recv_exact(s, n & 0x7FFFFFFF)
            if n & 0x80000000:
                break
    r = Reader(reply)
    if r.u32() != xid or r.u32() != 1 or r.u32() != 0:
        raise ValueError("not an accepted reply to this call")
    r.u32(), r.opaque()  # the server's verifier
    if r.u32() != 0:
        raise ValueError("the server did not run the call")
    r.u32(), r.opaque(), r.u32()  # compound status (checked per op), tag, count
    return r


def result(r, op):
    """Checks the next result is op's and succeeded."""
    got, status = r.u32(), r.u32()
    if got != op:
        raise ValueError(f"result for op {got}, expected {op}")
    if status != 0:
        raise NfsError(op, status)


def handle(port, path):
    names = [n for n in path.split("/") if n]
    r = call(port, [(OP_PUTROOTFH, b"")] + [(OP_LOOKUP, opaque(n.encode())) for n in names]
             + [(OP_GETFH, b"")])
    result(r, OP_PUTROOTFH)
    for _ in names:
        result(r, OP_LOOKUP)
    result(r, OP_GETFH)
    return r.opaque()


def read(port, fh):
    data, offset = b"", 0
    while True:
        anonymous = u32(0) + b"\0" * 12
        r = call(port, [(OP_PUTFH, opaque(fh)), (OP_READ, anonymous + u64(offset) + u32(65536))])
        result(r, OP_PUTFH)
        result(r, OP_READ)
        eof, chunk = r.u32(), r.opaque()
        data += chunk
        offset += len(chunk)
        if eof or not chunk:
            return data


def listing(port, fh):
    names, cookie, verf = [], 0, b"\0" * 8
    while True:
        args = u64(cookie) + verf + u32(8192) + u32(32768) + u32(0)
        r = call(port, [(OP_PUTFH, opaque(fh)), (OP_READDIR, args)])
        result(r, OP_PUTFH)
        result(r, OP_READDIR)
        verf = r.fixed(8)
        while r.u32():
            cookie = r.u64()
            names.append(r.opaque().decode("utf-8", "replace"))
            r.fixed(4 * r.u32()), r.opaque()  # attribute mask and values
        if r.u32():
            return names


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        part = s.recv(n - len(buf))
        if not part:
            raise ValueError("connection closed")
        buf += part
    return buf


def main(argv):
    if len(argv) != 4 or argv[2] not in ("handle", "read", "list"):
        print(__doc__, file=sys.stderr)
        return 2
    port, verb, arg = int(argv[1]), argv[2], argv[3]
    try:
        if verb == "handle":
            print(handle(port, arg).hex())
        elif verb == "read":
            sys.stdout.buffer.write(read(port, bytes.fromhex(arg)))
        else:
            print("\n".join(listing(port, bytes.fromhex(arg))))
    except NfsError as e:
        print(e, file=sys.stderr)
        return 3
    except (ValueError, OSError, struct.error) as e:
        print(f"nfs4_handles: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
