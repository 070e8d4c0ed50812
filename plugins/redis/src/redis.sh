# The redis automator's work on a node, run as `sh -c "<this script>" redis.sh <command> [args]`.
# POSIX sh, coreutils, util-linux (runuser) and redis-tools (redis-cli) only. Paths come from the
# automator, checked there. Exit 0 on success; anything else is a failure whose stderr the
# automator reports.
set -u

# The redis user (made by Debian's package) runs the server when we are root and it exists.
redis_user() {
  [ "$(id -u)" = 0 ] && id redis >/dev/null 2>&1
}

as_redis() {
  if redis_user; then runuser -u redis -- "$@"; else "$@"; fi
}

# mkdir -p DIR, owned by the redis user when it runs the server, mode MODE.
make_dir() {
  mkdir -p -- "$1" || exit 1
  if redis_user; then chown redis:redis -- "$1" || exit 1; fi
  chmod "$2" -- "$1" || exit 1
}

# Whether PID is a live (not zombie) process.
live() {
  [ -r "/proc/$1/status" ] || return 1
  state=$(sed -n 's/^State:[[:space:]]*\([A-Za-z]\).*/\1/p' "/proc/$1/status" 2>/dev/null)
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# Prints the pid in PIDFILE when it is a live redis-server.
alive() {
  [ -s "$1" ] || return 1
  pid=$(head -n 1 "$1" 2>/dev/null) || return 1
  case "$pid" in '' | *[!0-9]*) return 1 ;; esac
  live "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'redis-server' || return 1
  echo "$pid"
}

# What answers PING at HOST PORT (PONG when a server does).
ping_at() {
  timeout 5 redis-cli -h "$1" -p "$2" ping 2>/dev/null | tr -d '\r'
}

digest() {
  [ -f "$1" ] || return 0
  sha256sum -- "$1" | cut -d ' ' -f 1
}

# TERM, then KILL after GRACE seconds; returns when the process is gone.
stop_pid() {
  kill -TERM "$1" 2>/dev/null
  i=0
  while live "$1"; do
    i=$((i + 1))
    if [ "$i" -eq $(($2 * 10)) ]; then
      echo "pid $1 still running after ${2} s: KILL"
      kill -KILL "$1" 2>/dev/null
    fi
    if [ "$i" -gt $(($2 * 10 + 50)) ]; then
      echo "pid $1 did not exit" >&2
      exit 1
    fi
    sleep 0.1
  done
}

# configured CONF DATADIR: "datadir=yes|no", then "present" and the content, or "absent".
cmd_configured() {
  if [ -d "$2" ]; then echo "datadir=yes"; else echo "datadir=no"; fi
  if [ -f "$1" ]; then
    echo present
    cat -- "$1"
  else
    echo absent
  fi
}

# configure CONF DATADIR RUNDIR LOGDIR < content: the directories, then the file atomically.
cmd_configure() {
  conf=$1
  make_dir "$2" 0750
  make_dir "$3" 0755
  make_dir "$4" 0750
  mkdir -p -- "$(dirname -- "$conf")" || exit 1
  tmp=$(mktemp "$conf.XXXXXX") || exit 1
  if ! cat >"$tmp"; then
    rm -f -- "$tmp"
    exit 1
  fi
  chmod 0640 -- "$tmp" || exit 1
  if redis_user; then chgrp redis -- "$tmp" || exit 1; fi
  mv -f -- "$tmp" "$conf" || exit 1
  echo "wrote $conf"
}

# status CONF PIDFILE HOST PORT STARTED: key=value lines.
cmd_status() {
  pid=$(alive "$2") || pid=
  echo "pid=$pid"
  echo "ping=$(ping_at "$3" "$4")"
  echo "conf=$(digest "$1")"
  echo "started=$(head -n 1 "$5" 2>/dev/null)"
}

# start CONF PIDFILE HOST PORT STARTED LOGFILE GRACE: running with CONF's current content.
cmd_start() {
  conf=$1 pidfile=$2 host=$3 port=$4 started=$5 logfile=$6 grace=$7
  if [ ! -f "$conf" ]; then
    echo "no configuration at $conf: the service's configure action has not run" >&2
    exit 1
  fi
  want=$(digest "$conf")
  if pid=$(alive "$pidfile"); then
    if [ "$(head -n 1 "$started" 2>/dev/null)" = "$want" ] && [ "$(ping_at "$host" "$port")" = PONG ]; then
      echo "already running (pid $pid) on $host:$port"
      return 0
    fi
    stop_pid "$pid" "$grace"
    echo "stopped pid $pid to apply the configuration"
  fi
  rm -f -- "$started"
  if ! as_redis redis-server "$conf"; then
    echo "redis-server $conf failed" >&2
    tail -n 20 -- "$logfile" >&2 2>/dev/null
    exit 1
  fi
  i=0
  until pid=$(alive "$pidfile") && [ "$(ping_at "$host" "$port")" = PONG ]; do
    i=$((i + 1))
    if [ "$i" -gt 100 ]; then
      echo "redis-server did not answer PING on $host:$port within 10 s; its log:" >&2
      tail -n 20 -- "$logfile" >&2 2>/dev/null
      exit 1
    fi
    sleep 0.1
  done
  echo "$want" >"$started" || exit 1
  echo "started redis-server (pid $pid) on $host:$port"
}

# stop PIDFILE HOST PORT STARTED GRACE: our process gone and nothing answering on the port.
cmd_stop() {
  pidfile=$1 host=$2 port=$3 started=$4 grace=$5
  if pid=$(alive "$pidfile"); then
    stop_pid "$pid" "$grace"
    echo "stopped redis-server (pid $pid)"
  fi
  if [ "$(ping_at "$host" "$port")" = PONG ]; then
    # A server on this service's port without our pid file (it was removed by hand).
    timeout 10 redis-cli -h "$host" -p "$port" shutdown nosave >/dev/null 2>&1
    i=0
    while [ "$(ping_at "$host" "$port")" = PONG ]; do
      i=$((i + 1))
      if [ "$i" -gt $(($grace * 10)) ]; then
        echo "a server still answers on $host:$port after SHUTDOWN" >&2
        exit 1
      fi
      sleep 0.1
    done
    echo "shut down the server answering on $host:$port"
  fi
  rm -f -- "$started" "$pidfile"
}

# leftovers PATH...: the paths that exist.
cmd_leftovers() {
  for p in "$@"; do
    if [ -e "$p" ] || [ -L "$p" ]; then echo "$p"; fi
  done
}

command=$1
shift
case "$command" in
  configured) cmd_configured "$@" ;;
  configure) cmd_configure "$@" ;;
  status) cmd_status "$@" ;;
  start) cmd_start "$@" ;;
  stop) cmd_stop "$@" ;;
  leftovers) cmd_leftovers "$@" ;;
  remove)
    # remove PIDFILE HOST PORT STARTED GRACE PATH...: stop, then delete every PATH.
    cmd_stop "$1" "$2" "$3" "$4" "$5"
    shift 5
    rm -rf -- "$@" || exit 1
    echo "removed $*"
    ;;
  *)
    echo "redis.sh: unknown command $command" >&2
    exit 2
    ;;
esac
