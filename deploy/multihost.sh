#!/usr/bin/env bash
# Run an infer-cluster across machines over ssh: the coordinator on the first host of a hosts
# file, one replica per following line.
#
#   deploy/multihost.sh HOSTS_FILE up [-- ENGINE FLAGS...]
#   deploy/multihost.sh HOSTS_FILE status
#   deploy/multihost.sh HOSTS_FILE down
#
# HOSTS_FILE: one host per line, `#` comments allowed. Line 1 = coordinator. Every other line =
# one replica: `HOST [EXTRA REPLICA FLAGS...]`, e.g. `gpu-node-3 --device-ids 1 --name r3`.
# A host may appear several times (one replica per GPU). The coordinator listens on 0.0.0.0;
# replicas connect to the coordinator host's name as written in the file.
#
# Environment:
#   SSH          ssh command (default: "ssh -o BatchMode=yes -o ConnectTimeout=10")
#   REMOTE_DIR   the repository on every host (default: this repository's path)
#   PYTHON       interpreter on the hosts (default: $REMOTE_DIR/.venv/bin/python)
#   PORT         client port (default 5555; replicas use PORT+1); open both in firewalls
#   RUN_DIR      remote state dir for pid and log files (default: $REMOTE_DIR/run/multihost)
#   AUTH         local key folder from `infer-cluster keygen DIR` (default: $INFER_CLUSTER_AUTH).
#                `up` copies the full folder to the coordinator host and an exported replica-only
#                folder to each replica host (both under $RUN_DIR/keys, mode 0700), and every
#                process runs with --auth. Clients need `keygen DIR --export client OUT`.
#   INSECURE=1   run without keys: anyone who reaches the ports can use and control the cluster
#                and register fake replicas. Without AUTH or INSECURE=1, `up` refuses.
set -euo pipefail

[ $# -ge 2 ] || { sed -n '2,26p' "$0"; exit 2; }
HOSTS_FILE="$1"; CMD="$2"; shift 2
[ "${1:-}" = "--" ] && shift
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SSH="${SSH:-ssh -o BatchMode=yes -o ConnectTimeout=10}"
REMOTE_DIR="${REMOTE_DIR:-$ROOT}"
PYTHON="${PYTHON:-$REMOTE_DIR/.venv/bin/python}"
PORT="${PORT:-5555}"
RUN_DIR="${RUN_DIR:-$REMOTE_DIR/run/multihost}"
AUTH="${AUTH:-${INFER_CLUSTER_AUTH:-}}"
KEYS="$RUN_DIR/keys"
LOCAL_PYTHON="${LOCAL_PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}"

mapfile -t LINES < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$HOSTS_FILE")
[ "${#LINES[@]}" -ge 2 ] || { echo "multihost.sh: $HOSTS_FILE needs a coordinator line and at least one replica line" >&2; exit 1; }
read -r COORD_HOST _ <<<"${LINES[0]}"

remote() {  # remote HOST SCRIPT: run a bash script on HOST in the repository
    local host="$1" script="$2"
    $SSH "$host" "cd $(printf %q "$REMOTE_DIR") && export PYTHONPATH=$(printf %q "$REMOTE_DIR") && $script"
}

start_remote() {  # start_remote HOST NAME ARGS...: detached, pid + log under RUN_DIR
    local host="$1" name="$2"; shift 2
    local args; args="$(printf '%q ' "$@")"
    remote "$host" "mkdir -p $RUN_DIR/pids $RUN_DIR/logs && \
        if [ -f $RUN_DIR/pids/$name.pid ] && kill -0 \$(cat $RUN_DIR/pids/$name.pid) 2>/dev/null; then \
            echo '$host: $name already running'; else \
            setsid nohup $args >>$RUN_DIR/logs/$name.log 2>&1 </dev/null & echo \$! >$RUN_DIR/pids/$name.pid; \
            echo \"$host: started $name (pid \$!)\"; fi"
}

push_keys() {  # push_keys HOST ROLE: copy what ROLE needs to HOST:$KEYS (full folder for the coordinator)
    local host="$1" role="$2" dir="$AUTH" tmp=""
    if [ "$role" != coordinator ]; then
        tmp="$(mktemp -d)"
        PYTHONPATH="$ROOT" "$LOCAL_PYTHON" -m infer_cluster keygen "$AUTH" --export "$role" "$tmp/keys" >/dev/null
        dir="$tmp/keys"
    fi
    tar -C "$dir" -cf - . | $SSH "$host" "umask 077 && rm -rf $KEYS && mkdir -p $KEYS && tar -C $KEYS -xf -"
    [ -z "$tmp" ] || rm -rf "$tmp"
}

stop_remote() {  # stop_remote HOST NAME: SIGTERM, wait 40 s, SIGKILL
    local host="$1" name="$2"
    remote "$host" "f=$RUN_DIR/pids/$name.pid; [ -f \$f ] || exit 0; p=\$(cat \$f); \
        if kill -TERM \$p 2>/dev/null; then for i in \$(seq 400); do kill -0 \$p 2>/dev/null || break; sleep 0.1; done; \
        kill -0 \$p 2>/dev/null && kill -KILL \$p; echo '$host: stopped $name'; fi; rm -f \$f"
}

case "$CMD" in
    up)
        if [ -n "$AUTH" ]; then
            security=(--auth "$KEYS")
            push_keys "$COORD_HOST" coordinator
            declare -A pushed=(["$COORD_HOST"]=1)
        elif [ "${INSECURE:-0}" = 1 ]; then
            security=(--insecure)
        else
            echo "multihost.sh: the coordinator listens on 0.0.0.0; set AUTH=DIR (keys from" \
                 "\`infer-cluster keygen DIR\`) or INSECURE=1 for a trusted network" >&2
            exit 1
        fi
        start_remote "$COORD_HOST" coordinator "$PYTHON" -m infer_cluster coordinator \
            --host 0.0.0.0 --port "$PORT" --replica-port "$((PORT + 1))" "${security[@]}"
        for ((i = 1; i < ${#LINES[@]}; i++)); do
            read -r host extra <<<"${LINES[$i]}"
            replica_auth=()
            if [ -n "$AUTH" ]; then
                # The coordinator host keeps its full folder; others get the replica key only.
                [ -n "${pushed[$host]:-}" ] || { push_keys "$host" replica; pushed[$host]=1; }
                replica_auth=(--auth "$KEYS")
            fi
            # shellcheck disable=SC2086
            start_remote "$host" "replica-$i" "$PYTHON" -m infer_cluster.worker \
                --coordinator "tcp://$COORD_HOST:$((PORT + 1))" --name "replica-$i-$host" \
                ${replica_auth[@]+"${replica_auth[@]}"} "$@" $extra
        done
        echo "clients connect to tcp://$COORD_HOST:$PORT (check: $0 $HOSTS_FILE status)"
        ;;
    status)
        remote "$COORD_HOST" "a=''; [ -d $KEYS ] && a='--auth $KEYS'; \
            $PYTHON -m infer_cluster --log-level ERROR status --address tcp://127.0.0.1:$PORT \$a"
        ;;
    down)
        stop_remote "$COORD_HOST" coordinator  # first: it drains in-flight requests
        for ((i = 1; i < ${#LINES[@]}; i++)); do
            read -r host _ <<<"${LINES[$i]}"
            stop_remote "$host" "replica-$i"
        done
        ;;
    *) echo "multihost.sh: unknown command $CMD (up, status, down)" >&2; exit 2 ;;
esac
