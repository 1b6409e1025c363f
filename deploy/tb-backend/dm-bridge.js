#!/usr/bin/env node
// TB-Backend's side of the companion contract, as a runnable script (docs/tb-backend.md shows
// the same code inside routes/dm.js): publish ONE bot-bound DM event to JetStream and wait for the
// worker's completion whose inReplyTo is the event's messageId.
//
//   node dm-bridge.js [--no-wait] [--timeout SECS] ['<event json>']     (no JSON argument: read stdin)
//   node dm-bridge.js --spot-review [--no-wait] [--timeout SECS] ['<review json>']
//   node dm-bridge.js --group [--no-wait] [--timeout SECS] ['<group message json>']
//   node dm-bridge.js --takeover ['<takeover json>']
//   node dm-bridge.js --message-deleted | --memory-cleared | --user-erased ['<deletion json>']
//
// --spot-review: publish a spot draft's review instead ({"draftId", "status": "approved"|"rejected",
// "spotId"?, "note"?, "reviewedAt"}; the admin tool stores the status on the draft first) and wait for
// the companion's follow-up: the completion with trigger {kind: "spot_review", id: "<draftId>:<status>"}.
//
// --group: publish a user's message to a group conversation (a DM event without botId) once, on
// <prefix>.group.<conversationId>, and print every companion message with respondsTo = its messageId,
// one JSON line each as they come, until COMPANION_GROUP_QUIET_SECS (5) pass without another.
//
// --takeover: a moderator pauses or resumes a conversation ({"conversationId", "action": "pause"|"resume",
// "by": "<moderator id>", "at"?: RFC 3339 (default now), "reason"?, "catchUp"?: false}): publishes
// {action, by, at, reason?, catchUp?} on <prefix>.signal.takeover.<conversationId> with
// Nats-Msg-Id = <conversationId>:<action>:<at> and prints the PubAck (nothing to wait for: a pause has
// no completion; on resume the companion's answer to the latest held message is an ordinary completion).
//
// Deletion (docs/tb-backend.md "Deleting: a message, what companions remember, a user"; each prints the
// PubAck, there is nothing to wait for; the workers act within seconds, idempotently):
// --message-deleted '{"messageId"}': a user deleted a message of a DM with a companion (TB-Backend deletes
//   the dm_messages document itself). Publishes an empty body on <prefix>.signal.message_deleted.<messageId>,
//   Nats-Msg-Id deleted:<messageId> (publishMessageDeleted): the message and the companion's reply leave
//   the companion's history, facts learned only from it and the answering turn's recorded outputs go, a
//   summary written from it is rebuilt.
// --memory-cleared '{"userId", "botId"?, "at"?}': the user cleared what one companion (botId) or all of them
//   (no botId) remember. Publishes {userId, botId?} on <prefix>.signal.memory_cleared.<userId>, Nats-Msg-Id
//   cleared:<userId>:<botId|all>:<at> (at: RFC 3339, default now; give the same at to make a retry a
//   duplicate) (publishMemoryCleared): facts and summaries go; the account and the history stay.
// --user-erased '{"userId"}': the user's account is deleted. Publishes an empty body on
//   <prefix>.signal.user_erased.<userId>, Nats-Msg-Id erased:<userId> (publishUserErased): every fact,
//   summary, history row, reminder text, flow state and recorded output of the user, and their messages in
//   the inbound, outbound and dead-letter streams.
// Only tb-backend may publish these three (deploy/nats/auth.conf).
//
// require('./dm-bridge') exports the publishers (publishDm, publishGroupMessage, publishSpotReview,
// publishTakeover, publishMessageDeleted, publishMemoryCleared, publishUserErased) without running the CLI.
//
// A completion with visibleTo (a crisis referral in a group) is for those users only: the bridge says so
// on stderr, and TB-Backend emits it to those users' sockets, never to the conversation's room.
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
  process.stderr.write("usage: dm-bridge.js [--spot-review | --group | --takeover | --message-deleted | --memory-cleared | --user-erased] [--no-wait] [--timeout SECS] ['<event, review, takeover or deletion json>']  (or on stdin)\n");
  process.exit(2);
}

