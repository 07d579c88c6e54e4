#!/usr/bin/env python3
# slow-head client: sends a head of SIZE bytes 1 byte per GAP_US (busy-wait
# pacing), reads the answer; prints the proxy's CPU time (utime+stime ticks
# from /proc/PID/stat) over the send.
import socket, sys, time, os
port, size, gap_us, pid = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
def cpu():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
line = int(sys.argv[5]) if len(sys.argv) > 5 else 2048
head = b"GET / HTTP/1.1\r\nHost: x\r\n"
i = 0
while len(head) + line + 2 <= size:
    pre = b"X-F%d: " % i
    head += pre + b"v" * (line - len(pre) - 2) + b"\r\n"
    i += 1
head += b"X-Pad: " + b"p" * (size - len(head) - 9) + b"\r\n" if size - len(head) > 9 else b""
head += b"\r\n"
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
c0 = cpu(); t0 = time.perf_counter()
gap = gap_us / 1e6
nxt = time.perf_counter()
for j in range(len(head)):
    s.send(head[j:j+1])
    nxt += gap
    while time.perf_counter() < nxt:
        pass
s.settimeout(20)
r = s.recv(100)
t1 = time.perf_counter(); c1 = cpu()
print(len(head), i, round(t1 - t0, 2), c1 - c0, r.split(b"\r\n")[0].decode())
