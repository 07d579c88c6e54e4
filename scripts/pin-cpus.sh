#!/usr/bin/env bash
# Plans (and with --apply, makes) the CPU layout of an edge box for zgix:
# proxy shards on their own cores, IRQs and housekeeping on the rest.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/pin-cpus.sh [--apply] [--housekeeping LIST] [--proxy LIST] [--nic IFACE]

Lists CPUs, SMT siblings and NUMA nodes, then plans:
  - housekeeping CPUs (default: CPU 0 and its SMT siblings) for IRQs, irqbalance,
    ssh, logging;
  - proxy CPUs (default: every other online CPU, on the NIC's NUMA node when
    --nic is given), one zgix shard each;
  - moving every movable IRQ (/proc/irq/*/smp_affinity_list) and the default
    IRQ affinity to the housekeeping CPUs, and stopping irqbalance, which would
    move them back;
  - the `performance` cpufreq governor on the proxy CPUs, where cpufreq exists.
Prints the `"cpus": [...]` line for the zgix config.

Dry run by default: prints what it would do. --apply does it (root needed).
Nothing here survives a reboot; for that add isolcpus/nohz_full/irqaffinity to
the kernel command line (printed as a suggestion).

  --apply              change the box
  --housekeeping LIST  CPUs kept for the system, e.g. 0 or 0,16
  --proxy LIST         CPUs for zgix shards, e.g. 1-7
  --nic IFACE          prefer proxy CPUs on this interface's NUMA node
  -h, --help           this text
USAGE
}

apply=0 hk="" proxy="" nic=""
while [ $# -gt 0 ]; do
    case "$1" in
        --apply) apply=1; shift ;;
        --housekeeping) hk="$2"; shift 2 ;;
        --proxy) proxy="$2"; shift 2 ;;
        --nic) nic="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "pin-cpus: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
done
if [ "$apply" = 1 ] && [ "$(id -u)" != 0 ]; then
    echo "pin-cpus: --apply needs root" >&2; exit 1
fi

# expand LIST: "0-2,5" -> "0 1 2 5"
expand() {
    local part a b out=()
    IFS=, read -r -a parts <<<"$1"
    for part in "${parts[@]}"; do
        [ -n "$part" ] || continue
        if [[ "$part" == *-* ]]; then
            a="${part%-*}" b="${part#*-}"
            out+=($(seq "$a" "$b"))
        else
            out+=("$part")
        fi
    done
    echo "${out[@]}"
}
join_by() { local IFS="$1"; shift; echo "$*"; }
# run CMD...: print in dry-run, execute with --apply (reporting, not stopping, on failure).
run() {
    if [ "$apply" = 1 ]; then
        echo "+ $*"
        bash -c "$*" || echo "pin-cpus: failed (left as is): $*" >&2
    else
        echo "would: $*"
    fi
}

sys=/sys/devices/system/cpu
online="$(cat "$sys/online" 2>/dev/null || echo "0-$(( $(nproc --all) - 1 ))")"
cpus=($(expand "$online"))

echo "== CPUs =="
echo "online: $online (${#cpus[@]} CPUs)"
for node in /sys/devices/system/node/node[0-9]*; do
    [ -d "$node" ] && echo "NUMA $(basename "$node"): CPUs $(cat "$node/cpulist")"
done
[ -d /sys/devices/system/node/node0 ] || echo "NUMA: no node information (single node)"
for c in "${cpus[@]}"; do
    sib="$(cat "$sys/cpu$c/topology/thread_siblings_list" 2>/dev/null || echo "$c")"
    gov="$(cat "$sys/cpu$c/cpufreq/scaling_governor" 2>/dev/null || echo "no cpufreq")"
    echo "cpu$c: SMT siblings $sib, governor $gov"
done

# --- plan ---
if [ -z "$hk" ]; then
    hk="$(cat "$sys/cpu${cpus[0]}/topology/thread_siblings_list" 2>/dev/null || echo "${cpus[0]}")"
fi
hk_list=($(expand "$hk"))
if [ -z "$proxy" ]; then
    pool=("${cpus[@]}")
    if [ -n "$nic" ]; then
        node="$(cat "/sys/class/net/$nic/device/numa_node" 2>/dev/null || echo -1)"
        if [ "$node" -ge 0 ] && [ -r "/sys/devices/system/node/node$node/cpulist" ]; then
            pool=($(expand "$(cat "/sys/devices/system/node/node$node/cpulist")"))
            echo "NIC $nic is on NUMA node $node"
        else
            echo "NIC $nic: no NUMA node reported; using all CPUs"
        fi
    fi
    proxy_list=()
    for c in "${pool[@]}"; do
        [[ " ${hk_list[*]} " == *" $c "* ]] || proxy_list+=("$c")
    done
else
    proxy_list=($(expand "$proxy"))
fi
if [ ${#proxy_list[@]} -eq 0 ]; then
    echo "pin-cpus: only ${#cpus[@]} CPU(s): no core left after housekeeping;" \
        "zgix shares CPU ${cpus[0]} with the system and IRQs stay where they are" >&2
    proxy_list=("${cpus[0]}")
    hk_list=()
fi
for c in "${proxy_list[@]}"; do
    if [[ " ${hk_list[*]} " == *" $c "* ]]; then
        echo "pin-cpus: CPU $c is both housekeeping and proxy" >&2; exit 1
    fi
done

echo
echo "== plan =="
echo "housekeeping CPUs: ${hk_list[*]:-(none)}"
echo "proxy CPUs:        ${proxy_list[*]} (one zgix shard each)"
echo "config line:       \"cpus\": [$(join_by , "${proxy_list[@]}" | sed 's/,/, /g')]"

echo
echo "== actions =="
if [ ${#hk_list[@]} -gt 0 ]; then
    hk_csv="$(join_by , "${hk_list[@]}")"
    if command -v systemctl >/dev/null && systemctl list-unit-files irqbalance.service >/dev/null 2>&1 \
        && systemctl list-unit-files irqbalance.service | grep -q irqbalance; then
        run "systemctl disable --now irqbalance"
    elif [ -f /var/run/irqbalance.pid ]; then
        run "kill \$(cat /var/run/irqbalance.pid)"
    else
        echo "irqbalance: not installed or not running"
    fi
    # default_smp_affinity takes a hex mask, not a list.
    # Bash arithmetic is 64-bit, so the mask is built only for CPUs below 63.
    mask=0 big=0
    for c in "${hk_list[@]}"; do
        if [ "$c" -lt 63 ]; then mask=$(( mask | (1 << c) )); else big=1; fi
    done
    if [ "$big" = 1 ]; then
        echo "default IRQ affinity: housekeeping CPU above 62; set /proc/irq/default_smp_affinity by hand"
    else
        run "echo $(printf '%x' "$mask") > /proc/irq/default_smp_affinity"
    fi
    moved=0
    for f in /proc/irq/[0-9]*/smp_affinity_list; do
        [ -e "$f" ] || continue
        cur="$(cat "$f" 2>/dev/null || echo "?")"
        [ "$cur" = "$hk_csv" ] && continue
        run "echo $hk_csv > $f   # was $cur"
        moved=$((moved + 1))
    done
    echo "IRQs to move: $moved (per-CPU and managed IRQs refuse the write; that is expected)"
else
    echo "IRQs: left alone (no housekeeping CPU)"
fi
for c in "${proxy_list[@]}"; do
    g="$sys/cpu$c/cpufreq/scaling_governor"
    if [ -e "$g" ]; then
        [ "$(cat "$g")" = performance ] || run "echo performance > $g"
    fi
done
[ -e "$sys/cpu${proxy_list[0]}/cpufreq/scaling_governor" ] || echo "governor: no cpufreq here (VM or fixed clock); nothing to do"

echo
echo "== to make it permanent (not done by this script) =="
echo "kernel command line: isolcpus=managed_irq,domain,$(join_by , "${proxy_list[@]}") nohz_full=$(join_by , "${proxy_list[@]}") irqaffinity=$(join_by , "${hk_list[@]:-0}")"
echo "systemd unit for zgix: LimitMEMLOCK=infinity, LimitNOFILE=1048576 (see scripts/tune-sysctl.sh)"
[ "$apply" = 1 ] || echo "dry run: nothing changed; rerun with --apply to do the above"