function parseArgs(argv) {
  const opts = { wait: true, review: false, group: false, takeover: false, deletion: null, timeoutSecs: Number(process.env.COMPANION_WAIT_SECS || 120), json: null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--no-wait') opts.wait = false;
    else if (a === '--spot-review') opts.review = true;
    else if (a === '--group') opts.group = true;
    else if (a === '--takeover') opts.takeover = true;
    else if (DELETIONS.includes(a.slice(2))) {
      if (opts.deletion !== null) usage('only one of --message-deleted, --memory-cleared and --user-erased');
      opts.deletion = a.slice(2);
    }
    else if (a === '--timeout') opts.timeoutSecs = Number(argv[++i]);
    else if (a === '-h' || a === '--help') usage();
    else if (a.startsWith('--')) usage(`unknown option ${a}`);
    else if (opts.json === null) opts.json = a;
    else usage('more than one event given');
  }
  if (!(opts.timeoutSecs > 0)) usage('--timeout must be a positive number of seconds');
  if ([opts.review, opts.group, opts.takeover, opts.deletion !== null].filter(Boolean).length > 1) {
    usage('only one of --spot-review, --group, --takeover and a deletion');
  }
  if (opts.takeover || opts.deletion !== null) opts.wait = false;
  return opts;
}

async function readStdin() {
  const chunks = [];
  for await (const c of process.stdin) chunks.push(c);
  return Buffer.concat(chunks).toString('utf8');
}

// The shape the worker accepts (README "Event contract"); the worker validates again and
// dead-letters what it rejects, so this only catches mistakes early.
function checkEvent(ev, group = false) {
  if (ev === null || typeof ev !== 'object' || Array.isArray(ev)) return 'the event must be a JSON object';
  if (group && ev.botId !== undefined) return 'a group message has no botId (the worker decides who answers)';
  for (const k of group ? ['messageId', 'conversationId', 'senderId'] : ['messageId', 'conversationId', 'senderId', 'botId']) {
    if (typeof ev[k] !== 'string' || !OID.test(ev[k])) return `${k} must be a 24-hex ObjectId string`;
  }
  if (typeof ev.content !== 'string') return 'content must be a string';
  if (typeof ev.sentAt !== 'string') return 'sentAt must be an RFC 3339 string';
  return null;
}

function checkReview(r) {
  if (r === null || typeof r !== 'object' || Array.isArray(r)) return 'the review must be a JSON object';
  if (typeof r.draftId !== 'string' || !OID.test(r.draftId)) return 'draftId must be a 24-hex ObjectId string';
  if (r.status !== 'approved' && r.status !== 'rejected') return 'status must be "approved" or "rejected"';
  if (r.spotId !== undefined && (typeof r.spotId !== 'string' || !OID.test(r.spotId))) return 'spotId must be a 24-hex ObjectId string';
  if (r.note !== undefined && typeof r.note !== 'string') return 'note must be a string';
  if (typeof r.reviewedAt !== 'string') return 'reviewedAt must be an RFC 3339 string';
  return null;
}

function checkTakeover(t) {
  if (t === null || typeof t !== 'object' || Array.isArray(t)) return 'the takeover must be a JSON object';
  if (typeof t.conversationId !== 'string' || !OID.test(t.conversationId)) return 'conversationId must be a 24-hex ObjectId string';
  if (t.action !== 'pause' && t.action !== 'resume') return 'action must be "pause" or "resume"';
  if (typeof t.by !== 'string' || !t.by) return 'by must be the moderator\'s id';
  if (t.at !== undefined && (typeof t.at !== 'string' || Number.isNaN(Date.parse(t.at)))) return 'at must be an RFC 3339 string';
  if (t.reason !== undefined && typeof t.reason !== 'string') return 'reason must be a string';
  if (t.catchUp !== undefined && typeof t.catchUp !== 'boolean') return 'catchUp must be true or false';
  return null;
}

// The deletion options (--message-deleted, ...), by the signal kind they publish.
const DELETIONS = ['message-deleted', 'memory-cleared', 'user-erased'];

function checkDeletion(kind, d) {
  if (d === null || typeof d !== 'object' || Array.isArray(d)) return 'the deletion must be a JSON object';
  const key = kind === 'message-deleted' ? 'messageId' : 'userId';
  if (typeof d[key] !== 'string' || !OID.test(d[key])) return `${key} must be a 24-hex ObjectId string`;
  if (kind === 'memory-cleared') {
    if (d.botId !== undefined && (typeof d.botId !== 'string' || !OID.test(d.botId))) return 'botId must be a 24-hex ObjectId string';
    if (d.at !== undefined && (typeof d.at !== 'string' || Number.isNaN(Date.parse(d.at)))) return 'at must be an RFC 3339 string';
  }
  return null;
}

