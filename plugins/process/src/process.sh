# The process adaptor's one script, run by `/bin/sh -c` on the node: $1 action, $2 state
# directory, $3 name, then per action. POSIX sh; Linux `/proc` for liveness.
set -u
action=$1 dir=$2 name=$3
shift 3
pidfile="$dir/$name.pid" specfile="$dir/$name.spec" logfile="$dir/$name.log"
# The start time (clock ticks since boot) of a pid, from /proc/<pid>/stat after the command
# name (which may hold spaces); empty for a missing process or a zombie.
started_at() {
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  s=${s##*\)}
  set -- $s
  [ "$1" = Z ] || printf '%s' "${20}"
}
# The recorded pid when that very process (same start time) still runs.
live_pid() {
  [ -r "$pidfile" ] || return 1
  read -r pid start < "$pidfile" || return 1
  [ -n "$pid" ] && [ -n "$start" ] && [ "$(started_at "$pid")" = "$start" ]
}
stop() {
  live_pid || { rm -f "$pidfile"; return 0; }
  kill -s TERM -- "-$pid" 2>/dev/null || kill -s TERM "$pid" 2>/dev/null
  waited=0
  while [ "$(started_at "$pid")" = "$start" ]; do
    if [ "$waited" -ge "$1" ]; then
      kill -s KILL -- "-$pid" 2>/dev/null || kill -s KILL "$pid" 2>/dev/null
      echo "killed $pid"
      break
    fi
    sleep 0.1
    waited=$((waited + 100))
  done
  rm -f "$pidfile"
  echo "stopped $pid"
}
case $action in
status)
  if live_pid; then echo "running $pid"; else echo stopped; fi
  cat "$specfile" 2>/dev/null || :
  ;;
start)
  cwd=$1 spec=$2
  shift 2
  mkdir -p -- "$dir" || exit 1
  cd -- "$cwd" || exit 1
  printf '%s' "$spec" > "$specfile" || exit 1
  setsid "$@" < /dev/null >> "$logfile" 2>&1 &
  pid=$!
  start=$(started_at "$pid")
  printf '%s %s\n' "$pid" "$start" > "$pidfile"
  sleep 0.2
  if [ -z "$start" ] || [ "$(started_at "$pid")" != "$start" ]; then
    rm -f "$pidfile"
    echo "the program exited at once; the end of $logfile:" >&2
    tail -n 20 "$logfile" >&2
    exit 1
  fi
  echo "started $pid"
  ;;
stop)
  stop "$1"
  ;;
purge)
  stop "$1"
  rm -f "$specfile" "$logfile"
  ;;
*)
  echo "unknown action $action" >&2
  exit 2
  ;;
esac
