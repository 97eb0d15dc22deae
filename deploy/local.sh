#!/usr/bin/env bash
# Run an infer-cluster on this machine in the background: one coordinator + N replicas (+ a gateway).
#
#   deploy/local.sh up [--replicas N] [--port P] [--host H] [--auth DIR | --insecure]
#                      [--http-port P [--api-key-file FILE]] [-- ENGINE FLAGS...]
#   deploy/local.sh status        # processes (pid files) + `infer-cluster status`
#   deploy/local.sh logs [NAME]   # tail the logs (coordinator, replica-0, ...)
#   deploy/local.sh down          # SIGTERM (gateway, then the coordinator drains), SIGKILL after a grace
#
# State lives in $RUN_DIR (default ./run/infer-cluster): pids/NAME.pid, logs/NAME.log, env.
# $PYTHON picks the interpreter (default: .venv/bin/python if present, else python3).
# Unlike `infer-cluster serve`, nothing supervises the processes: use systemd or k8s for that.
# --auth DIR (keys from `infer-cluster keygen DIR`; default: $INFER_CLUSTER_AUTH) turns on CURVE
# auth for every process and for `status`; a --host other than loopback needs it (or --insecure).
# --http-port starts an OpenAI-compatible HTTP gateway on --host once the replicas are ready;
# --api-key-file (one key per line) makes HTTP callers send `Authorization: Bearer KEY`, and a
# non-loopback --host needs it (or --insecure).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RUN_DIR="${RUN_DIR:-$ROOT/run/infer-cluster}"
PYTHON="${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}"
GRACE="${GRACE:-40}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

die() { echo "local.sh: $*" >&2; exit 1; }
pid_of() { cat "$RUN_DIR/pids/$1.pid" 2>/dev/null || true; }
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

start() {  # start NAME ARGS... (detached, own session, logs appended)
    local name="$1"; shift
    alive "$(pid_of "$name")" && die "$name is already running (pid $(pid_of "$name"))"
    setsid nohup "$@" >>"$RUN_DIR/logs/$name.log" 2>&1 < /dev/null &
    echo $! >"$RUN_DIR/pids/$name.pid"
    echo "started $name (pid $!, log $RUN_DIR/logs/$name.log)"
}