// --- the part TB-Backend uses (see docs/tb-backend.md) ---------------------------------------

const PREFIX = process.env.COMPANION_SUBJECT_PREFIX || 'dm.bot';
const subjects = {
  inbound: (ev) => `${PREFIX}.in.${ev.botId}.${ev.conversationId}`,
  group: (conversationId) => `${PREFIX}.group.${conversationId}`,
  outbound: (conversationId) => `${PREFIX}.out.${conversationId}`,
  typing: (conversationId) => `${PREFIX}.typing.${conversationId}`,
  spotReview: (draftId) => `${PREFIX}.signal.spot_draft.${draftId}`,
  takeover: (conversationId) => `${PREFIX}.signal.takeover.${conversationId}`,
  messageDeleted: (messageId) => `${PREFIX}.signal.message_deleted.${messageId}`,
  memoryCleared: (userId) => `${PREFIX}.signal.memory_cleared.${userId}`,
  userErased: (userId) => `${PREFIX}.signal.user_erased.${userId}`,
};

// Who may see a completion: everyone in the conversation's room, or, when it has visibleTo (a crisis
// referral in a group), only those users, never the others of the group.
function audience(c) {
  return Array.isArray(c.visibleTo) && c.visibleTo.length
    ? { users: c.visibleTo.map(String) }
    : { room: c.conversationId };
}

// extra: connect options of a long-running client (the fan-out service keeps trying, forever).
async function connectNats(extra = {}) {
  return connect({
    servers: (process.env.NATS_URL || 'nats://127.0.0.1:4222').split(',').map((s) => s.trim()),
    user: process.env.NATS_USER || undefined,
    pass: process.env.NATS_PASSWORD || undefined,
    inboxPrefix: process.env.NATS_INBOX_PREFIX || '_INBOX_tb_backend',
    name: 'tb-backend-dm-bridge',
    timeout: 5000, // connect timeout (ms)
    ...extra,
  });
}

// Publishes the event with Nats-Msg-Id = messageId: a repeat within the stream's 2-hour
// duplicate window is acknowledged with duplicate=true and stored only once.
async function publishDm(js, ev, timeoutMs = 5000) {
  const subject = subjects.inbound(ev);
  const ack = await js.publish(subject, jc.encode(ev), { msgID: ev.messageId, timeout: timeoutMs });
  return { stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate, subject };
}

// Publishes a user's message to a group conversation ONCE, whatever companions are in it, with
// Nats-Msg-Id = messageId. Never publish a companion's message here: companions only answer users (and
// the companion that tags them), and auth.conf denies the workers this subject.
async function publishGroupMessage(js, ev, timeoutMs = 5000) {
  const subject = subjects.group(ev.conversationId);
  const ack = await js.publish(subject, jc.encode(ev), { msgID: ev.messageId, timeout: timeoutMs });
  return { stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate, subject };
}

// Publishes a spot draft's review, after the admin tool stored the status (and, when approved, the
// new ck_spots id as spotId) on the draft: the companion that made the draft tells the user once.
// Nats-Msg-Id = <draftId>:<status>, so publishing the same outcome again is a no-op.
async function publishSpotReview(js, review, timeoutMs = 5000) {
  const subject = subjects.spotReview(review.draftId);
  const msgID = `${review.draftId}:${review.status}`;
  const ack = await js.publish(subject, jc.encode(review), { msgID, timeout: timeoutMs });
  return { stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate, subject };
}

// A moderator pauses or resumes a conversation (the admin tool; only tb-backend may publish these).
// While paused the companions send nothing there (crisis referrals excepted) and the users' messages
// are held; the latest `at` wins, so signals arriving out of order cannot undo a later action. On resume
// the companion answers the latest held message once, unless catchUp is false.
// Nats-Msg-Id = <conversationId>:<action>:<at>, so publishing the same action again is a no-op.
async function publishTakeover(js, conversationId, { action, by, at, reason, catchUp }, timeoutMs = 5000) {
  const subject = subjects.takeover(conversationId);
  const body = { action, by, at: at || new Date().toISOString() };
  if (reason !== undefined) body.reason = reason;
  if (catchUp !== undefined) body.catchUp = catchUp;
  const msgID = `${conversationId}:${action}:${body.at}`;
  const ack = await js.publish(subject, jc.encode(body), { msgID, timeout: timeoutMs });
  return { stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate, subject, msgID };
}

