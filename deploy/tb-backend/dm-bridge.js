#!/usr/bin/env node
// TB-Backend's side of the companion contract, as a runnable script (docs/tb-backend.md shows
// the same code inside routes/dm.js): publish ONE bot-bound DM event to JetStream and wait for the
// worker's completion whose inReplyTo is the event's messageId.
//
//   node dm-bridge.js [--no-wait] [--timeout SECS] ['<event json>']     (no JSON argument: read stdin)
//
// stdout: with --no-wait, the PubAck as JSON ({"stream","seq","duplicate","subject"}); otherwise
//         the completion event as JSON (one line). Typing events and progress go to stderr.
// exit:   0 done; 1 timed out waiting for the completion (or the PubAck); 2 bad usage or event;
//         3 NATS error (cannot connect, no stream for the subject, permission denied).
//
// Environment:
//   NATS_URL                  server(s), comma separated                 (nats://127.0.0.1:4222)
//   NATS_USER, NATS_PASSWORD  credentials (user tb-backend of deploy/nats/auth.conf), optional
//   NATS_INBOX_PREFIX         reply-inbox prefix; auth.conf lets tb-backend use only
//                             _INBOX_tb_backend                          (_INBOX_tb_backend)
//   COMPANION_SUBJECT_PREFIX  first tokens of every subject, as for the worker   (dm.bot)
//   COMPANION_WAIT_SECS       default for --timeout                      (120)
'use strict';

const { connect, JSONCodec, ErrorCode } = require('nats');

const OID = /^[0-9a-fA-F]{24}$/;
const jc = JSONCodec();

function usage(msg) {
  if (msg) process.stderr.write(`dm-bridge: ${msg}\n`);
  process.stderr.write("usage: dm-bridge.js [--no-wait] [--timeout SECS] ['<event json>']  (or the event on stdin)\n");
  process.exit(2);
}

function parseArgs(argv) {
  const opts = { wait: true, timeoutSecs: Number(process.env.COMPANION_WAIT_SECS || 120), json: null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--no-wait') opts.wait = false;
    else if (a === '--timeout') opts.timeoutSecs = Number(argv[++i]);
    else if (a === '-h' || a === '--help') usage();
    else if (a.startsWith('--')) usage(`unknown option ${a}`);
    else if (opts.json === null) opts.json = a;
    else usage('more than one event given');
  }
  if (!(opts.timeoutSecs > 0)) usage('--timeout must be a positive number of seconds');
  return opts;
}

async function readStdin() {
  const chunks = [];
  for await (const c of process.stdin) chunks.push(c);
  return Buffer.concat(chunks).toString('utf8');
}

// The shape the worker accepts (README "Event contract"); the worker validates again and
// dead-letters what it rejects, so this only catches mistakes early.
function checkEvent(ev) {
  if (ev === null || typeof ev !== 'object' || Array.isArray(ev)) return 'the event must be a JSON object';
  for (const k of ['messageId', 'conversationId', 'senderId', 'botId']) {
    if (typeof ev[k] !== 'string' || !OID.test(ev[k])) return `${k} must be a 24-hex ObjectId string`;
  }
  if (typeof ev.content !== 'string') return 'content must be a string';
  if (typeof ev.sentAt !== 'string') return 'sentAt must be an RFC 3339 string';
  return null;
}

// --- the part TB-Backend uses (see docs/tb-backend.md) ---------------------------------------

const PREFIX = process.env.COMPANION_SUBJECT_PREFIX || 'dm.bot';
const subjects = {
  inbound: (ev) => `${PREFIX}.in.${ev.botId}.${ev.conversationId}`,
  outbound: (conversationId) => `${PREFIX}.out.${conversationId}`,
  typing: (conversationId) => `${PREFIX}.typing.${conversationId}`,
};