up() {
    local replicas=1 port=5555 host=127.0.0.1 auth="${INFER_CLUSTER_AUTH:-}" insecure=()
    local http_port="" api_key_file=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --replicas) replicas="$2"; shift 2 ;;
            --port) port="$2"; shift 2 ;;
            --host) host="$2"; shift 2 ;;
            --auth) auth="$2"; shift 2 ;;
            --insecure) insecure=(--insecure); shift ;;
            --http-port) http_port="$2"; shift 2 ;;
            --api-key-file) api_key_file="$2"; shift 2 ;;
            --) shift; break ;;
            *) die "unknown option $1 (engine flags go after --)" ;;
        esac
    done
    mkdir -p "$RUN_DIR/pids" "$RUN_DIR/logs"
    local connect="$host"; [ "$host" = "0.0.0.0" ] && connect=127.0.0.1
    if [ -n "$auth" ]; then
        auth="$(cd "$auth" 2>/dev/null && pwd)" || die "--auth: no such folder (make one with: infer-cluster keygen DIR)"
        export INFER_CLUSTER_AUTH="$auth"  # every process below, and `status`, use the keys
    else
        unset INFER_CLUSTER_AUTH
    fi
    local key_args=()
    if [ -n "$api_key_file" ]; then
        [ -n "$http_port" ] || die "--api-key-file needs --http-port (it guards the HTTP gateway)"
        [ -r "$api_key_file" ] || die "--api-key-file: cannot read $api_key_file"
        key_args=(--api-key-file "$(cd "$(dirname "$api_key_file")" && pwd)/$(basename "$api_key_file")")
    fi
    printf 'ADDRESS=tcp://%s:%s\nINFER_CLUSTER_AUTH=%s\n' "$connect" "$port" "$auth" >"$RUN_DIR/env"
    start coordinator "$PYTHON" -m infer_cluster coordinator --host "$host" --port "$port" \
        --replica-port "$((port + 1))" ${insecure[@]+"${insecure[@]}"}
    local i
    for ((i = 0; i < replicas; i++)); do
        start "replica-$i" "$PYTHON" -m infer_cluster.worker --coordinator "tcp://$connect:$((port + 1))" \
            --name "replica-$i" "$@"
    done
    echo "waiting for $replicas replica(s) to register on tcp://$connect:$port ..."
    for _ in $(seq 1 300); do
        if "$PYTHON" -m infer_cluster --log-level ERROR status --address "tcp://$connect:$port" --json \
            --timeout 1 2>/dev/null | "$PYTHON" -c "import json,sys; sys.exit(0 if json.load(sys.stdin)['coordinator']['num_replicas'] >= $replicas else 1)"; then
            echo "ready: clients connect to tcp://$connect:$port"
            [ -n "$http_port" ] && start_gateway
            return 0
        fi
        for f in "$RUN_DIR"/pids/*.pid; do
            alive "$(cat "$f")" || die "$(basename "$f" .pid) exited; see $RUN_DIR/logs/$(basename "$f" .pid).log"
        done
        sleep 1
    done
    die "cluster not ready after 300 s; see $RUN_DIR/logs"
}

start_gateway() {  # uses up()'s locals: host, connect, port, http_port, key_args, insecure
    start gateway "$PYTHON" -m infer_cluster gateway --coordinator "tcp://$connect:$port" \
        --host "$host" --port "$http_port" ${key_args[@]+"${key_args[@]}"} ${insecure[@]+"${insecure[@]}"}
    for _ in $(seq 1 60); do
        if "$PYTHON" -c "import sys, urllib.request; urllib.request.urlopen('http://$connect:$http_port/health', timeout=2); sys.exit(0)" 2>/dev/null; then
            echo "ready: HTTP on http://$connect:$http_port/v1"
            return 0
        fi
        alive "$(pid_of gateway)" || die "gateway exited; see $RUN_DIR/logs/gateway.log"
        sleep 1
    done
    die "the HTTP gateway was not healthy after 60 s; see $RUN_DIR/logs/gateway.log"
}

stop_one() {  # stop NAME: SIGTERM, wait up to $GRACE s, SIGKILL
    local name="$1" pid; pid="$(pid_of "$name")"
    if alive "$pid"; then
        kill -TERM "$pid"
        for _ in $(seq 1 $((GRACE * 10))); do alive "$pid" || break; sleep 0.1; done
        alive "$pid" && { echo "$name did not stop in ${GRACE}s; killing"; kill -KILL "$pid"; }
        echo "stopped $name"
    fi
    rm -f "$RUN_DIR/pids/$name.pid"
}

down() {
    [ -d "$RUN_DIR/pids" ] || { echo "nothing running (no $RUN_DIR/pids)"; return 0; }
    stop_one gateway      # first: no new HTTP requests
    stop_one coordinator  # then: it drains in-flight requests while replicas still run
    local f
    for f in "$RUN_DIR"/pids/replica-*.pid; do [ -e "$f" ] && stop_one "$(basename "$f" .pid)"; done
    return 0
}

status() {
    compgen -G "$RUN_DIR/pids/*.pid" >/dev/null || { echo "nothing running (no pid files in $RUN_DIR/pids)"; return 1; }
    local f name pid
    for f in "$RUN_DIR"/pids/*.pid; do
        [ -e "$f" ] || continue
        name="$(basename "$f" .pid)"; pid="$(cat "$f")"
        if alive "$pid"; then echo "$name: running (pid $pid)"; else echo "$name: NOT running (stale pid $pid)"; fi
    done
    # shellcheck disable=SC1091
    [ -f "$RUN_DIR/env" ] && . "$RUN_DIR/env" && INFER_CLUSTER_AUTH="${INFER_CLUSTER_AUTH:-}" \
        "$PYTHON" -m infer_cluster --log-level ERROR status --address "$ADDRESS"
}

logs() { tail -n 50 -F "$RUN_DIR/logs/${1:-coordinator}.log"; }

case "${1:-}" in
    up) shift; up "$@" ;;
    down) down ;;
    status) status ;;
    logs) shift; logs "$@" ;;
    *) sed -n '2,17p' "$0"; exit 2 ;;
esac