// The three deletion signals (only tb-backend may publish them). Each is acted on within seconds by one
// worker and is idempotent: publishing it again finds nothing more to remove. Each leaves a tombstone
// (ids only), so a redelivered or replayed event of what was deleted is never answered again.
function requireOid(name, id) {
  if (typeof id !== 'string' || !OID.test(id)) throw new TypeError(`${name} must be a 24-hex ObjectId string`);
}

// A user deleted a message of a DM with a companion. TB-Backend still deletes the dm_messages document
// itself; the workers remove the message and the companion's reply from the companion's history, the facts
// learned only from it and the answering turn's recorded outputs, and rebuild a summary written from it.
// Empty body; Nats-Msg-Id = deleted:<messageId>.
async function publishMessageDeleted(js, messageId, timeoutMs = 5000) {
  requireOid('messageId', messageId);
  const subject = subjects.messageDeleted(messageId);
  const msgID = `deleted:${messageId}`;
  const ack = await js.publish(subject, new Uint8Array(0), { msgID, timeout: timeoutMs });
  return { stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate, subject, msgID };
}

// The user cleared what one companion (botId) or every companion (no botId) remembers about them: facts
// and summaries go; the account and the history stay (the old messages are not read again).
// Body {userId, botId?}; Nats-Msg-Id = cleared:<userId>:<botId|all>:<at> (at defaults to now: a later
// clear is a new signal; give the same at to make a retry a JetStream duplicate).
async function publishMemoryCleared(js, userId, botId, { at } = {}, timeoutMs = 5000) {
  requireOid('userId', userId);
  if (botId !== undefined && botId !== null) requireOid('botId', botId);
  const subject = subjects.memoryCleared(userId);
  const body = botId ? { userId, botId } : { userId };
  const msgID = `cleared:${userId}:${botId || 'all'}:${at || new Date().toISOString()}`;
  const ack = await js.publish(subject, jc.encode(body), { msgID, timeout: timeoutMs });
  return { stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate, subject, msgID };
}

// The user's account is deleted: the workers remove every fact, summary, history row, reminder text, flow
// state and recorded output of the user, and the user's messages in the inbound, outbound and dead-letter
// streams. TB-Backend still deletes its own MongoDB data (dm_messages included) and backups.
// Empty body; Nats-Msg-Id = erased:<userId>.
async function publishUserErased(js, userId, timeoutMs = 5000) {
  requireOid('userId', userId);
  const subject = subjects.userErased(userId);
  const msgID = `erased:${userId}`;
  const ack = await js.publish(subject, new Uint8Array(0), { msgID, timeout: timeoutMs });
  return { stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate, subject, msgID };
}

// ----------------------------------------------------------------------------------------------

// The CLI's deletion options, on the publishers above.
function publishDeletion(js, kind, d) {
  if (kind === 'message-deleted') return publishMessageDeleted(js, d.messageId);
  if (kind === 'memory-cleared') return publishMemoryCleared(js, d.userId, d.botId, { at: d.at });
  return publishUserErased(js, d.userId);
}

function deletionSubject(kind, d) {
  if (kind === 'message-deleted') return subjects.messageDeleted(d.messageId);
  return kind === 'memory-cleared' ? subjects.memoryCleared(d.userId) : subjects.userErased(d.userId);
}

