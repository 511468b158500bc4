#!/bin/bash
# The whole service as Slurm jobs, submitted with dependencies, and stopped in order.
#
#   slurm/stack.sh up [--init N] [--rollout N] [--eval N] [--vllm N]
#   slurm/stack.sh add <init|rollout|eval|vllm> N     # scale up: one more array of N tasks
#   slurm/stack.sh add api                            # a replacement API (then cancel the old)
#   slurm/stack.sh scale <init|rollout|eval|vllm> N   # exactly N tasks: submit more, or drain the surplus
#   slurm/stack.sh status                             # jobs, addresses and secrets (values shown as ***)
#   slurm/stack.sh down                               # drain workers, then backends, API, Redis
#
# Worker tasks renew themselves before their time limit (slurm/lib.sh, rollouts_renew): the
# successors are recorded here too, so status, scale and down cover them.
#
# Job ids go to $ROLLOUTS_RUN_DIR/jobs, logs to $ROLLOUTS_RUN_DIR/logs. Every sbatch gets
# $ROLLOUTS_SLURM_SBATCH_ARGS (partition, account, QOS...) and the per-role
# $ROLLOUTS_SLURM_<ROLE>_SBATCH_ARGS (e.g. ROLLOUTS_SLURM_VLLM_SBATCH_ARGS="--gres=gpu:4").
set -uo pipefail
export ROLLOUTS_HOME=${ROLLOUTS_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
source "$ROLLOUTS_HOME/slurm/lib.sh"
rollouts_setup

JOBS=$ROLLOUTS_RUN_DIR/jobs
LOGS=$ROLLOUTS_RUN_DIR/logs
STAGES=(init rollout eval)

die() { echo "stack.sh: $*" >&2; exit 1; }

alive() {  # prints the job's (or array's) tasks still in the queue, running or pending
  squeue -h -j "$1" -o %i 2>/dev/null
}

ids_of() {  # ids of the recorded jobs of the given roles
  [ -r "$JOBS" ] || return 0
  local role
  for role in "$@"; do awk -v r="$role" '$1 == r { print $2 }' "$JOBS"; done
}

# submit ROLE TASKS [sbatch options...]: TASKS=0 for a single (non-array) job.
submit() {
  local role=$1 tasks=$2 opts=() id var
  shift 2
  var=ROLLOUTS_SLURM_${role^^}_SBATCH_ARGS
  if [ "$tasks" = 0 ]; then
    opts+=(--output="$LOGS/%x-%j.log")
  else
    opts+=(--array="0-$((tasks - 1))" --output="$LOGS/%x-%A_%a.log")
  fi
  # shellcheck disable=SC2086 # option lists from the config, split on purpose
  id=$(sbatch --parsable "${opts[@]}" ${ROLLOUTS_SLURM_SBATCH_ARGS:-} ${!var:-} "$@" \
    "$ROLLOUTS_HOME/slurm/$role.sbatch") || die "sbatch of $role failed"
  id=${id%%;*}
  echo "$role $id" >> "$JOBS"
  echo "$role: job $id$([ "$tasks" = 0 ] || echo " ($tasks tasks)")" >&2
  echo "$id"
}

cmd_up() {
  local -A tasks=([init]=${ROLLOUTS_SLURM_INIT_TASKS:-1} [rollout]=${ROLLOUTS_SLURM_ROLLOUT_TASKS:-2}
                  [eval]=${ROLLOUTS_SLURM_EVAL_TASKS:-1} [vllm]=${ROLLOUTS_SLURM_VLLM_TASKS:-0})
  while [ $# -gt 0 ]; do
    case $1 in
      --init | --rollout | --eval | --vllm) tasks[${1#--}]=${2:?$1 needs a count}; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  local id
  for id in $(ids_of redis api init rollout eval vllm); do
    [ -z "$(alive "$id")" ] || die "job $id of a previous stack is still queued; run 'slurm/stack.sh down' first"
  done
  mkdir -p "$LOGS"
  rm -f "$JOBS" "$ROLLOUTS_RUN_DIR/redis.env" "$ROLLOUTS_RUN_DIR/api.env" "$ROLLOUTS_RUN_DIR/stopping"
  rollouts_make_secrets

  local after=()
  if [ -z "${ROLLOUTS_REDIS_URL:-}" ]; then
    after=(--dependency="after:$(submit redis 0)")
  fi
  local api
  api=$(submit api 0 "${after[@]}")
  # Workers need only Redis; `after` orders the start, the address files say when it is ready.
  local stage
  for stage in "${STAGES[@]}"; do
    [ "${tasks[$stage]}" -gt 0 ] && submit "$stage" "${tasks[$stage]}" "${after[@]}" > /dev/null
  done
  [ "${tasks[vllm]}" -gt 0 ] && submit vllm "${tasks[vllm]}" --dependency="after:$api" > /dev/null
  echo "stack submitted; the API's address appears in $ROLLOUTS_RUN_DIR/api.env" >&2
}

cmd_add() {
  local role=${1:?add needs a role} n
  [ -r "$JOBS" ] || die "no stack recorded in $JOBS"
  case $role in
    init | rollout | eval | vllm) n=${2:?add $role needs a count} ;;
    api) n=0 ;;  # a replacement API (upgrades): it takes over api.env; then cancel the old one
    *) die "cannot add $role" ;;
  esac
  submit "$role" "$n" > /dev/null
}

