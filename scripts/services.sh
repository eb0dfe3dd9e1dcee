#!/usr/bin/env bash
# Start or stop the project's own Postgres and Redis, on loopback, with data under $ANNIHILATION_HOME
# (and install bubblewrap, the agent sandbox, with them).
#
#   scripts/services.sh start|stop|status
#
# Reads ANNIHILATION_HOME, PG_PORT and REDIS_PORT (the Makefile sets them: one set for the demo,
# another for the tests, so the two never collide). SERVICES_LISTEN adds an address both servers
# listen on besides loopback, and SERVICES_TRUST_NET a network (CIDR) Postgres trusts besides
# loopback (scripts/cluster.sh: hosts on a bridge); both unset: loopback only. Safe to run twice:
# a running server is left alone. `stop` stops only this checkout's servers: Postgres by its data
# folder, Redis by the pid file in its data folder (a server of another checkout or program that
# answers on the same port is left running). Installs postgresql and redis-server from the system packages
# when they are missing and this user may (root, or password-less sudo); otherwise says what to
# install and stops.
set -euo pipefail
# runuser, pg_ctl helpers and apt live in sbin folders a plain user PATH may leave out.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

action=${1:-start}
HOME_DIR=${ANNIHILATION_HOME:?ANNIHILATION_HOME must be set}
PG_PORT=${PG_PORT:?PG_PORT must be set}
REDIS_PORT=${REDIS_PORT:?REDIS_PORT must be set}
PG_DB=${PG_DB:-annihilation}
LISTEN=${SERVICES_LISTEN:-}
TRUST_NET=${SERVICES_TRUST_NET:-}
PG_LISTEN=127.0.0.1${LISTEN:+,$LISTEN}

say() { printf '%s\n' "services: $*" >&2; }
die() { printf '%s\n' "services: error: $*" >&2; exit 1; }