async function connectNats() {
  return connect({
    servers: (process.env.NATS_URL || 'nats://127.0.0.1:4222').split(',').map((s) => s.trim()),
    user: process.env.NATS_USER || undefined,
    pass: process.env.NATS_PASSWORD || undefined,
    inboxPrefix: process.env.NATS_INBOX_PREFIX || '_INBOX_tb_backend',
    name: 'tb-backend-dm-bridge',
    timeout: 5000, // connect timeout (ms)
  });
}

// Publishes the event with Nats-Msg-Id = messageId: a repeat within the stream's 2-hour
// duplicate window is acknowledged with duplicate=true and stored only once.
async function publishDm(js, ev, timeoutMs = 5000) {
  const subject = subjects.inbound(ev);
  const ack = await js.publish(subject, jc.encode(ev), { msgID: ev.messageId, timeout: timeoutMs });
  return { stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate, subject };
}

// ----------------------------------------------------------------------------------------------

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const text = opts.json !== null ? opts.json : await readStdin();
  let ev;
  try {
    ev = JSON.parse(text);
  } catch (e) {
    usage(`the event is not JSON: ${e.message}`);
  }
  const bad = checkEvent(ev);
  if (bad) usage(bad);

  let nc;
  try {
    nc = await connectNats();
  } catch (e) {
    process.stderr.write(`dm-bridge: cannot connect to NATS: ${e.message}\n`);
    process.exit(3);
  }
  const js = nc.jetstream();
  let exitCode = 0;
  let timer;

  try {
    // Subscribe BEFORE publishing, so a fast reply cannot be missed.
    let resolveDone;
    const done = new Promise((r) => { resolveDone = r; });
    if (opts.wait) {
      const out = nc.subscribe(subjects.outbound(ev.conversationId));
      const typing = nc.subscribe(subjects.typing(ev.conversationId));
      (async () => {
        for await (const m of typing) {
          process.stderr.write(`dm-bridge: typing ${JSON.stringify(jc.decode(m.data))}\n`);
        }
      })().catch(() => {});
      (async () => {
        for await (const m of out) {
          let c;
          try { c = jc.decode(m.data); } catch { continue; }
          if (c && (c.inReplyTo === ev.messageId || (c.covers || []).includes(ev.messageId))) { resolveDone(c); break; }
        }
      })().catch(() => {});
      await nc.flush(); // the server has the subscriptions before the event goes out
    }

    const ack = await publishDm(js, ev);
    process.stderr.write(`dm-bridge: published ${ack.subject} -> stream ${ack.stream} seq ${ack.seq}` +
      `${ack.duplicate ? ' (DUPLICATE: this messageId was already accepted; not stored again)' : ''}\n`);
    if (!opts.wait) {
      process.stdout.write(`${JSON.stringify(ack)}\n`);
    } else {
      const timeout = new Promise((r) => { timer = setTimeout(() => r(null), opts.timeoutSecs * 1000); });
      const completion = await Promise.race([done, timeout]);
      if (completion) {
        process.stdout.write(`${JSON.stringify(completion)}\n`);
      } else {
        process.stderr.write(`dm-bridge: no completion with inReplyTo=${ev.messageId} within ${opts.timeoutSecs}s` +
          `${ack.duplicate ? ' (the event was a duplicate: its completion, if any, went out before we subscribed; it is in dm_messages with this inReplyTo)' : ''}\n`);
        exitCode = 1;
      }
    }
  } catch (e) {
    if (e.code === ErrorCode.NoResponders) {
      process.stderr.write(`dm-bridge: no JetStream stream stores ${subjects.inbound(ev)} (is a worker or the stream set up?)\n`);
      exitCode = 3;
    } else if (e.code === ErrorCode.Timeout) {
      process.stderr.write('dm-bridge: timed out waiting for the PubAck\n');
      exitCode = 1;
    } else {
      process.stderr.write(`dm-bridge: ${e.message}\n`);
      exitCode = 3;
    }
  } finally {
    clearTimeout(timer);
    await nc.close().catch(() => {});
  }
  process.exit(exitCode);
}

main();
