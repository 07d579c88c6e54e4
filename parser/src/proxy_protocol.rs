//! PROXY protocol v1 (text) and v2 (binary) header parsing, per HAProxy doc/proxy-protocol.txt.
