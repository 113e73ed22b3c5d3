#!/usr/bin/env bash
# Wall time and machine load of each tier of `make test`, so that a slow run explains itself.
#
#   scripts/tier.sh begin                 start a run: the machine's state, an empty tier list
#   scripts/tier.sh run NAME COMMAND...   run one tier: state before, its wall time, state after
#   scripts/tier.sh start NAME COMMAND... run one tier in the background (its output to a file)
#   scripts/tier.sh wait NAME             wait for a background tier: its output, time and status
#   scripts/tier.sh summary               every tier's time, their sum and the run's wall time
#
# A background tier overlaps one that runs in the foreground: `make test` installs the real vLLM
# (downloads, unpacking, a model conversion: mostly one core or the network) while the unit tests
# run (one core), so the sum of the tier times exceeds the wall time.
#
# The state is one line: load average (1/5/15 min), cores, free and available memory, and any
# real vLLM servers already running (each one's engine busy-polls part of a core, so a server left
# behind by an earlier session slows everything on a 2-core machine). After a tier, the processes
# that used the most CPU are named too. Tier times go to TITO_TIER_LOG (default out/test-tiers.tsv).
set -uo pipefail

LOG=${TITO_TIER_LOG:-out/test-tiers.tsv}
BACKGROUND=$(dirname "$LOG")/tiers

state() {
    local load mem_total mem_free mem_avail servers
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    read -r mem_total mem_free mem_avail < <(
        awk '/^MemTotal:/ {t=$2} /^MemFree:/ {f=$2} /^MemAvailable:/ {a=$2}
             END {printf "%.1f %.1f %.1f\n", t/1048576, f/1048576, a/1048576}' /proc/meminfo
    )
    servers=$(vllm_servers)
    printf 'load %s | %s cores | memory %s GiB free, %s available of %s | vLLM servers: %s' \
        "$load" "$(nproc)" "$mem_free" "$mem_avail" "$mem_total" "${servers:-none}"
}

# Ports of the real vLLM API servers running on this machine (any user, any session).
vllm_servers() {
    local ports
    ports=$(ps -eo args= 2>/dev/null |
        awk '/vllm\.entrypoints\.openai\.api_server/ && !/awk/ {
                 for (i = 1; i < NF; i++) if ($i == "--port") print $(i + 1) }' |
        sort -un | paste -sd, -)
    [ -n "$ports" ] && echo "port $ports"
}

# The four processes with the most CPU time per second of their life: "pid command args" (cut).
busiest() {
    ps -eo pcpu=,pid=,args= --sort=-pcpu 2>/dev/null | head -4 |
        awk '{cmd = $3; sub(/.*\//, "", cmd); what = cmd " " $4 " " $5
              if ($0 ~ /vllm-venv/) what = ($0 ~ /api_server/ ? "vLLM API server" : "vLLM engine")
              printf "%s%s%% pid %s %s", (NR > 1 ? "; " : ""), $1, $2, substr(what, 1, 40)}'
}

case "${1:-}" in
begin)
    mkdir -p "$(dirname "$LOG")"
    printf 'tier\tseconds\tstatus\tload_after\n' >"$LOG"
    date +%s >"$LOG.begin"
    rm -rf "$BACKGROUND"
    echo "== make test on $(hostname) at $(date -u '+%Y-%m-%d %H:%M:%S') UTC (CI=${CI:-unset})"
    echo "== machine: $(state)"
    ;;
run)
    name=${2:?tier name}
    shift 2
    echo "== tier $name: start | $(state)"
    t0=$(date +%s)
    "$@"
    rc=$?
    secs=$(($(date +%s) - t0))
    status=$([ "$rc" = 0 ] && echo passed || echo "failed (exit $rc)")
    echo "== tier $name: $status in ${secs} s | $(state)"
    echo "== busiest processes (CPU % over their lifetime): $(busiest)"
    if [ -f "$LOG" ]; then
        printf '%s\t%s\t%s\t%s\n' "$name" "$secs" "$status" "$(cut -d' ' -f1 /proc/loadavg)" >>"$LOG"
    fi
    exit "$rc"
    ;;
start)
    name=${2:?tier name}
    shift 2
    mkdir -p "$BACKGROUND"
    rm -f "$BACKGROUND/$name.done"
    echo "== tier $name: start in the background (output: $BACKGROUND/$name.log) | $(state)"
    (
        t0=$(date +%s)
        "$@" >"$BACKGROUND/$name.log" 2>&1
        rc=$?
        printf '%s %s %s\n' "$rc" "$(($(date +%s) - t0))" "$(cut -d' ' -f1 /proc/loadavg)" \
            >"$BACKGROUND/$name.done.tmp"
        mv "$BACKGROUND/$name.done.tmp" "$BACKGROUND/$name.done"
    ) &
    ;;
wait)
    name=${2:?tier name}
    [ -f "$BACKGROUND/$name.log" ] || { echo "== tier $name was never started" >&2; exit 2; }
    echo "== tier $name: waiting for it | $(state)"
    while [ ! -f "$BACKGROUND/$name.done" ]; do sleep 2; done
    read -r rc secs load <"$BACKGROUND/$name.done"
    cat "$BACKGROUND/$name.log"
    status=$([ "$rc" = 0 ] && echo passed || echo "failed (exit $rc)")
    echo "== tier $name (background): $status in ${secs} s | $(state)"
    if [ -f "$LOG" ]; then
        printf '%s\t%s\t%s\t%s\n' "$name (bg)" "$secs" "$status" "$load" >>"$LOG"
    fi
    exit "$rc"
    ;;
summary)
    [ -f "$LOG" ] || exit 0
    echo "== make test: wall time per tier (load average at its end; (bg): ran beside the others)"
    awk -F'\t' 'NR > 1 {printf "   %-22s %6d s  %-8s load %s\n", $1, $2, $3, $4; total += $2}
                END {printf "   %-22s %6d s\n", "sum of tiers", total}' "$LOG"
    if [ -f "$LOG.begin" ]; then
        printf '   %-22s %6d s\n' "wall time" "$(($(date +%s) - $(cat "$LOG.begin")))"
    fi
    ;;
*)
    echo "usage: $0 begin | run NAME COMMAND... | start NAME COMMAND... | wait NAME | summary" >&2
    exit 2
    ;;
esac
