#!/usr/bin/env bash
# Proves the least-privilege users of deploy/nats/auth.conf with real clients: starts a
# throwaway nats-server with the production config deploy/nats/nats.conf (which includes
# auth.conf; addresses overridden to loopback 127.0.0.1:14422, monitor 18422, store under /tmp),
# creates the streams as admin, then checks what tb-backend and companion-worker can and cannot do
# with the Python NATS client (nats-py). Prints one line per check; exits non-zero if any check
# fails. Leaves nothing running.
#
# Usage: deploy/nats/test-permissions.sh
# Env:   NATS_SERVER  nats-server binary (default <root>/.local/venv/bin/nats-server, else PATH)
#        PY           a python that has nats-py; default: a venv at
#                     ${COMPANION_LOCAL_DIR:-<root>/.local}/venv-natstest, created once (pip install nats-py)
#        TEST_PORT (14422) TEST_MONITOR_PORT (18422)
set -euo pipefail
HERE="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(cd -- "$HERE/../.." && pwd -P)"
LOCAL_DIR="${COMPANION_LOCAL_DIR:-$ROOT/.local}"
NATS_SERVER="${NATS_SERVER:-$LOCAL_DIR/venv/bin/nats-server}"
[[ -x "$NATS_SERVER" ]] || NATS_SERVER="$(command -v nats-server)" \
  || { echo "no nats-server (set NATS_SERVER, or run deploy/local/stack.sh up)" >&2; exit 2; }
PORT="${TEST_PORT:-14422}"
MPORT="${TEST_MONITOR_PORT:-18422}"
NATS_PY_VERSION=2.16.0

if [[ -z "${PY:-}" ]]; then
  venv="$LOCAL_DIR/venv-natstest"
  if ! "$venv/bin/python" -c "import nats" 2>/dev/null; then
    echo "creating $venv (pip install nats-py==$NATS_PY_VERSION)" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "nats-py==$NATS_PY_VERSION" >&2
  fi
  PY="$venv/bin/python"
fi

DIR="$(mktemp -d /tmp/companion-nats-perms.XXXXXX)"
PID=""
cleanup() {
  if [[ -n "$PID" ]]; then kill -TERM "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf -- "$DIR"
}
trap cleanup EXIT

# The production config and the users it includes (include paths are relative to the including
# file, so both are copied together); command-line flags override its addresses.
cp -- "$HERE/nats.conf" "$HERE/auth.conf" "$DIR/"
export COMPANION_NATS_STORE="$DIR/js"
SERVER_ARGS=(--config "$DIR/nats.conf" -a 127.0.0.1 -p "$PORT" -m "$MPORT" -n companion-perms-test)

