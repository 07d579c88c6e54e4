#!/usr/bin/env bash
# The README's test command: installs the tools the tests spawn when they are
# missing, then runs every test of the workspace (`cargo test --workspace`,
# extra arguments passed on).
#
# The tests need, besides the Rust toolchain:
#   /usr/bin/promtool  (Debian package prometheus)  lints /metrics
#   kill(1)            (Debian package procps)       signals the zgix under test
#   curl, openssl      (Debian packages curl, openssl) real TLS clients of the TLS tests
#   redis-server       (Debian package redis-server) the fleet tests' shared Redis
#   nginx              (Debian package nginx)        the TLS origin of proxy/tests/tls_upstream.rs
#   python3            (Debian package python3)      the Python `ssl` client of proxy/tests/tls_hello.rs
#   h2load             (Debian package nghttp2-client) the HTTP/2 tests' load client
#   chromium           (Debian package chromium)     renders the admin status page headless (proxy/tests/admin_status.rs)
# As root, missing ones are installed with apt-get; otherwise the script stops
# and names the packages to install.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
[ -x /usr/bin/promtool ] || missing+=(prometheus)
{ [ -x /bin/kill ] || [ -x /usr/bin/kill ]; } || missing+=(procps)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v h2load >/dev/null 2>&1 || missing+=(nghttp2-client)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v nginx >/dev/null 2>&1 || missing+=(nginx)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "scripts/test.sh: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "scripts/test.sh: the tests need the package(s) ${missing[*]}; install them" \
            "(as root: apt-get install ${missing[*]}) and run this again" >&2
        exit 1
    fi
fi

# io_uring rings live in locked memory: raise the limit where allowed (see README).
ulimit -l unlimited 2>/dev/null || ulimit -l 65536 2>/dev/null || true

# With arguments they select what to test (e.g. `-p zgix`); without, the whole workspace.
if [ "$#" -gt 0 ]; then
    exec cargo test "$@"
fi
exec cargo test --workspace
