#!/usr/bin/env bash
# A local multi-host cluster on one machine: N network namespaces joined by a bridge, each with
# one Celery worker and its own data folder; Postgres, Redis and the central repository (served
# by `git daemon`) on the bridge address; the beat (the burst manager's safety net) and the
# database set-up outside the namespaces, as the "control" host. Runs as root.
#
#   scripts/cluster.sh up N          start everything, hosts h1..hN (a fresh database and repository)
#   scripts/cluster.sh down          stop everything it started, remove namespaces, veths, bridge
#   scripts/cluster.sh status        what runs
#   scripts/cluster.sh env           the environment a `manage.py` call needs to talk to the cluster
#   scripts/cluster.sh start hK      (re)start host K's worker      stop hK: stop it (TERM)
#   scripts/cluster.sh kill hK       SIGKILL every process of host K (its namespace's processes)
#   scripts/cluster.sh cut hK        take host K off the network     heal hK: put it back
#   scripts/cluster.sh partition hK SECONDS   cut, wait, heal
#   scripts/cluster.sh redis-restart Redis stopped (its data lost: it keeps none) and started again
#
# Everything is set by the environment; the defaults collide with nothing else the project runs
# (tests 55433/56380, dev 55432/56379). `up` passes every ANNIHILATION_* variable it is given
# (e.g. ANNIHILATION_HEARTBEAT_TTL_S, ANNIHILATION_SCRIPT_DIRS) to the workers and the beat, and
# remembers them for `start`. PIDs and logs live under CLUSTER_HOME; `down` is safe to run twice
# and after a failed `up`.
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLUSTER_HOME=${CLUSTER_HOME:-$ROOT/.annihilation-cluster}
CLUSTER_NET=${CLUSTER_NET:-10.231.0}             # a /24: the bridge is .1, host K is .(10+K)
CLUSTER_BRIDGE=${CLUSTER_BRIDGE:-annbr0}
CLUSTER_NS_PREFIX=${CLUSTER_NS_PREFIX:-ann-}     # namespaces ann-h1..; their veths annbr0-h1..
CLUSTER_PG_PORT=${CLUSTER_PG_PORT:-55440}
CLUSTER_REDIS_PORT=${CLUSTER_REDIS_PORT:-56390}
CLUSTER_GIT_PORT=${CLUSTER_GIT_PORT:-59418}
CLUSTER_DB=${CLUSTER_DB:-annihilation_cluster}
CLUSTER_CONCURRENCY=${CLUSTER_CONCURRENCY:-4}    # each worker's threads (-c)
CLUSTER_SEED_REPO=${CLUSTER_SEED_REPO:-}         # the central repository's seed (default: the demo's)
PY=${CLUSTER_PYTHON:-$ROOT/.venv/bin/python}

ADDR=$CLUSTER_NET.1
SERVICES_HOME=$CLUSTER_HOME/services
RUN=$CLUSTER_HOME/run
LOGS=$CLUSTER_HOME/logs
BARE=$CLUSTER_HOME/git/central.git
ENV_FILE=$CLUSTER_HOME/cluster.env

say() { printf '%s\n' "cluster: $*" >&2; }
die() { printf '%s\n' "cluster: error: $*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" = 0 ] || die "run as root (network namespaces and veths need it)"
    command -v ip >/dev/null 2>&1 || die "no \`ip\` command (apt-get install iproute2)"
}

ns_of() { echo "${CLUSTER_NS_PREFIX}$1"; }
veth_of() { echo "$CLUSTER_BRIDGE-$1"; }
host_index() {
    [[ $1 =~ ^h([0-9]+)$ ]] || die "a host is named hK (h1, h2 ...), not '$1'"
    echo "${BASH_REMATCH[1]}"
}

services() {
    ANNIHILATION_HOME=$SERVICES_HOME PG_PORT=$CLUSTER_PG_PORT REDIS_PORT=$CLUSTER_REDIS_PORT \
        PG_DB=$CLUSTER_DB SERVICES_LISTEN=$ADDR SERVICES_TRUST_NET=$CLUSTER_NET.0/24 \
        "$ROOT/scripts/services.sh" "$@"
}

