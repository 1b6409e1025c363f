#!/usr/bin/env bash
# Starts the three-node JetStream cluster of nats-{1,2,3}.conf on loopback (clients 14301-14303,
# routes 16301-16303, monitoring 18301-18303), waits until JetStream has a meta leader, creates
# a stream with 3 replicas and checks every node holds a copy; then stops the nodes
# (or keeps them running with --keep; stop them later with the printed kill command).
#
# Usage: deploy/nats/cluster/run-cluster.sh [--keep]
# Env:   NATS_SERVER (default <root>/.local/venv/bin/nats-server, else on PATH)
#        CLUSTER_DIR (default: a new folder under /tmp; removed at the end unless --keep)
#        PY          python with nats-py for the stream check (skipped when missing)
#        COMPANION_NATS_{BACKEND,WORKER,ADMIN}_PASSWORD  the users of ../auth.conf (random when unset;
#                    the stream check connects as admin)
set -euo pipefail
HERE="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(cd -- "$HERE/../../.." && pwd -P)"
NATS_SERVER="${NATS_SERVER:-$ROOT/.local/venv/bin/nats-server}"
[[ -x "$NATS_SERVER" ]] || NATS_SERVER="$(command -v nats-server)" || { echo "no nats-server" >&2; exit 1; }
KEEP=0; [[ "${1:-}" == "--keep" ]] && KEEP=1
DIR="${CLUSTER_DIR:-$(mktemp -d /tmp/companion-js-cluster.XXXXXX)}"
PIDS=()
rnd() { head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9'; }
export COMPANION_NATS_BACKEND_PASSWORD="${COMPANION_NATS_BACKEND_PASSWORD:-backend-$(rnd)}"
export COMPANION_NATS_WORKER_PASSWORD="${COMPANION_NATS_WORKER_PASSWORD:-worker-$(rnd)}"
export COMPANION_NATS_ADMIN_PASSWORD="${COMPANION_NATS_ADMIN_PASSWORD:-admin-$(rnd)}"

stop() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  [[ -z "${CLUSTER_DIR:-}" ]] && rm -rf -- "$DIR"
  echo "cluster stopped"
}
(( KEEP )) || trap stop EXIT

for i in 1 2 3; do
  mkdir -p "$DIR/node-$i"
  COMPANION_NATS_STORE="$DIR/node-$i" "$NATS_SERVER" --config "$HERE/nats-$i.conf" \
    >"$DIR/node-$i.log" 2>&1 &
  PIDS+=("$!")
  echo "node $i: pid $! client 127.0.0.1:1430$i monitor http://127.0.0.1:1830$i store $DIR/node-$i"
done

# A meta leader, seen the same by all three nodes, and every node healthy.
leader=""
for _ in $(seq 1 60); do
  l1="$(curl -fsS http://127.0.0.1:18301/jsz 2>/dev/null | python3 -c 'import json,sys; print((json.load(sys.stdin).get("meta_cluster") or {}).get("leader",""))' 2>/dev/null || true)"
  if [[ -n "$l1" ]] && curl -fsS "http://127.0.0.1:18302/healthz" >/dev/null 2>&1 \
     && curl -fsS "http://127.0.0.1:18303/healthz" >/dev/null 2>&1 \
     && curl -fsS "http://127.0.0.1:18301/healthz" >/dev/null 2>&1; then
    leader="$l1"; break
  fi
  sleep 0.5
done
[[ -n "$leader" ]] || { echo "FAIL: no JetStream meta leader after 30 s"; tail -n 20 "$DIR"/node-*.log; exit 1; }
for i in 1 2 3; do
  curl -fsS "http://127.0.0.1:1830$i/jsz" | python3 -c '
import json, sys
j = json.load(sys.stdin); m = j.get("meta_cluster") or {}
peers = [r["name"] for r in m.get("replicas") or []]
print("node %s: meta_leader=%s cluster_size=%s peers=%s" % (sys.argv[1], m.get("leader"), m.get("cluster_size"), peers))
' "$i"
done
echo "healthz: $(curl -fsS http://127.0.0.1:18301/healthz)"

# A replicated stream, as the worker's streams should be in production (num_replicas: 3).
PY="${PY:-}"
if [[ -n "$PY" ]] && "$PY" -c 'import nats' 2>/dev/null; then
  "$PY" - <<'PYEOF'
import asyncio, os, nats
from nats.js.api import StreamConfig
async def main():
    nc = await nats.connect(["nats://127.0.0.1:14301", "nats://127.0.0.1:14302", "nats://127.0.0.1:14303"],
                            user="admin", password=os.environ["COMPANION_NATS_ADMIN_PASSWORD"])
    js = nc.jetstream()
    for _ in range(40):
        try:
            info = await js.add_stream(StreamConfig(name="R3_CHECK", subjects=["r3check.>"], num_replicas=3))
            break
        except Exception as e:   # a fresh meta group may need a moment
            err = e; await asyncio.sleep(0.5)
    else:
        raise SystemExit(f"FAIL: cannot create an R3 stream: {err}")
    ack = await js.publish("r3check.x", b"hello", headers={"Nats-Msg-Id": "one"})
    info = await js.stream_info("R3_CHECK")
    c = info.cluster
    replicas = [r.name for r in (c.replicas or [])]
    print(f"stream R3_CHECK: replicas=3 leader={c.leader} followers={replicas} msgs={info.state.messages} puback.seq={ack.seq}")
    assert info.config.num_replicas == 3 and len(replicas) == 2, "expected a leader and 2 followers"
    await js.delete_stream("R3_CHECK")
    await nc.close()
asyncio.run(main())
PYEOF
else
  echo "(PY with nats-py not given: skipped the replicated-stream check)"
fi
echo "OK: 3-node JetStream cluster up, meta leader $leader"
if (( KEEP )); then echo "kept running; stop with: kill ${PIDS[*]}"; fi
