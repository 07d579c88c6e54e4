#!/usr/bin/env python3
# RSS per idle TLS connection (scripts/bench-tls.sh --idle N): opens N TLS
# connections to 127.0.0.1:PORT (handshake done, nothing sent), reads the
# server's VmRSS, then sends one keep-alive request on each and reads its
# answer, reads VmRSS again, closes all. One JSON line out, RSS in KiB.
#
# Usage: tls-idle-client.py PORT N PID [PID...]  (the PIDs whose VmRSS add up)
import json
import socket
import ssl
import sys
import time

port, n = int(sys.argv[1]), int(sys.argv[2])
pids = sys.argv[3:]
SETTLE = 2.0  # seconds for the server to finish with the last connection


def rss():
    total = 0
    for p in pids:
        with open(f"/proc/{p}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
ctx.minimum_version = ssl.TLSVersion.TLSv1_3
# No ticket to keep: every handshake is a full one, as a new client's.
ctx.options |= ssl.OP_NO_TICKET

start = rss()
conns, failed = [], 0
deadline = time.monotonic() + 120
for _ in range(n):
    if time.monotonic() > deadline:
        break
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        conns.append(ctx.wrap_socket(s, server_hostname="bench.example"))
    except OSError:
        failed += 1
time.sleep(SETTLE)
idle = rss()
ok = 0
for t in conns:
    try:
        t.sendall(b"GET / HTTP/1.1\r\nHost: bench.example\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            b = t.recv(4096)
            if not b:
                break
            head += b
        if head.startswith(b"HTTP/1.1 200"):
            ok += 1
    except OSError:
        pass
time.sleep(SETTLE)
kept = rss()
for t in conns:
    t.close()
print(json.dumps({"start": start, "idle": idle, "kept": kept, "connected": len(conns),
                  "failed": failed, "ok": ok}))
