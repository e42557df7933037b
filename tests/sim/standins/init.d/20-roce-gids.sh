#!/bin/bash
# Simulated RoCE devices for a simulated Spark (this kernel has no RDMA): a writable /sys/class/infiniband
# laid out like mlx5's, kept in step with the netdevs' IPv4 addresses by a background loop.
#
# SIM_ROCE="ibdev:netdev,..." (default: the first port's twins). Per device and port 1, like a real RoCE port:
# gids/<idx>, gid_attrs/types/<idx> ("IB/RoCE v1" | "RoCE v2"), gid_attrs/ndevs/<idx>; fe80 GIDs (from the
# MAC) at 0 (v1) and 1 (v2), then a v1 and a v2 IPv4-mapped GID per IPv4 address, all-zero entries elsewhere
# (with empty types/ndevs, where real sysfs refuses the read). /sys/class/net/<netdev>/device cannot be made
# in a container, so the netdev link is the other real one: /sys/class/infiniband/<ibdev>/device/net/<netdev>.
set -u
SIM_ROCE=${SIM_ROCE:-rocep1s0f0:enp1s0f0np0,roceP2p1s0f0:enP2p1s0f0np0}
IB=/sys/class/infiniband
TABLE=${SIM_ROCE_TABLE:-16}
ZERO=0000:0000:0000:0000:0000:0000:0000:0000
STATE=/run/sim-roce
mkdir -p "$STATE"

make_writable() {
    [ -d "$IB" ] && [ -w "$IB" ] && return 0
    # /sys is read-only here: put a tmpfs over /sys/class and bind every original class directory back
    mkdir -p "$STATE/class"
    mount --bind /sys/class "$STATE/class" || return 1
    mount -t tmpfs -o mode=0755 sim-sysclass /sys/class || return 1
    for d in "$STATE/class"/*; do
        name=${d##*/}
        mkdir -p "/sys/class/$name" && mount --bind "$d" "/sys/class/$name"
    done
    mkdir -p "$IB"
}

eui64_gid() {  # fe80 GID from a MAC address, the way the kernel derives the default GID
    local IFS=: b
    read -r -a b <<<"$1"
    printf 'fe80:0000:0000:0000:%02x%s:%sff:fe%s:%s%s' $((0x${b[0]} ^ 2)) "${b[1]}" "${b[2]}" "${b[3]}" "${b[4]}" "${b[5]}"
}

mapped_gid() {  # ::ffff:a.b.c.d as sysfs prints it
    local IFS=. o
    read -r -a o <<<"$1"
    printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "${o[0]}" "${o[1]}" "${o[2]}" "${o[3]}"
}

put() {  # atomic write: readers never see a half-written entry
    printf '%s\n' "$2" >"$1.tmp" && mv -f "$1.tmp" "$1"
}

put_empty() {
    : >"$1.tmp" && mv -f "$1.tmp" "$1"
}

sync_device() {
    local ibdev=$1 netdev=$2 port=$IB/$1/ports/1 mac ips sig i gid kind
    mkdir -p "$port/gids" "$port/gid_attrs/types" "$port/gid_attrs/ndevs" "$IB/$ibdev/device/net/$netdev"
    [ -f "$port/link_layer" ] || put "$port/link_layer" Ethernet
    mac=$(cat "/sys/class/net/$netdev/address" 2>/dev/null || true)
    ips=$(ip -o -4 addr show dev "$netdev" 2>/dev/null | awk '{ split($4, a, "/"); print a[1] }' | tr '\n' ' ')
    down=no
    [ -e "/run/sim/roce-down/$ibdev" ] && down=yes  # sim.py link-fault down: the port DOWN, the netdev still up
    sig="$mac|$ips|$down"
    [ "$sig" = "$(cat "$STATE/$ibdev.sig" 2>/dev/null)" ] && return 0
    local -a gids=() kinds=()
    if [ -n "$mac" ]; then
        gid=$(eui64_gid "$mac")
        gids+=("$gid" "$gid") kinds+=("IB/RoCE v1" "RoCE v2")
        for ip in $ips; do
            gid=$(mapped_gid "$ip")
            gids+=("$gid" "$gid") kinds+=("IB/RoCE v1" "RoCE v2")
        done
        if [ "$down" = yes ]; then put "$port/state" "1: DOWN"; else put "$port/state" "4: ACTIVE"; fi
    else
        put "$port/state" "1: DOWN"
    fi
    for ((i = 0; i < TABLE; i++)); do
        if [ "$i" -lt "${#gids[@]}" ]; then
            put "$port/gids/$i" "${gids[$i]}"
            put "$port/gid_attrs/types/$i" "${kinds[$i]}"
            put "$port/gid_attrs/ndevs/$i" "$netdev"
        else
            put "$port/gids/$i" "$ZERO"
            put_empty "$port/gid_attrs/types/$i"
            put_empty "$port/gid_attrs/ndevs/$i"
        fi
    done
    printf '%s' "$sig" >"$STATE/$ibdev.sig"
}

sync_all() {
    local pair
    IFS=, read -r -a pairs <<<"$SIM_ROCE"
    for pair in "${pairs[@]}"; do
        [ -n "$pair" ] && sync_device "${pair%%:*}" "${pair#*:}"
    done
}

if ! make_writable; then
    echo "20-roce-gids: cannot make $IB writable; no simulated RoCE devices" >&2
    exit 0
fi
sync_all
if [ "${SIM_ROCE_ONCE:-0}" != 1 ]; then
    # keep the GID tables in step with address changes (netplan apply), like the kernel does: on each netlink
    # event for an address or a link (`ip monitor`), not by polling (four simulated Sparks polling twice a second
    # took a tenth of this machine). A sync finds nothing to do unless the addresses, the MAC or the port state
    # changed; the 10 s read timeout is a safety net, sim.py's link-fault syncs at once after it marks a port down.
    again="SIM_ROCE_ONCE=1 SIM_ROCE='$SIM_ROCE' SIM_ROCE_TABLE='$TABLE' '$(readlink -f "$0")' 2>/dev/null"
    setsid bash -c "while :; do ip -o monitor address link 2>/dev/null | { $again; while :; do
        read -r -t 10 _; rc=\$?; [ \$rc -eq 0 ] || [ \$rc -gt 128 ] || break; $again; done; }; sleep 1; done" \
        </dev/null >/dev/null 2>&1 &
fi
exit 0