pg_bin() {
    local d
    for d in /usr/lib/postgresql/*/bin; do
        [ -x "$d/initdb" ] && { echo "$d"; return 0; }
    done
    command -v initdb >/dev/null 2>&1 && { dirname "$(command -v initdb)"; return 0; }
    return 1
}

install_packages() {
    local pkgs=("$@")
    say "installing ${pkgs[*]} from the system packages"
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
    else
        die "${pkgs[*]} missing and this user cannot install packages (not root, no password-less sudo).
Install them yourself: sudo apt-get install -y ${pkgs[*]}"
    fi
}

ensure_installed() {
    local missing=()
    pg_bin >/dev/null || missing+=(postgresql)
    command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
    # The agent sandbox (psychonauts/containment/sandbox.py).
    command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
    # The multi-host harness's network namespaces (scripts/cluster.sh, tests/hosts).
    command -v ip >/dev/null 2>&1 || missing+=(iproute2)
    if [ ${#missing[@]} -gt 0 ]; then
        command -v apt-get >/dev/null 2>&1 || die "${missing[*]} missing and no apt-get here: install them, or point DATABASE_URL / REDIS_URL at running servers"
        install_packages "${missing[@]}"
    fi
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Postgres refuses to run as root: as root we run it as the `postgres` system user.
as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

PG_DATA="$HOME_DIR/pg"
REDIS_DIR="$HOME_DIR/redis"
# As root, Postgres runs as the `postgres` user, which must be able to reach the data folder. A
# project checked out under a private folder (/root/...) is not reachable: then the cluster lives
# in a folder of its own under /var/tmp, named after the project folder, so it is still per-project.
choose_pg_data() {
    if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1 && ! runuser -u postgres -- test -x "$HOME_DIR" 2>/dev/null; then
        PG_DATA="/var/tmp/annihilation-pg-$(printf '%s' "$HOME_DIR" | md5sum | cut -c1-12)"
    fi
}

pg_running() { [ -f "$PG_DATA/PG_VERSION" ] && as_pg "$BIN/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; }
redis_running() { redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; }

# The pid of this checkout's Redis: the one its pid file names, still a redis-server, working in
# this checkout's data folder (redis-server runs in its --dir). Empty for any other Redis, even
# one that answers on REDIS_PORT: that one is someone else's, never stopped nor used from here.
redis_own_pid() {
    local pid dir
    [ -f "$REDIS_DIR/redis.pid" ] || return 0
    pid=$(tr -dc '0-9' <"$REDIS_DIR/redis.pid")
    [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 0
    case "$(cat "/proc/$pid/comm" 2>/dev/null)" in redis-server*) ;; *) return 0 ;; esac
    dir=$(readlink "/proc/$pid/cwd" 2>/dev/null) || return 0
    [ "$dir" = "$(cd "$REDIS_DIR" && pwd -P)" ] && echo "$pid"
    return 0
}

start_pg() {
    if pg_running; then say "postgres already running on 127.0.0.1:$PG_PORT"; return 0; fi
    port_busy "$PG_PORT" && die "port $PG_PORT is in use by another program; set PG_PORT to a free port (and DATABASE_URL to match)"
    mkdir -p "$PG_DATA"
    chmod 700 "$PG_DATA"
    if [ "$(id -u)" = 0 ]; then
        chown postgres:postgres "$PG_DATA"
        runuser -u postgres -- test -w "$PG_DATA" || die "the postgres user cannot write to $PG_DATA; set ANNIHILATION_HOME to a folder it can reach"
        [ "$PG_DATA" = "$HOME_DIR/pg" ] || say "the postgres user cannot reach $HOME_DIR: its cluster lives in $PG_DATA"
    fi
    if [ ! -f "$PG_DATA/PG_VERSION" ]; then
        say "initialising a Postgres cluster in $PG_DATA"
        as_pg "$BIN/initdb" --no-sync -D "$PG_DATA" -U postgres --auth=trust -E UTF8 >/dev/null
    fi
    if [ -n "$TRUST_NET" ] && ! grep -q "^host all all $TRUST_NET trust\$" "$PG_DATA/pg_hba.conf"; then
        echo "host all all $TRUST_NET trust" | as_pg tee -a "$PG_DATA/pg_hba.conf" >/dev/null
    fi
    as_pg "$BIN/pg_ctl" -D "$PG_DATA" -l "$PG_DATA/server.log" -w -t 30 \
        -o "-c listen_addresses=$PG_LISTEN -p $PG_PORT -k $PG_DATA -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
        start >/dev/null || die "postgres did not start; see $PG_DATA/server.log"
    say "postgres running on $PG_LISTEN:$PG_PORT"
}

ensure_db() {
    local exists
    exists=$("$BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='$PG_DB'")
    [ "$exists" = 1 ] || "$BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres "$PG_DB"
}

start_redis() {
    if [ -n "$(redis_own_pid)" ] && redis_running; then say "redis already running on 127.0.0.1:$REDIS_PORT"; return 0; fi
    port_busy "$REDIS_PORT" && die "port $REDIS_PORT is in use by another program (not this checkout's Redis, $REDIS_DIR); set REDIS_PORT to a free port (and REDIS_URL to match)"
    mkdir -p "$REDIS_DIR"
    # Another address than loopback: its clients (a bridge's hosts) are let in without a password.
    # shellcheck disable=SC2086 # LISTEN is one address or nothing
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 $LISTEN ${LISTEN:+--protected-mode no} --dir "$REDIS_DIR" --daemonize yes \
        --pidfile "$REDIS_DIR/redis.pid" --logfile "$REDIS_DIR/redis.log" --save "" --appendonly no >/dev/null
    for _ in $(seq 50); do redis_running && break; sleep 0.1; done
    redis_running || die "redis did not start; see $REDIS_DIR/redis.log"
    say "redis running on 127.0.0.1${LISTEN:+ $LISTEN}:$REDIS_PORT"
}

stop_all() {
    if BIN=$(pg_bin) && pg_running; then
        as_pg "$BIN/pg_ctl" -D "$PG_DATA" -m fast -w stop >/dev/null && say "postgres stopped ($PG_DATA)"
    fi
    local pid
    pid=$(redis_own_pid)
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
        [ -d "/proc/$pid" ] && die "redis (pid $pid, $REDIS_DIR) did not stop"
        say "redis stopped ($REDIS_DIR, port $REDIS_PORT)"
    elif redis_running; then
        say "the redis on port $REDIS_PORT is not this checkout's ($REDIS_DIR): left running"
    fi
}

case "$action" in
    start)
        mkdir -p "$HOME_DIR"
        chmod 755 "$HOME_DIR"
        ensure_installed
        choose_pg_data
        BIN=$(pg_bin)
        start_pg
        ensure_db
        start_redis
        ;;
    stop) choose_pg_data; stop_all ;;
    status)
        choose_pg_data
        BIN=$(pg_bin || true)
        if [ -n "$BIN" ] && pg_running; then say "postgres: running on $PG_PORT"; else say "postgres: stopped"; fi
        if [ -n "$(redis_own_pid)" ]; then say "redis: running on $REDIS_PORT"
        elif redis_running; then say "redis: stopped (another program answers on $REDIS_PORT)"
        else say "redis: stopped"; fi
        ;;
    *) die "unknown action '$action' (start, stop, status)" ;;
esac
