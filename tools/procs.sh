# shellcheck shell=bash
# Process bookkeeping for the local cluster (sourced after env.sh, not run). Every component is
# started in its own session (so a Ctrl-C in the starting shell does not reach it) and recorded
# as "<pid> <binary>" in $PIDS/<name>.pid; stopping kills only those pids, and only while they
# still run that binary (a recycled pid belongs to someone else).

PIDS="$RUN_DIR/pids"
LOGS="$RUN_DIR/logs"

# start NAME BINARY ARGS...: runs a component in the background, logging to $LOGS/NAME.log.
start() {
  local name="$1"
  shift
  log "starting $name"
  # In a non-interactive shell the background child is no process-group leader, so setsid
  # calls setsid(2) and execs in place: $! is the component's own pid.
  local pid
  setsid "$@" </dev/null >"$LOGS/$name.log" 2>&1 &
  pid=$!
  # Not a job of this shell: no "Killed" notice when a failed start stops it.
  disown "$pid"
  printf '%s %s\n' "$pid" "$1" >"$PIDS/$name.pid"
  printf '%s\n' "$name" >>"$PIDS/order"
}

# is_ours PID BINARY: the pid is alive and runs BINARY (or is the setsid about to exec it). A
# zombie (a child of a failed start, not yet reaped) counts as stopped. While a process is inside
# execve its cmdline reads empty for a moment; that is still our process, not a stopped one
# (treating it as stopped made a healthy start look like a crash, and left it running on cleanup).
is_ours() {
  local args=() stat state
  [[ -r "/proc/$1/stat" ]] || return 1
  stat="$(<"/proc/$1/stat")" 2>/dev/null || return 1
  # The state is the first field after the command name, which is in parentheses.
  state="${stat##*) }"
  state="${state%% *}"
  [[ "$state" == Z || "$state" == X ]] && return 1
  mapfile -d '' -n 2 args <"/proc/$1/cmdline" 2>/dev/null || return 1
  ((${#args[@]} == 0)) && return 0
  [[ "${args[0]:-}" == "$2" || ("${args[0]:-}" == *setsid && "${args[1]:-}" == "$2") ]]
}

# running NAME: the component recorded under NAME still runs.
running() {
  local pid bin
  [[ -f "$PIDS/$1.pid" ]] || return 1
  read -r pid bin <"$PIDS/$1.pid"
  is_ours "$pid" "$bin"
}

any_running() {
  local file
  [[ -d "$PIDS" ]] || return 1
  for file in "$PIDS"/*.pid; do
    [[ -e "$file" ]] || continue
    running "$(basename "$file" .pid)" && return 0
  done
  return 1
}

port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# wait_for COMPONENT DESCRIPTION TIMEOUT CMD...: polls CMD until it succeeds; fails with the
# component's log tail when the component exits or the timeout passes.
wait_for() {
  local component="$1" what="$2" timeout="$3"
  shift 3
  local start=$SECONDS logfile="$LOGS/$component.log"
  while true; do
    if "$@" >/dev/null 2>&1; then
      log "  $what ($((SECONDS - start))s)"
      return 0
    fi
    if ! running "$component"; then
      if grep -qi 'address already in use' "$logfile" 2>/dev/null; then
        fail_with_log "$component could not bind its port on 127.0.0.1: address already in use (set PLANNER_CLUSTER_PORT_BASE to move the ports)" "$logfile"
      fi
      fail_with_log "$component exited while waiting for: $what" "$logfile"
    fi
    if ((SECONDS - start >= timeout)); then
      fail_with_log "$what: not reached within ${timeout}s" "$logfile"
    fi
    sleep 1
  done
}

# stop_all: stops every recorded component, newest first, one at a time (the API server shuts
# down cleanly only while etcd still runs): SIGTERM, then SIGKILL after a grace period.
stop_all() {
  [[ -f "$PIDS/order" ]] || return 0
  local name pid bin names=()
  while read -r name; do
    names=("$name" "${names[@]}")
  done <"$PIDS/order"
  for name in "${names[@]}"; do
    [[ -f "$PIDS/$name.pid" ]] || continue
    read -r pid bin <"$PIDS/$name.pid"
    if is_ours "$pid" "$bin"; then
      log "stopping $name (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      local deadline=$((SECONDS + ${PLANNER_CLUSTER_STOP_GRACE:-15}))
      while is_ours "$pid" "$bin"; do
        if ((SECONDS >= deadline)); then
          log "killing $name (pid $pid): still running after SIGTERM"
          kill -KILL "$pid" 2>/dev/null || true
        fi
        sleep 0.2
      done
    fi
    rm -f "$PIDS/$name.pid"
  done
  rm -f "$PIDS/order"
}