// Says on stderr when a completion is private (TB-Backend emits it to those users only).
function notePrivate(c) {
  const to = audience(c);
  if (to.users) {
    process.stderr.write(`dm-bridge: completion ${c.messageId} is private: show it only to user(s) ` +
      `${to.users.join(', ')}, never to the others of conversation ${c.conversationId}\n`);
  }
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const text = opts.json !== null ? opts.json : await readStdin();
  let ev;
  try {
    ev = JSON.parse(text);
  } catch (e) {
    usage(`the event is not JSON: ${e.message}`);
  }
  const bad = opts.deletion !== null ? checkDeletion(opts.deletion, ev)
    : opts.review ? checkReview(ev) : opts.takeover ? checkTakeover(ev) : checkEvent(ev, opts.group);
  if (bad) usage(bad);
  // What the awaited completion answers: the DM, or the review (a proactive follow-up).
  const answers = opts.review
    ? (c) => c.proactive === true && c.trigger && c.trigger.kind === 'spot_review' && c.trigger.id === `${ev.draftId}:${ev.status}`
    : opts.group
      ? (c) => c.respondsTo === ev.messageId
      : (c) => c.inReplyTo === ev.messageId || (c.covers || []).includes(ev.messageId);
  const quietMs = Number(process.env.COMPANION_GROUP_QUIET_SECS || 5) * 1000;

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
  let quiet;

  try {
    // Subscribe BEFORE publishing, so a fast reply cannot be missed.
    let resolveDone;
    const done = new Promise((r) => { resolveDone = r; });
    if (opts.wait) {
      // A review's thread is the draft's: listen to every conversation's completions.
      const out = nc.subscribe(opts.review ? subjects.outbound('*') : subjects.outbound(ev.conversationId));
      const typing = nc.subscribe(opts.review ? subjects.typing('*') : subjects.typing(ev.conversationId));
      (async () => {
        for await (const m of typing) {
          process.stderr.write(`dm-bridge: typing ${JSON.stringify(jc.decode(m.data))}\n`);
        }
      })().catch(() => {});
      (async () => {
        for await (const m of out) {
          let c;
          try { c = jc.decode(m.data); } catch { continue; }
          if (c && answers(c)) {
            notePrivate(c);
            if (!opts.group) { resolveDone(c); break; }
            // A group: several companions may answer, in order; each is printed as it comes.
            process.stdout.write(`${JSON.stringify(c)}\n`);
            clearTimeout(quiet);
            quiet = setTimeout(() => resolveDone(c), quietMs);
          }
        }
      })().catch(() => {});
      await nc.flush(); // the server has the subscriptions before the event goes out
    }

    const ack = opts.deletion !== null ? await publishDeletion(js, opts.deletion, ev)
      : opts.review ? await publishSpotReview(js, ev)
        : opts.takeover ? await publishTakeover(js, ev.conversationId, ev)
          : opts.group ? await publishGroupMessage(js, ev) : await publishDm(js, ev);
    process.stderr.write(`dm-bridge: published ${ack.subject} -> stream ${ack.stream} seq ${ack.seq}` +
      `${ack.duplicate ? ' (DUPLICATE: this messageId was already accepted; not stored again)' : ''}\n`);
    if (!opts.wait) {
      process.stdout.write(`${JSON.stringify(ack)}\n`);
    } else {
      const timeout = new Promise((r) => { timer = setTimeout(() => r(null), opts.timeoutSecs * 1000); });
      const completion = await Promise.race([done, timeout]);
      if (completion) {
        if (!opts.group) process.stdout.write(`${JSON.stringify(completion)}\n`);
      } else {
        const what = opts.review
          ? `trigger ${ev.draftId}:${ev.status}`
          : opts.group ? `respondsTo=${ev.messageId}` : `inReplyTo=${ev.messageId}`;
        process.stderr.write(`dm-bridge: no completion with ${what} within ${opts.timeoutSecs}s` +
          `${ack.duplicate ? ' (the event was a duplicate: its completion, if any, went out before we subscribed; it is in dm_messages with this inReplyTo)' : ''}\n`);
        exitCode = 1;
      }
    }
  } catch (e) {
    if (e.code === ErrorCode.NoResponders) {
      const subject = opts.deletion !== null ? deletionSubject(opts.deletion, ev)
        : opts.review ? subjects.spotReview(ev.draftId)
          : opts.takeover ? subjects.takeover(ev.conversationId)
            : opts.group ? subjects.group(ev.conversationId) : subjects.inbound(ev);
      process.stderr.write(`dm-bridge: no JetStream stream stores ${subject} (is a worker or the stream set up?)\n`);
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
    clearTimeout(quiet);
    await nc.close().catch(() => {});
  }
  process.exit(exitCode);
}

module.exports = {
  subjects, connectNats, publishDm, publishGroupMessage, publishSpotReview, publishTakeover,
  publishMessageDeleted, publishMemoryCleared, publishUserErased,
};

if (require.main === module) main();
