# Shared by every slurm/*.sbatch script and slurm/stack.sh; sourced, never run.
#
# Slurm copies a batch script into its spool directory before running it, so a
# script cannot find this file next to itself: it uses ROLLOUTS_HOME (the
# repository or installed tree), which defaults to the directory sbatch was run
# from. Settings come from the environment first, then from the KEY=value file
# named by ROLLOUTS_CONFIG (the same file and precedence the Python code uses).
# Services publish their address as "<name>.env" in ROLLOUTS_RUN_DIR (shared
# storage), and the jobs that need them wait for that file. The deployment's secrets
# (stack.sh up makes them) are read last from "secrets.env" there, private to the user.

# Reads KEY=value lines (comments and blanks skipped, one layer of quotes removed)
# into the environment, leaving variables that are already set alone: env wins.
rollouts_load_env_file() {
  local file=$1 line key value
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line#"${line%%[![:space:]]*}"}
    case $line in '' | '#'*) continue ;; esac
    line=${line#export }
    key=${line%%=*}
    value=${line#*=}
    [[ $key =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
    if [[ $value =~ ^\"(.*)\"$ || $value =~ ^\'(.*)\'$ ]]; then
      value=${BASH_REMATCH[1]}
    fi
    [ -n "${!key+set}" ] || export "$key=$value"
  done < "$file"
}

# A line for the logs: a URL's password, and the value of a KEY=value whose name says it is a
# secret (…PASSWORD, …TOKEN(S), …KEY), replaced by ***.
rollouts_redact() {
  sed -E -e 's#//([^:@/]*):[^@/]*@#//\1:***@#' -e 's#^([A-Z0-9_]*(PASSWORD|TOKENS?|KEY))=.*#\1=***#' <<< "$1"
}

# Makes the deployment's secrets, in $ROLLOUTS_RUN_DIR/secrets.env (mode 0600): a Redis password
# (when the stack runs its own Redis), an API token for trainers, an admin token (the operator's
# CLI and the backends' registrars send it) and the node gateways' two tokens. Only what is not set
# yet is made: a value from the environment, the config file or the file itself is kept, so a
# second `up` keeps the tokens trainers hold, and a line removed from the file is made anew.
rollouts_make_secrets() {
  local file=$ROLLOUTS_RUN_DIR/secrets.env var value needed=(ROLLOUTS_API_TOKENS ROLLOUTS_ADMIN_TOKENS)
  [ -r "$file" ] && rollouts_load_env_file "$file"
  [ -n "${ROLLOUTS_REDIS_URL:-}" ] || needed+=(ROLLOUTS_SLURM_REDIS_PASSWORD)
  needed+=(ROLLOUTS_TOKEN ROLLOUTS_BACKEND_TOKEN ROLLOUTS_BACKEND_ADMIN_TOKEN)
  if [ ! -e "$file" ]; then  # private from its first byte
    (umask 077 && echo "# made by slurm/stack.sh up; every job reads it (slurm/lib.sh)" > "$file")
  fi
  for var in "${needed[@]}"; do
    [ -z "${!var:-}" ] || continue
    if [ "$var" = ROLLOUTS_TOKEN ]; then
      value=${ROLLOUTS_ADMIN_TOKENS%%,*}  # the operator's own CLI and the registrars: the admin scope
    elif [ "$var" = ROLLOUTS_BACKEND_TOKEN ] && [ -n "${ROLLOUTS_BACKEND_KEY:-}" ]; then
      value=$ROLLOUTS_BACKEND_KEY  # its name before it was a token: the running gateways hold it
    elif [ "$var" = ROLLOUTS_BACKEND_ADMIN_TOKEN ] && [ -n "${ROLLOUTS_BACKEND_ADMIN_KEY:-}" ]; then
      value=$ROLLOUTS_BACKEND_ADMIN_KEY
    else
      value=$($ROLLOUTS_PYTHON -c 'import secrets; print(secrets.token_urlsafe(32))') || return 1
    fi
    echo "$var=$value" >> "$file"
    export "$var=$value"
    rollouts_log "made $var in $file"
  done
}

rollouts_log() {
  local job=${SLURM_JOB_ID:-local}
  [ -n "${SLURM_ARRAY_JOB_ID:-}" ] && job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
  echo "[$(date -u +%FT%TZ) $job $(hostname)] $*" >&2
}

# Common start of every job: config, paths, the Python to run, the working directory.
rollouts_setup() {
  export ROLLOUTS_HOME=${ROLLOUTS_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}
  if [ -n "${ROLLOUTS_CONFIG:-}" ]; then
    [ -r "$ROLLOUTS_CONFIG" ] || { rollouts_log "ROLLOUTS_CONFIG=$ROLLOUTS_CONFIG is not readable"; exit 2; }
    export ROLLOUTS_CONFIG=$(realpath "$ROLLOUTS_CONFIG")
    rollouts_load_env_file "$ROLLOUTS_CONFIG"
  fi
  local state=${ROLLOUTS_STATE_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/rollouts}
  export ROLLOUTS_RUN_DIR=${ROLLOUTS_RUN_DIR:-$state/slurm}
  mkdir -p "$ROLLOUTS_RUN_DIR"
  [ -r "$ROLLOUTS_RUN_DIR/secrets.env" ] && rollouts_load_env_file "$ROLLOUTS_RUN_DIR/secrets.env"
  # A command prefix, so the service image works too: "apptainer exec service.sif python".
  if [ -z "${ROLLOUTS_PYTHON:-}" ]; then
    ROLLOUTS_PYTHON=python3
    [ -x "$ROLLOUTS_HOME/.venv/bin/python" ] && ROLLOUTS_PYTHON=$ROLLOUTS_HOME/.venv/bin/python
  fi
  export ROLLOUTS_PYTHON
  cd "$ROLLOUTS_HOME"
}

rollouts_free_port() {
  $ROLLOUTS_PYTHON -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
}

# The name other nodes reach this one by; override where `hostname` is not routable.
rollouts_host() {
  echo "${ROLLOUTS_SLURM_ADVERTISE_HOST:-$(hostname)}"
}

# Writes "<name>.env" atomically (VAR=value plus the job id that owns it) and removes
# it when this job exits, so a stopped service is never found by a new worker.
rollouts_publish() {
  local name=$1 var=$2 value=$3 file=$ROLLOUTS_RUN_DIR/$1.env
  # Private to the user: a Redis URL may carry its password.
  (umask 077 && printf '%s=%s\nROLLOUTS_SLURM_%s_JOB=%s\n' "$var" "$value" "${name^^}" "${SLURM_JOB_ID:-}" \
    > "$file.tmp.$$")
  mv -f "$file.tmp.$$" "$file"
  trap "rollouts_unpublish '$name'" EXIT
  rollouts_log "published $var=$(rollouts_redact "$value") in $file"
}

# Removes "<name>.env" if it is still this job's: a replacement may have published since.
rollouts_unpublish() {
  local file=$ROLLOUTS_RUN_DIR/$1.env
  if grep -qx "ROLLOUTS_SLURM_${1^^}_JOB=${SLURM_JOB_ID:-}" "$file" 2>/dev/null; then
    rm -f "$file"
  fi
}

# Waits until VAR is known: set already (config or env), or published by a running job.
# A file whose job is no longer running is stale (that job was SIGKILLed): keep waiting.
rollouts_wait_for() {
  local name=$1 var=$2 file=$ROLLOUTS_RUN_DIR/$1.env
  local deadline=$((SECONDS + ${ROLLOUTS_SLURM_WAIT_S:-900})) owner
  [ -n "${!var:-}" ] && return 0
  rollouts_log "waiting for $file"
  while [ $SECONDS -lt $deadline ]; do
    if [ -r "$file" ]; then
      owner=$(sed -n "s/^ROLLOUTS_SLURM_${name^^}_JOB=//p" "$file")
      if [ -z "$owner" ] || [ -n "$(squeue -h -j "$owner" -t RUNNING -o %i 2>/dev/null)" ]; then
        rollouts_load_env_file "$file"
        rollouts_log "found $var=$(rollouts_redact "${!var}")"
        return 0
      fi
    fi
    sleep "${ROLLOUTS_SLURM_POLL_S:-3}"
  done
  rollouts_log "gave up waiting for $file"
  exit 3
}

# Polls a URL until it answers 200, or fails as soon as process $2 exits.
rollouts_wait_http() {
  local url=$1 pid=$2 deadline=$((SECONDS + ${3:-600}))
  while [ $SECONDS -lt $deadline ]; do
    kill -0 "$pid" 2>/dev/null || { rollouts_log "process $pid exited before $url answered"; return 1; }
    $ROLLOUTS_PYTHON -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$url" \
      2>/dev/null && return 0
    sleep 1
  done
  rollouts_log "$url did not answer within ${3:-600}s"
  return 1
}

# Runs until process $1 exits, forwarding SIGTERM/SIGINT to it. With --signal=B:... only
# this shell is signalled; with a plain scancel every process is, and forwarding again is
# harmless. Returns the process's exit status.
rollouts_forward_and_wait() {
  local pid=$1 rc=0
  trap "kill -TERM $pid 2>/dev/null" TERM INT
  while :; do
    rc=0
    wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  trap - TERM INT
  return "$rc"
}

# The body of init.sbatch, rollout.sbatch and eval.sbatch. The worker replaces this shell (exec),
# so the signals meant for the batch shell (--signal=B:..., scancel --batch) reach the worker
# itself and nothing else, once each. SIGTERM (scancel --batch --signal=TERM, preemption, a
# scale-down) drains it: it stops taking jobs, lets running ones finish for drain_timeout_s,
# hands the rest back and exits 0. SIGUSR1 is the time-limit warning (--signal=B:USR1@300): the
# worker first runs ROLLOUTS_RENEW_COMMAND, set here to submit this task's successor, then drains
# the same way, so a fleet outlives any time limit without losing or repeating a job.
rollouts_run_worker() {
  local stage=$1
  rollouts_setup
  rollouts_wait_for redis ROLLOUTS_REDIS_URL
  export ROLLOUTS_RENEW_COMMAND=${ROLLOUTS_RENEW_COMMAND:-"source '$ROLLOUTS_HOME/slurm/lib.sh' && rollouts_renew $stage"}
  rollouts_log "starting the $stage worker: $ROLLOUTS_PYTHON -m cli worker $stage ${ROLLOUTS_SLURM_WORKER_ARGS:-}"
  # shellcheck disable=SC2086 # a command prefix and extra options, split on purpose
  exec $ROLLOUTS_PYTHON -m cli worker "$stage" ${ROLLOUTS_SLURM_WORKER_ARGS:-}
}

# Submits this task again: the same stage script and array index, partition and time limit, the
# deployment's sbatch options, logs beside this task's. Recorded in the stack's job list (so
# `stack.sh status` and `down` see it). Not while `stack.sh down` is stopping the stack.
rollouts_renew() {
  local stage=$1 jobs=$ROLLOUTS_RUN_DIR/jobs limit logs id var
  if [ -e "$ROLLOUTS_RUN_DIR/stopping" ]; then
    rollouts_log "time limit near, and the stack is stopping: not renewing"
    return 0
  fi
  limit=$(squeue -h -j "${SLURM_JOB_ID}" -o %l 2>/dev/null)
  logs=$(scontrol show job "${SLURM_JOB_ID}" 2>/dev/null | sed -n 's/^ *StdOut=//p')
  logs=${logs%/*}
  var=ROLLOUTS_SLURM_${stage^^}_SBATCH_ARGS
  # shellcheck disable=SC2086 # option lists from the config, split on purpose
  id=$(sbatch --parsable --array="${SLURM_ARRAY_TASK_ID:-0}" --partition="${SLURM_JOB_PARTITION}" \
    ${limit:+--time="$limit"} --output="${logs:-$ROLLOUTS_RUN_DIR/logs}/%x-%A_%a.log" \
    ${ROLLOUTS_SLURM_SBATCH_ARGS:-} ${!var:-} "$ROLLOUTS_HOME/slurm/$stage.sbatch") || {
    rollouts_log "time limit near: resubmitting the $stage task failed; draining anyway"
    return 0
  }
  id=${id%%;*}
  [ -e "$jobs" ] && echo "$stage $id" >> "$jobs"
  rollouts_log "time limit near: renewed as job $id; draining"
}