rnd() { head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' ; }
export COMPANION_NATS_BACKEND_PASSWORD="backend-$(rnd)"
export COMPANION_NATS_WORKER_PASSWORD="worker-$(rnd)"
export COMPANION_NATS_ADMIN_PASSWORD="admin-$(rnd)"

"$NATS_SERVER" "${SERVER_ARGS[@]}" -t >/dev/null 2>&1 \
  || { "$NATS_SERVER" "${SERVER_ARGS[@]}" -t; exit 1; }
"$NATS_SERVER" "${SERVER_ARGS[@]}" >"$DIR/server.log" 2>&1 &
PID=$!
for _ in $(seq 1 60); do
  curl -fsS "http://127.0.0.1:$MPORT/healthz?js-enabled-only=true" >/dev/null 2>&1 && break
  kill -0 "$PID" 2>/dev/null || { echo "nats-server exited:"; cat "$DIR/server.log"; exit 1; }
  sleep 0.25
done
echo "nats-server $("$NATS_SERVER" --version | awk '{print $2}') on 127.0.0.1:$PORT with deploy/nats/nats.conf + auth.conf"

ROOT="$ROOT" NATS_TEST_URL="nats://127.0.0.1:$PORT" "$PY" - <<'PYEOF'
import asyncio, os, sys, json
import nats
from nats.errors import NoRespondersError, TimeoutError as NatsTimeout
from nats.js.api import StreamConfig, ConsumerConfig, AckPolicy, DeliverPolicy
from nats.js.errors import APIError

URL = os.environ["NATS_TEST_URL"]
PW = {
    "tb-backend": os.environ["COMPANION_NATS_BACKEND_PASSWORD"],
    "companion-worker": os.environ["COMPANION_NATS_WORKER_PASSWORD"],
    "admin": os.environ["COMPANION_NATS_ADMIN_PASSWORD"],
}
INBOX = {"tb-backend": b"_INBOX_tb_backend", "companion-worker": b"_INBOX", "admin": b"_INBOX"}
failures = 0

def check(ok, what, detail=""):
    global failures
    if not ok:
        failures += 1
    print(f"{'PASS' if ok else 'FAIL'}  {what}" + (f"  ({detail})" if detail else ""), flush=True)

async def connect(user):
    errors = []
    async def on_error(e):
        errors.append(str(e))
    nc = await nats.connect(URL, user=user, password=PW[user], inbox_prefix=INBOX[user],
                            error_cb=on_error, allow_reconnect=False, connect_timeout=3)
    return nc, errors

async def violation(errors, kind, subject, wait=1.0):
    """True once the server reported a permissions violation for this subject."""
    needle = f'{kind} to "{subject}"'.lower()
    for _ in range(int(wait / 0.05)):
        if any("permissions violation" in e.lower() and needle in e.lower() for e in errors):
            return True
        await asyncio.sleep(0.05)
    return False

async def stream_msgs(js, name):
    return (await js.stream_info(name)).state.messages

# TB-Backend's three deletion signals: (subject, body, Nats-Msg-Id).
ERASED_USER, ERASED_BOT, DELETED_MSG = "6650f1a2b3c4d5e6f7a8b9c0", "69c15e55c7ebe2c6884f1267", "6b0268e63adb75f2715669b0"
DELETIONS = (
    (f"dm.bot.signal.message_deleted.{DELETED_MSG}", b"", f"deleted:{DELETED_MSG}"),
    (f"dm.bot.signal.memory_cleared.{ERASED_USER}", json.dumps({"userId": ERASED_USER, "botId": ERASED_BOT}).encode(),
     f"cleared:{ERASED_USER}:{ERASED_BOT}:2026-11-27T10:00:00Z"),
    (f"dm.bot.signal.user_erased.{ERASED_USER}", b"", f"erased:{ERASED_USER}"),
)

async def main():
    # --- admin: the streams, as the worker would create them --------------------------------
    admin, _ = await connect("admin")
    ajs = admin.jetstream()
    await ajs.add_stream(StreamConfig(name="DM_BOT_IN", subjects=["dm.bot.in.>", "dm.bot.group.>"], duplicate_window=7200,
                                      allow_direct=True))
    await ajs.add_stream(StreamConfig(name="DM_BOT_OUT", subjects=["dm.bot.out.>"], duplicate_window=7200))
    await ajs.add_stream(StreamConfig(name="DM_BOT_DLQ", subjects=["dm.bot.dlq.>"], allow_direct=True))
    await ajs.add_stream(StreamConfig(name="DM_BOT_SIGNAL", subjects=["dm.bot.signal.>", "dm.bot.schedule.>"],
                                      duplicate_window=7200))
    await ajs.add_stream(StreamConfig(name="DM_BOT_ALERT", subjects=["dm.bot.alert.>"], duplicate_window=7200))
    await ajs.publish("dm.bot.alert.crisis.x", b'{"conversationId":"x","category":"self_harm"}')
    check(True, "admin creates streams DM_BOT_IN, DM_BOT_OUT, DM_BOT_DLQ, DM_BOT_SIGNAL, DM_BOT_ALERT")

    # --- anonymous and wrong password are refused --------------------------------------------
    for label, kw in (("anonymous", {}), ("wrong password", {"user": "tb-backend", "password": "nope"})):
        try:
            async def quiet(e): pass
            nc = await nats.connect(URL, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0,
                                    error_cb=quiet, **kw)
            await nc.close()
            check(False, f"{label} connection refused")
        except Exception as e:
            check("authorization violation" in str(e).lower(), f"{label} connection refused", str(e))

    # --- worker start-up: streams and its durable consumer -----------------------------------
    worker, werr = await connect("companion-worker")
    wjs = worker.jetstream()
    try:
        await wjs.stream_info("DM_BOT_IN")
        await wjs.update_stream(StreamConfig(name="DM_BOT_IN", subjects=["dm.bot.in.>", "dm.bot.group.>"], duplicate_window=7200,
                                             allow_direct=True, description="Bot-bound DMs published by TB-Backend"))
        await wjs.stream_info("DM_BOT_DLQ")
        ci = await wjs.add_consumer("DM_BOT_IN", ConsumerConfig(
            durable_name="companion-worker", name="companion-worker", ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL, filter_subject="dm.bot.in.>", ack_wait=30, max_deliver=5))
        await wjs.consumer_info("DM_BOT_IN", "companion-worker")
        check(ci.name == "companion-worker", "worker CAN set up: stream info (IN, DLQ)/update, create + read its durable consumer")
    except Exception as e:
        check(False, "worker CAN set up: stream info (IN, DLQ)/update, create + read its durable consumer", repr(e))
    exhausted = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."
    try:
        await wjs.add_stream(StreamConfig(name="DM_BOT_EXHAUSTED",
                                          subjects=[exhausted + "DM_BOT_IN.*", exhausted + "DM_BOT_SIGNAL.*"]))
        await wjs.stream_info("DM_BOT_EXHAUSTED")
        ci = await wjs.add_consumer("DM_BOT_EXHAUSTED", ConsumerConfig(
            durable_name="companion-worker_exhausted", name="companion-worker_exhausted",
            ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL, ack_wait=30, max_deliver=5,
            filter_subjects=[exhausted + "DM_BOT_IN.companion-worker",
                             exhausted + "DM_BOT_SIGNAL.companion-worker_signals"]))
        psub = await wjs.pull_subscribe_bind(durable="companion-worker_exhausted", stream="DM_BOT_EXHAUSTED")
        try:
            await psub.fetch(1, timeout=0.5)
        except (NatsTimeout, asyncio.TimeoutError):
            pass
        denied = [e for e in werr if "permissions violation" in e.lower()]
        check(ci.name == "companion-worker_exhausted" and not denied,
              "worker CAN create DM_BOT_EXHAUSTED (the max-deliveries advisories) and pull from its consumer there",
              "; ".join(denied))
    except Exception as e:
        check(False, "worker CAN create DM_BOT_EXHAUSTED (the max-deliveries advisories) and pull from its consumer there",
              repr(e))
    try:
        await wjs.delete_stream("DM_BOT_OUT")
        check(False, "worker CANNOT delete a stream")
    except (NatsTimeout, NoRespondersError, asyncio.TimeoutError) as e:
        check(await violation(werr, "publish", "$JS.API.STREAM.DELETE.DM_BOT_OUT"), "worker CANNOT delete a stream", type(e).__name__)

    # --- backend ---------------------------------------------------------------------------
    backend, berr = await connect("tb-backend")
    bjs = backend.jetstream()
    got_out, got_typing = [], []
    async def on_out(m): got_out.append(m)
    async def on_typing(m): got_typing.append(m)
    await backend.subscribe("dm.bot.out.>", cb=on_out)
    await backend.subscribe("dm.bot.typing.>", cb=on_typing)
    await backend.flush()

    event = json.dumps({"messageId": "6b0268e63adb75f2715669a7", "content": "hi"}).encode()
    try:
        ack = await bjs.publish("dm.bot.in.x.y", event, timeout=3, headers={"Nats-Msg-Id": "6b0268e63adb75f2715669a7"})
        check(ack.stream == "DM_BOT_IN" and not ack.duplicate,
              "backend CAN publish dm.bot.in.x.y and gets a PubAck", f"stream={ack.stream} seq={ack.seq}")
        dup = await bjs.publish("dm.bot.in.x.y", event, timeout=3, headers={"Nats-Msg-Id": "6b0268e63adb75f2715669a7"})
        check(dup.duplicate and dup.seq == ack.seq, "backend re-publish with the same Nats-Msg-Id: PubAck duplicate=true, same seq",
              f"duplicate={dup.duplicate} seq={dup.seq}")
    except Exception as e:
        check(False, "backend CAN publish dm.bot.in.x.y and gets a PubAck", repr(e))
    try:
        group = json.dumps({"messageId": "6b0268e63adb75f2715669a8", "content": "hi all"}).encode()
        ack = await bjs.publish("dm.bot.group.y", group, timeout=3, headers={"Nats-Msg-Id": "6b0268e63adb75f2715669a8"})
        check(ack.stream == "DM_BOT_IN", "backend CAN publish a group message dm.bot.group.y", f"seq={ack.seq}")
    except Exception as e:
        check(False, "backend CAN publish a group message dm.bot.group.y", repr(e))

    try:
        psub = await bjs.pull_subscribe_bind(durable="companion-worker", stream="DM_BOT_IN",
                                             inbox_prefix=b"_INBOX_tb_backend.")
        msgs = await psub.fetch(1, timeout=1.5)
        check(False, "backend CANNOT fetch from the worker's consumer", f"got {len(msgs)} message(s)")
    except (NatsTimeout, asyncio.TimeoutError, NoRespondersError) as e:
        v = await violation(berr, "publish", "$JS.API.CONSUMER.MSG.NEXT.DM_BOT_IN.companion-worker")
        check(v, "backend CANNOT fetch from the worker's consumer", "permissions violation on CONSUMER.MSG.NEXT")
    before = await stream_msgs(ajs, "DM_BOT_OUT")
    await backend.publish("dm.bot.out.x", b'{"forged":true}')
    await backend.flush()
    v = await violation(berr, "publish", "dm.bot.out.x")
    check(v and await stream_msgs(ajs, "DM_BOT_OUT") == before,
          "backend CANNOT publish dm.bot.out.x", "permissions violation; DM_BOT_OUT unchanged")
    await backend.subscribe("dm.bot.in.>")
    check(await violation(berr, "subscription", "dm.bot.in.>"), "backend CANNOT subscribe dm.bot.in.> (core)")
    try:
        m = await bjs.get_msg("DM_BOT_IN", seq=1, direct=True)
        check(False, "backend CANNOT direct-get inbound events", f"got seq {m.seq}")
    except (NatsTimeout, NoRespondersError, asyncio.TimeoutError) as e:
        check(await violation(berr, "publish", "$JS.API.DIRECT.GET.DM_BOT_IN"),
              "backend CANNOT direct-get inbound events", type(e).__name__)
    await backend.publish("dm.bot.settled.x", b"{}")
    check(await violation(berr, "publish", "dm.bot.settled.x"), "backend CANNOT publish dm.bot.settled.x")
    try:
        ack = await bjs.publish("dm.bot.signal.spot_draft.d1", b'{"draftId":"d1","status":"approved"}', timeout=3,
                                headers={"Nats-Msg-Id": "d1:approved"})
        check(ack.stream == "DM_BOT_SIGNAL", "backend CAN publish a spot review (PubAck from DM_BOT_SIGNAL)",
              f"seq={ack.seq}")
    except Exception as e:
        check(False, "backend CAN publish a spot review", repr(e))
    # The deletion signals (docs/tb-backend.md "Deleting"): tb-backend's alone.
    for subject, body, msg_id in DELETIONS:
        kind = subject.split(".")[3]
        try:
            ack = await bjs.publish(subject, body, timeout=3, headers={"Nats-Msg-Id": msg_id})
            check(ack.stream == "DM_BOT_SIGNAL" and not ack.duplicate,
                  f"backend CAN publish {kind} (PubAck from DM_BOT_SIGNAL)", f"seq={ack.seq}")
        except Exception as e:
            check(False, f"backend CAN publish {kind}", repr(e))
    # ... but not the workers' own signals: due reminders, memory extraction, their schedules.
    for subject in ("dm.bot.signal.reminder.r1", "dm.bot.schedule.reminder.r1", "dm.bot.signal.memory.x.y"):
        before = await stream_msgs(ajs, "DM_BOT_SIGNAL")
        await backend.publish(subject, b"{}")
        await backend.flush()
        v = await violation(berr, "publish", subject)
        check(v and await stream_msgs(ajs, "DM_BOT_SIGNAL") == before, f"backend CANNOT publish {subject}",
              "permissions violation; DM_BOT_SIGNAL unchanged")
    await backend.subscribe("dm.bot.settled.>")
    check(await violation(berr, "subscription", "dm.bot.settled.>"), "backend CANNOT subscribe dm.bot.settled.>")

    # --- worker ------------------------------------------------------------------------------
    try:
        psub = await wjs.pull_subscribe_bind(durable="companion-worker", stream="DM_BOT_IN")
        msgs = await psub.fetch(1, timeout=3)
        m = msgs[0]
        await m.in_progress()
        await m.ack_sync(timeout=3)
        check(m.subject == "dm.bot.in.x.y" and m.data == event,
              "worker CAN fetch from its consumer and ack (+WPI, ack_sync)", f"subject={m.subject}")
    except Exception as e:
        check(False, "worker CAN fetch from its consumer and ack", repr(e))
    try:
        ack = await wjs.publish("dm.bot.out.x", b'{"messageId":"6b0268e62638450d0e0eb29a"}', timeout=3,
                                headers={"Nats-Msg-Id": "6b0268e62638450d0e0eb29a"})
        check(ack.stream == "DM_BOT_OUT", "worker CAN publish dm.bot.out.x (PubAck from DM_BOT_OUT)", f"seq={ack.seq}")
    except Exception as e:
        check(False, "worker CAN publish dm.bot.out.x", repr(e))
    await worker.publish("dm.bot.typing.x", b'{"typing":true}')
    try:
        ack = await wjs.publish("dm.bot.dlq.x.y", b"bad", timeout=3, headers={"Companion-Dlq-Reason": "test"})
        check(ack.stream == "DM_BOT_DLQ", "worker CAN publish dm.bot.dlq.x.y (PubAck from DM_BOT_DLQ)")
    except Exception as e:
        check(False, "worker CAN publish dm.bot.dlq.x.y", repr(e))
    before = await stream_msgs(ajs, "DM_BOT_IN")
    await worker.publish("dm.bot.in.x.y", b'{"forged":true}')
    await worker.flush()
    v = await violation(werr, "publish", "dm.bot.in.x.y")
    check(v and await stream_msgs(ajs, "DM_BOT_IN") == before,
          "worker CANNOT publish dm.bot.in.x.y", "permissions violation; DM_BOT_IN unchanged")
    await worker.subscribe("dm.bot.in.>")
    check(await violation(werr, "subscription", "dm.bot.in.>"), "worker CANNOT subscribe dm.bot.in.> (core, bypassing the consumer)")
    # No bot loops: a worker cannot put a companion's message on a group's inbound subject.
    await worker.publish("dm.bot.group.y", b'{"forged":true}')
    await worker.flush()
    v = await violation(werr, "publish", "dm.bot.group.y")
    check(v and await stream_msgs(ajs, "DM_BOT_IN") == before,
          "worker CANNOT publish dm.bot.group.y", "permissions violation; DM_BOT_IN unchanged")
    try:
        ack = await wjs.publish("dm.bot.schedule.reminder.r2", b'{"reminderId":"r2"}', timeout=3,
                                headers={"Nats-Msg-Id": "r2"})
        check(ack.stream == "DM_BOT_SIGNAL", "worker CAN publish a reminder's schedule (PubAck from DM_BOT_SIGNAL)")
    except Exception as e:
        check(False, "worker CAN publish a reminder's schedule", repr(e))
    before = await stream_msgs(ajs, "DM_BOT_SIGNAL")
    await worker.publish("dm.bot.signal.spot_draft.d2", b'{"forged":true}')
    await worker.flush()
    v = await violation(werr, "publish", "dm.bot.signal.spot_draft.d2")
    check(v and await stream_msgs(ajs, "DM_BOT_SIGNAL") == before,
          "worker CANNOT publish a spot review", "permissions violation; DM_BOT_SIGNAL unchanged")
    try:
        by_seq = await wjs.get_msg("DM_BOT_IN", seq=1, direct=True)
        last = await wjs.get_last_msg("DM_BOT_IN", "dm.bot.in.x.y", direct=True)
        check(by_seq.data == event and last.seq == 1,
              "worker CAN direct-get inbound events (by sequence, last by subject)", f"seq={by_seq.seq}")
    except Exception as e:
        check(False, "worker CAN direct-get inbound events", repr(e))
    settled = []
    async def on_settled(m): settled.append(m)
    await worker.subscribe("dm.bot.settled.>", cb=on_settled)
    await worker.flush()
    await worker.publish("dm.bot.settled.x", b'{"conversationId":"x"}')
    for _ in range(40):
        if settled:
            break
        await asyncio.sleep(0.05)
    denied = [e for e in werr if "settled" in e]
    check(len(settled) == 1 and not denied, "worker CAN publish and subscribe dm.bot.settled.> (core)",
          f"{len(settled)} received")

    # --- the backend sees the worker's output --------------------------------------------------
    for _ in range(40):
        if got_out and got_typing:
            break
        await asyncio.sleep(0.05)
    check(len(got_out) == 1 and got_out[0].subject == "dm.bot.out.x", "backend receives the completion on dm.bot.out.x",
          f"{len(got_out)} message(s); the forged one was dropped")
    check(len(got_typing) == 1, "backend receives the typing event on dm.bot.typing.x")

    # --- the fan-out's own code reads completions and alerts through its durable consumers ---------
    try:
        ack = await wjs.publish("dm.bot.alert.crisis.x", b'{"conversationId":"x","messageId":"m1"}', timeout=3,
                                headers={"Nats-Msg-Id": "crisis:m1"})
        check(ack.stream == "DM_BOT_ALERT", "worker CAN publish a crisis alert (PubAck from DM_BOT_ALERT)")
    except Exception as e:
        check(False, "worker CAN publish a crisis alert", repr(e))
    script = os.path.join(os.environ["ROOT"], "deploy/tb-backend/test/consumer-check.js")
    env = dict(os.environ, NATS_URL=URL, NATS_USER="tb-backend", NATS_PASSWORD=PW["tb-backend"])
    proc = await asyncio.create_subprocess_exec("node", script, env=env, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    seen = [json.loads(l) for l in out.decode().splitlines() if l.strip()]
    by_stream = {s.get("stream"): s for s in seen}
    check(by_stream.get("DM_BOT_OUT", {}).get("subject") == "dm.bot.out.x",
          "backend (the fan-out's code) CAN create and read its durable consumer tb-backend-out on DM_BOT_OUT",
          json.dumps(by_stream.get("DM_BOT_OUT", seen)))
    check(by_stream.get("DM_BOT_ALERT", {}).get("subject") == "dm.bot.alert.crisis.x",
          "backend (the fan-out's code) CAN create and read its durable consumer tb-backend-alerts on DM_BOT_ALERT",
          json.dumps(by_stream.get("DM_BOT_ALERT", seen)))
    bjs_short = backend.jetstream(timeout=1)
    try:
        await bjs_short.add_consumer("DM_BOT_OUT", ConsumerConfig(durable_name="sneaky", ack_policy=AckPolicy.EXPLICIT))
        check(False, "backend CANNOT create another consumer on DM_BOT_OUT", "created")
    except Exception as e:
        try:
            await ajs.consumer_info("DM_BOT_OUT", "sneaky")
            exists = True
        except Exception:
            exists = False
        denied = any("permissions violation" in x.lower() and "dm_bot_out.sneaky" in x.lower() for x in berr)
        check(denied and not exists, "backend CANNOT create another consumer on DM_BOT_OUT",
              f"{type(e).__name__}; permissions violation; no such consumer")

    # --- the worker's memory signals, and erasing a user (crates/memory/src, crates/store/src/bus/erase.rs) ---------
    for subject in ("dm.bot.signal.memory.x.y", "dm.bot.schedule.memory.x.y"):
        try:
            ack = await wjs.publish(subject, b"", timeout=3, headers={"Nats-Msg-Id": f"{subject}:1"})
            check(ack.stream == "DM_BOT_SIGNAL", f"worker CAN publish {subject} (PubAck from DM_BOT_SIGNAL)",
                  f"seq={ack.seq}")
        except Exception as e:
            check(False, f"worker CAN publish {subject}", repr(e))
    # An erased user's DM conversation: its subject purged in the inbound, outbound and dead-letter streams.
    for stream, subject in (("DM_BOT_IN", "dm.bot.in.k.erased"), ("DM_BOT_OUT", "dm.bot.out.erased"),
                            ("DM_BOT_DLQ", "dm.bot.dlq.k.erased")):
        await ajs.publish(subject, b'{"senderId":"erased"}')
        before = await stream_msgs(ajs, stream)
        try:
            ok = await wjs.purge_stream(stream, subject=subject)
            after = await stream_msgs(ajs, stream)
            check(ok and after == before - 1 and after > 0, f"worker CAN purge {subject} of {stream} (only that subject)",
                  f"{before} -> {after} messages")
        except Exception as e:
            check(False, f"worker CAN purge {subject} of {stream}", repr(e))
    # A group message the user sent, deleted by its sequence; their dead letter found by its sender (a
    # direct get of the next message on the dead-letter subjects, as the worker scans) and deleted.
    try:
        ack = await ajs.publish("dm.bot.group.erased", b'{"senderId":"erased"}')
        ok = await wjs.delete_msg("DM_BOT_IN", ack.seq)
        try:
            await ajs.get_msg("DM_BOT_IN", ack.seq)
            gone = False
        except APIError:
            gone = True
        check(ok and gone, "worker CAN delete a message of DM_BOT_IN by sequence", f"seq={ack.seq}")
    except Exception as e:
        check(False, "worker CAN delete a message of DM_BOT_IN by sequence", repr(e))
    try:
        ack = await ajs.publish("dm.bot.dlq.group.erased", b'{"senderId":"erased"}')
        m = await wjs.get_msg("DM_BOT_DLQ", seq=ack.seq, subject="dm.bot.dlq.>", direct=True, next=True)
        check(m.seq == ack.seq and b'"senderId":"erased"' in m.data,
              "worker CAN direct-get from DM_BOT_DLQ (next message on dm.bot.dlq.>)", f"seq={m.seq}")
        ok = await wjs.delete_msg("DM_BOT_DLQ", m.seq)
        check(ok, "worker CAN delete a message of DM_BOT_DLQ by sequence", f"seq={m.seq}")
    except Exception as e:
        check(False, "worker CAN direct-get from and delete a message of DM_BOT_DLQ", repr(e))
    # Never the signal and alert streams; never TB-Backend's deletion signals.
    wjs_short = worker.jetstream(timeout=1)
    for api, stream, call in (
        ("PURGE", "DM_BOT_SIGNAL", lambda: wjs_short.purge_stream("DM_BOT_SIGNAL")),
        ("PURGE", "DM_BOT_ALERT", lambda: wjs_short.purge_stream("DM_BOT_ALERT")),
        ("MSG.DELETE", "DM_BOT_SIGNAL", lambda: wjs_short.delete_msg("DM_BOT_SIGNAL", 1)),
    ):
        what = f"worker CANNOT {'purge' if api == 'PURGE' else 'delete a message of'} {stream}"
        before = await stream_msgs(ajs, stream)
        try:
            await call()
            check(False, what, "the request was answered")
        except Exception as e:
            v = await violation(werr, "publish", f"$JS.API.STREAM.{api}.{stream}")
            check(v and before > 0 and await stream_msgs(ajs, stream) == before, what,
                  f"{type(e).__name__}; permissions violation; {before} messages kept")
    for subject, body, msg_id in DELETIONS:
        before = await stream_msgs(ajs, "DM_BOT_SIGNAL")
        await worker.publish(subject, body, headers={"Nats-Msg-Id": msg_id + ":worker"})
        await worker.flush()
        v = await violation(werr, "publish", subject)
        check(v and await stream_msgs(ajs, "DM_BOT_SIGNAL") == before, f"worker CANNOT publish {subject.split('.')[3]}",
              "permissions violation; DM_BOT_SIGNAL unchanged")

    for nc in (backend, worker, admin):
        await nc.close()

asyncio.run(main())
print(f"\n{'ALL CHECKS PASSED' if failures == 0 else f'{failures} CHECK(S) FAILED'}")
sys.exit(1 if failures else 0)
PYEOF