tasks_of() {  # every queued task of a role, one per line ("123_4" for array tasks), oldest job first
  local id
  for id in $(ids_of "$1"); do squeue -h -r -j "$id" -o '%i %t' 2>/dev/null; done
}

cmd_scale() {
  local role=${1:?scale needs a role} want=${2:?scale needs a count} have surplus task state
  case $role in init | rollout | eval | vllm) ;; *) die "cannot scale $role" ;; esac
  [[ $want =~ ^[0-9]+$ ]] || die "the count must be a number, not '$want'"
  [ -r "$JOBS" ] || die "no stack recorded in $JOBS"
  mapfile -t have < <(tasks_of "$role")
  if [ "${#have[@]}" -lt "$want" ]; then
    submit "$role" $((want - ${#have[@]})) > /dev/null
  elif [ "${#have[@]}" -gt "$want" ]; then
    surplus=$((${#have[@]} - want))
    # Pending tasks go first (they hold no job), then the newest running ones, which drain:
    # they finish or hand back what they run, then exit (no renewal: that is SIGUSR1's).
    while read -r task state; do
      [ "$surplus" -gt 0 ] || break
      if [ "$state" = PD ]; then
        scancel "$task" 2>/dev/null
      else
        scancel --batch --signal=TERM "$task" 2>/dev/null
      fi
      echo "$role: stopping $task ($state)" >&2
      surplus=$((surplus - 1))
    done < <(printf '%s\n' "${have[@]}" | sort -k2,2r -k1,1r)
  fi
  echo "$role: $want tasks" >&2
}

cmd_status() {
  [ -r "$JOBS" ] || die "no stack recorded in $JOBS"
  local role id line
  while read -r role id; do
    printf '%-8s %s\n' "$role" "$(alive "$id" | tr '\n' ' ')"
  done < "$JOBS"
  # The addresses and secrets, every secret value shown as *** (the files themselves are private).
  cat "$ROLLOUTS_RUN_DIR"/*.env 2>/dev/null | grep -v -e '_JOB=' -e '^#' | while IFS= read -r line; do
    rollouts_redact "$line"
  done
}

# Waits until none of the given jobs is queued any more; false after $1 seconds.
wait_gone() {
  local deadline=$((SECONDS + $1)) id busy
  shift
  while [ $SECONDS -lt $deadline ]; do
    busy=0
    for id in "$@"; do [ -z "$(alive "$id")" ] || busy=1; done
    [ "$busy" = 0 ] && return 0
    sleep 2
  done
  return 1
}

# Stops jobs gracefully: pending tasks are cancelled, running ones get SIGTERM in their batch
# shell only (so sandboxes and servers below a worker keep running while it drains); what is
# still there after $1 seconds is cancelled outright (SIGTERM to all, SIGKILL after KillWait).
stop_jobs() {
  local grace=$1 id
  shift
  [ $# -gt 0 ] || return 0
  for id in "$@"; do
    scancel --state=PENDING "$id" 2>/dev/null
    scancel --batch --signal=TERM "$id" 2>/dev/null
  done
  wait_gone "$grace" "$@" && return 0
  echo "stack.sh: still running after ${grace}s; cancelling $*" >&2
  scancel "$@" 2>/dev/null
  wait_gone 120 "$@"
}

cmd_down() {
  [ -r "$JOBS" ] || die "no stack recorded in $JOBS"
  local drain=${ROLLOUTS_DRAIN_TIMEOUT_S:-30}
  local grace=$(( ${drain%.*} + 60 ))
  touch "$ROLLOUTS_RUN_DIR/stopping"  # a worker warned of its time limit now does not renew
  # Workers first (they hand back unfinished jobs), then backends (they deregister while the
  # API is up), then the API, then Redis, which keeps every job record on disk.
  stop_jobs "$grace" $(ids_of init rollout eval)
  stop_jobs 60 $(ids_of vllm)
  stop_jobs 30 $(ids_of api)
  stop_jobs 30 $(ids_of redis)
  mv -f "$JOBS" "$JOBS.stopped"
  echo "stack stopped" >&2
}

case ${1:-} in
  up | add | scale | status | down) cmd=$1; shift; "cmd_$cmd" "$@" ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
