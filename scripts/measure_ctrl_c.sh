#!/bin/bash
# Ctrl-C of `rollouts up` in a real terminal (tmux) with 8 math rollouts in flight on the embedded
# vLLM, then `rollouts up` again on the same state dir until all 8 jobs end (docs/RELIABILITY.md).
# Usage: scripts/measure_ctrl_c.sh [OUT_DIR]   (PORT=... to pick the API port; needs tmux, curl, bc)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(realpath -m "${1:-$(mktemp -d /tmp/rollouts-ctrl-c-XXXX)}")
STATE=$OUT/state
PORT=${PORT:-18431}
PY=$ROOT/.venv/bin/python
rm -rf "$STATE"; mkdir -p "$STATE"
cd "$ROOT"

up_in_tmux() {  # $1: tmux session, $2: log; `up` runs in the foreground of the session's shell
  tmux new-session -d -s "$1" -x 200 -y 50
  tmux send-keys -t "$1" "cd $ROOT && ROLLOUTS_STATE_DIR=$STATE $PY -m cli up --port $PORT > $2 2>&1; echo EXIT=\$? at \$(date +%s.%N) >> $2" Enter
}
wait_api() {  # $1: log
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null && grep -q "rollouts up: API" "$1" && return 0
    sleep 1
  done
  return 1
}
ctrl_c() {  # $1: tmux session, $2: log; prints seconds from Ctrl-C to `up`'s exit
  local t0 t1
  t0=$(date +%s.%N)
  tmux send-keys -t "$1" C-c
  for _ in $(seq 1 2400); do grep -q "^EXIT=" "$2" && break; sleep 0.05; done
  t1=$(grep "^EXIT=" "$2" | awk '{print $3}')
  echo "$(grep '^EXIT=' "$2"); Ctrl-C to exit: $(echo "$t1 - $t0" | bc) s"
  tmux kill-session -t "$1"
}

up_in_tmux rollouts-up-1 "$OUT/up1.log"
wait_api "$OUT/up1.log" || { echo "the first up did not start"; tail -20 "$OUT/up1.log"; exit 1; }
"$PY" - "$PORT" "$OUT/ids.json" <<'EOF'
import json, sys, time, httpx
api = httpx.Client(base_url=f"http://127.0.0.1:{sys.argv[1]}", timeout=30)
rows = [json.loads(line) for line in open("examples/math.jsonl")][:8]
for row in rows:
    row["sampling"] = {"max_tokens": 3000, "temperature": 1.0}
ids = api.post("/v1/jobs", json=rows).json()["job_ids"]
open(sys.argv[2], "w").write(json.dumps(ids))
deadline = time.time() + 300
while time.time() < deadline:
    jobs = [api.get(f"/v1/jobs/{i}").json() for i in ids]
    running = [j for j in jobs if j["status"] == "rollout" and j["timings"].get("rollout", {}).get("started")]
    if len(running) == len(ids):
        break
    time.sleep(0.3)
print(f"in flight at Ctrl-C: {len(running)} rollouts started")
EOF
echo "first up (busy): $(ctrl_c rollouts-up-1 "$OUT/up1.log")"
echo "connection errors logged: $(grep -ciE 'connection refused|Error 111|ConnectionError' "$OUT/up1.log")"

up_in_tmux rollouts-up-2 "$OUT/up2.log"
wait_api "$OUT/up2.log" || { echo "the second up did not start"; tail -20 "$OUT/up2.log"; exit 1; }
"$PY" - "$PORT" "$OUT/ids.json" <<'EOF'
import json, sys, time, httpx
api = httpx.Client(base_url=f"http://127.0.0.1:{sys.argv[1]}", timeout=30)
ids = json.loads(open(sys.argv[2]).read())
started = time.time()
while time.time() < started + 600:
    jobs = [api.get(f"/v1/jobs/{i}").json() for i in ids]
    if all(j["status"] in ("done", "failed", "timed_out", "cancelled") for j in jobs):
        break
    time.sleep(1)
for j in jobs:
    print(j["id"][:8], j["status"], (j.get("error") or {}).get("type"), "attempts", j["attempts"], "lost", j["lost"])
print("after the restart:", sorted(j["status"] for j in jobs), f"{time.time() - started:.0f} s")
EOF
echo "second up (idle): $(ctrl_c rollouts-up-2 "$OUT/up2.log")"
echo "logs in $OUT"