# The environment every cluster process shares; the hosts add their own (host_env).
common_env() {
    cat <<EOF
export DATABASE_URL=postgres://postgres@$ADDR:$CLUSTER_PG_PORT/$CLUSTER_DB
export REDIS_URL=redis://$ADDR:$CLUSTER_REDIS_PORT/0
export ANNIHILATION_REPO=git://$ADDR:$CLUSTER_GIT_PORT/central.git
export DEBUG=${DEBUG:-true}
export PYTHONPATH=$ROOT
EOF
}

host_env() {
    cat <<EOF
export ANNIHILATION_HOST=$1
export ANNIHILATION_HOME=$CLUSTER_HOME/$1
EOF
}

# The ANNIHILATION_* settings `up` was given (but the per-host ones), quoted for `source`.
write_env_file() {
    mkdir -p "$CLUSTER_HOME"
    {
        common_env
        local name
        while IFS= read -r name; do
            case $name in
                ANNIHILATION_HOST | ANNIHILATION_HOME | ANNIHILATION_REPO | ANNIHILATION_CLONE | ANNIHILATION_WORKTREES) ;;
                ANNIHILATION_* | LOG_LEVEL | LOG_FORMAT) printf 'export %s=%q\n' "$name" "${!name}" ;;
            esac
        done < <(compgen -e | sort)
    } >"$ENV_FILE"
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# --- the network ---------------------------------------------------------------------------

bridge_up() {
    ip link show "$CLUSTER_BRIDGE" >/dev/null 2>&1 || ip link add "$CLUSTER_BRIDGE" type bridge
    ip addr show dev "$CLUSTER_BRIDGE" | grep -q " $ADDR/24 " || ip addr add "$ADDR/24" dev "$CLUSTER_BRIDGE"
    ip link set "$CLUSTER_BRIDGE" up
}

ns_up() {
    local host=$1 k ns veth
    k=$(host_index "$host")
    ns=$(ns_of "$host")
    veth=$(veth_of "$host")
    ip netns list | grep -qw "$ns" || ip netns add "$ns"
    if ! ip link show "$veth" >/dev/null 2>&1; then
        ip link add "$veth" type veth peer name eth0 netns "$ns"
    fi
    ip link set "$veth" master "$CLUSTER_BRIDGE" up
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip addr show dev eth0 | grep -q " $CLUSTER_NET.$((10 + k))/24 " ||
        ip netns exec "$ns" ip addr add "$CLUSTER_NET.$((10 + k))/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
}

cut() { ip link set "$(veth_of "$1")" down; say "$1 cut off the network"; }
heal() { ip link set "$(veth_of "$1")" up; say "$1 back on the network"; }

# --- processes -----------------------------------------------------------------------------

