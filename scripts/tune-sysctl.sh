#!/usr/bin/env bash
# Plans (and with --apply, sets) the kernel and process limits an edge proxy
# box needs: accept backlogs, ephemeral ports, file descriptors, locked memory.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/tune-sysctl.sh [--apply] [--file PATH]

Compares the current values with the ones zgix wants and prints what it would
change. Only raises limits, never lowers one that is already higher.

  net.core.somaxconn            accept queue cap; listen() backlogs above it are cut
  net.ipv4.tcp_max_syn_backlog  half-open connections kept during a SYN burst
  net.core.netdev_max_backlog   packets queued per CPU before the stack drops them
  net.ipv4.ip_local_port_range  ephemeral ports for upstream connections (from 10240,
                                so they stay clear of the usual listener ports; list
                                listener ports in net.ipv4.ip_local_reserved_ports)
  net.ipv4.tcp_tw_reuse         reuse TIME_WAIT ports for new outgoing connections
  fs.file-max, fs.nr_open       system-wide and per-process descriptor ceilings

Also prints the per-process limits (nofile, memlock) as limits.conf lines and
systemd LimitNOFILE / LimitMEMLOCK lines: io_uring needs locked memory, and
glommio fails to start under the usual 8 MiB `ulimit -l`.

  --apply       write PATH (default /etc/sysctl.d/90-zgix.conf), load it with
                sysctl, and write /etc/security/limits.d/90-zgix.conf (root)
  --file PATH   where --apply writes the sysctl settings
  -h, --help    this text
USAGE
}

apply=0 file=/etc/sysctl.d/90-zgix.conf
while [ $# -gt 0 ]; do
    case "$1" in
        --apply) apply=1; shift ;;
        --file) file="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "tune-sysctl: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
done
if [ "$apply" = 1 ] && [ "$(id -u)" != 0 ]; then
    echo "tune-sysctl: --apply needs root" >&2; exit 1
fi

# key target; for the port range the target is "low high" and "raise" means widen.
settings=(
    "net.core.somaxconn 65535"
    "net.ipv4.tcp_max_syn_backlog 65535"
    "net.core.netdev_max_backlog 65536"
    "net.ipv4.ip_local_port_range 10240 65535"
    "net.ipv4.tcp_tw_reuse 1"
    "fs.file-max 4194304"
    "fs.nr_open 4194304"
)
nofile=1048576

current() { sysctl -n "$1" 2>/dev/null | tr -s '\t ' ' ' || true; }

lines=()
printf '%-32s %-18s %-18s %s\n' key current wanted action
for s in "${settings[@]}"; do
    read -r key want <<<"$s"
    cur="$(current "$key")"
    action=keep
    if [ -z "$cur" ]; then
        action="absent here (namespace or old kernel)"
    elif [ "$key" = net.ipv4.ip_local_port_range ]; then
        read -r clo chi <<<"$cur"; read -r wlo whi <<<"$want"
        if [ "$clo" -gt "$wlo" ] || [ "$chi" -lt "$whi" ]; then
            want="$(( clo < wlo ? clo : wlo )) $(( chi > whi ? chi : whi ))"
            action=set
        fi
    elif [ "$key" = net.ipv4.tcp_tw_reuse ]; then
        # 2 (the default) means loopback only; 1 is wanted, not "more".
        [ "$cur" = "$want" ] || action=set
    elif [ "$cur" -lt "$want" ]; then
        action=set
    fi
    printf '%-32s %-18s %-18s %s\n' "$key" "$cur" "$want" "$action"
    [ "$action" = set ] && lines+=("$key = $want")
done

# nr_open bounds LimitNOFILE; never ask for more descriptors than it allows.
nr_open="$(current fs.nr_open)"
if [ -n "$nr_open" ] && [ "$nr_open" -lt "$nofile" ] && [[ " ${lines[*]} " != *"fs.nr_open"* ]]; then
    nofile="$nr_open"
fi

echo
echo "process limits now: nofile $(ulimit -n) (hard $(ulimit -Hn)), memlock $(ulimit -l) KiB (hard $(ulimit -Hl))"
limits_conf="# zgix: descriptors for client + upstream sockets, locked memory for io_uring
*    soft nofile  $nofile
*    hard nofile  $nofile
*    soft memlock unlimited
*    hard memlock unlimited
root soft nofile  $nofile
root hard nofile  $nofile
root soft memlock unlimited
root hard memlock unlimited"
echo "/etc/security/limits.d/90-zgix.conf (login sessions):"
sed 's/^/    /' <<<"$limits_conf"
echo "systemd unit [Service] section (limits.conf does not apply to services):"
echo "    LimitNOFILE=$nofile"
echo "    LimitMEMLOCK=infinity"
echo "for a shell: ulimit -n $nofile; ulimit -l unlimited"

echo
if [ ${#lines[@]} -eq 0 ]; then
    echo "sysctl: nothing to raise"
elif [ "$apply" = 0 ]; then
    echo "would write $file:"
    printf '    %s\n' "${lines[@]}"
    echo "would run: sysctl -p $file"
fi
if [ "$apply" = 0 ]; then
    echo "would write /etc/security/limits.d/90-zgix.conf (above)"
    echo "dry run: nothing changed; rerun with --apply"
    exit 0
fi

if [ ${#lines[@]} -gt 0 ]; then
    { echo "# written by zgix scripts/tune-sysctl.sh"; printf '%s\n' "${lines[@]}"; } >"$file"
    echo "wrote $file"
    # A key the kernel refuses (read-only in a container) is reported and the rest still load.
    for l in "${lines[@]}"; do
        key="${l%% = *}" val="${l#* = }"
        sysctl -q -w "$key=$val" >/dev/null || echo "tune-sysctl: could not set $key (left as is)" >&2
    done
fi
mkdir -p /etc/security/limits.d
printf '%s\n' "$limits_conf" >/etc/security/limits.d/90-zgix.conf
echo "wrote /etc/security/limits.d/90-zgix.conf (applies to new login sessions)"