# Every process of a namespace and their descendants (the sandbox's bubblewrap children have
# network namespaces of their own), collected before any is killed.
ns_processes() {
    local ns=$1 pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] || return 0
    local -A seen=()
    local queue=($pids) p child
    while [ ${#queue[@]} -gt 0 ]; do
        p=${queue[0]}
        queue=("${queue[@]:1}")
        [ -n "${seen[$p]:-}" ] && continue
        seen[$p]=1
        echo "$p"
        for child in $(cat /proc/"$p"/task/*/children 2>/dev/null); do queue+=("$child"); done
    done
}

kill_host() {
    local ns
    ns=$(ns_of "$1")
    for _ in 1 2 3 4 5; do
        local pids
        pids=$(ns_processes "$ns")
        [ -n "$pids" ] || return 0
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        sleep 0.1
    done
}

start_worker() {
    local host=$1 ns
    ns=$(ns_of "$host")
    ip netns list | grep -qw "$ns" || die "no host $host (up first)"
    if pid_alive "$RUN/$host.pid"; then say "$host: worker already running"; return 0; fi
    mkdir -p "$CLUSTER_HOME/$host" "$RUN" "$LOGS"
    # shellcheck disable=SC1090
    (
        source "$ENV_FILE"
        eval "$(host_env "$host")"
        cd "$ROOT"
        exec ip netns exec "$ns" setsid "$PY" -m celery -A annihilation worker -n "worker@$host" \
            -P threads -c "$CLUSTER_CONCURRENCY" --without-gossip --without-mingle -l info \
            >>"$LOGS/$host.log" 2>&1 </dev/null
    ) &
    echo $! >"$RUN/$host.pid"
    say "$host: worker started (pid $!, log $LOGS/$host.log)"
}

stop_worker() {
    local host=$1 pid
    if pid_alive "$RUN/$host.pid"; then
        pid=$(cat "$RUN/$host.pid")
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    kill_host "$host"
    rm -f "$RUN/$host.pid"
}

start_beat() {
    if pid_alive "$RUN/beat.pid"; then return 0; fi
    (
        # shellcheck disable=SC1090
        source "$ENV_FILE"
        eval "$(host_env control)"
        cd "$ROOT"
        exec setsid "$PY" -m celery -A annihilation beat -l info -s "$RUN/beat-schedule" \
            >>"$LOGS/beat.log" 2>&1 </dev/null
    ) &
    echo $! >"$RUN/beat.pid"
}

stop_pidfile() {
    local file=$1 pid
    pid_alive "$file" || { rm -f "$file"; return 0; }
    pid=$(cat "$file")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$file"
}

# --- the central repository ----------------------------------------------------------------

central_seed() {
    rm -rf "$BARE" "$CLUSTER_HOME/git/seed"
    mkdir -p "$CLUSTER_HOME/git"
    local seed=$CLUSTER_SEED_REPO
    if [ -z "$seed" ]; then
        seed=$CLUSTER_HOME/git/seed
        (cd "$ROOT" && DJANGO_SETTINGS_MODULE=annihilation.settings "$PY" -c \
            "import django, sys; django.setup(); from psychonauts.workspaces.worktrees import demo_repo_ensure; demo_repo_ensure(sys.argv[1])" \
            "$seed")
    fi
    git clone -q --bare "$seed" "$BARE"
}

start_git_daemon() {
    pid_alive "$RUN/git-daemon.pid" && return 0
    git daemon --reuseaddr --detach --pid-file="$RUN/git-daemon.pid" --listen="$ADDR" \
        --port="$CLUSTER_GIT_PORT" --export-all --enable=receive-pack \
        --base-path="$CLUSTER_HOME/git" "$CLUSTER_HOME/git"
    for _ in $(seq 50); do (exec 3<>"/dev/tcp/$ADDR/$CLUSTER_GIT_PORT") 2>/dev/null && return 0; sleep 0.1; done
    die "git daemon did not start on $ADDR:$CLUSTER_GIT_PORT"
}

# --- the database --------------------------------------------------------------------------

database_fresh() {
    local bin
    bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -1)
    [ -n "$bin" ] || bin=$(dirname "$(command -v psql)")
    "$bin/psql" -q -h "$ADDR" -p "$CLUSTER_PG_PORT" -U postgres -d postgres \
        -c "DROP DATABASE IF EXISTS $CLUSTER_DB WITH (FORCE)" -c "CREATE DATABASE $CLUSTER_DB" >/dev/null
    (
        # shellcheck disable=SC1090
        source "$ENV_FILE"
        eval "$(host_env control)"
        cd "$ROOT"
        "$PY" manage.py migrate --noinput -v 0
        "$PY" manage.py shell -v 0 -c \
            "from psychonauts.roles import roles_sync_defaults; from quanta.pipelines.services import pipelines_ensure_defaults; roles_sync_defaults(); pipelines_ensure_defaults()"
    )
}

redis_restart() {
    "$(command -v redis-cli)" -h "$ADDR" -p "$CLUSTER_REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    for _ in $(seq 50); do
        redis-cli -h "$ADDR" -p "$CLUSTER_REDIS_PORT" ping >/dev/null 2>&1 || break
        sleep 0.1
    done
    services start
}

# --- commands ------------------------------------------------------------------------------

hosts_known() {
    ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^${CLUSTER_NS_PREFIX}\(h[0-9]\+\)$/\1/p" | sort -V
}

up() {
    local n=${1:?how many hosts: up N}
    [[ $n =~ ^[1-9][0-9]?$ ]] || die "up N: N is a number of hosts (1..99)"
    need_root
    down_quiet
    mkdir -p "$RUN" "$LOGS"
    rm -rf "$CLUSTER_HOME"/h[0-9]* "$CLUSTER_HOME/control"
    write_env_file
    bridge_up
    services start
    database_fresh
    central_seed
    start_git_daemon
    start_beat
    local k
    for k in $(seq "$n"); do
        ns_up "h$k"
        start_worker "h$k"
    done
    echo "$n" >"$RUN/hosts"
    say "up: $n host(s) on $CLUSTER_BRIDGE $ADDR/24; \`scripts/cluster.sh env\` for manage.py"
}

down_quiet() {
    local host
    for host in $(hosts_known); do stop_worker "$host"; done
    stop_pidfile "$RUN/beat.pid"
    stop_pidfile "$RUN/git-daemon.pid"
    if [ -d "$SERVICES_HOME" ]; then services stop || true; fi
    for host in $(hosts_known); do
        ip link del "$(veth_of "$host")" 2>/dev/null || true
        ip netns del "$(ns_of "$host")" 2>/dev/null || true
    done
    ip link del "$CLUSTER_BRIDGE" 2>/dev/null || true
    rm -f "$RUN/hosts"
}

status() {
    local host ns
    if pid_alive "$RUN/beat.pid"; then echo "control: beat running"; else echo "control: beat stopped"; fi
    if pid_alive "$RUN/git-daemon.pid"; then
        echo "central: git://$ADDR:$CLUSTER_GIT_PORT/central.git"
    else
        echo "central: stopped"
    fi
    services status 2>&1 | sed 's/^services: //'
    for host in $(hosts_known); do
        ns=$(ns_of "$host")
        local worker=stopped link
        pid_alive "$RUN/$host.pid" && worker="worker running (pid $(cat "$RUN/$host.pid"))"
        link=$(ip -br link show "$(veth_of "$host")" 2>/dev/null | awk '{print $2}')
        echo "$host: $worker, link ${link:-missing}, processes $(ip netns pids "$ns" | wc -l)"
    done
}

case "${1:-}" in
    up) up "${2:-}" ;;
    down) need_root; down_quiet; say "down" ;;
    status) status ;;
    env)
        [ -f "$ENV_FILE" ] || die "not up ($ENV_FILE missing)"
        cat "$ENV_FILE"
        host_env control
        ;;
    start) need_root; host_index "${2:?start hK}" >/dev/null; start_worker "$2" ;;
    stop) need_root; host_index "${2:?stop hK}" >/dev/null; stop_worker "$2" ;;
    kill)
        need_root
        host_index "${2:?kill hK}" >/dev/null
        kill_host "$2"
        rm -f "$RUN/$2.pid"
        say "$2: every process killed"
        ;;
    cut) need_root; host_index "${2:?cut hK}" >/dev/null; cut "$2" ;;
    heal) need_root; host_index "${2:?heal hK}" >/dev/null; heal "$2" ;;
    partition)
        need_root
        host_index "${2:?partition hK SECONDS}" >/dev/null
        cut "$2"
        sleep "${3:?partition hK SECONDS}"
        heal "$2"
        ;;
    redis-restart) need_root; redis_restart ;;
    *) die "usage: scripts/cluster.sh up N | down | status | env | start|stop|kill|cut|heal hK | partition hK SECONDS | redis-restart" ;;
esac
