// The workers' events, fanned out to the users they are for over Socket.IO:
// - completions (`<prefix>.out.>`, stream <SP>_OUT) through a durable pull consumer, so a restart of this
//   service misses none: what arrived while it was down is delivered when it is back;
// - crisis alerts (`<prefix>.alert.>`, stream <SP>_ALERT) through the durable consumer tb-backend-alerts,
//   to the moderators' room;
// - typing (`<prefix>.typing.>`), a core subscription: no stream keeps it, it is best-effort.
//
// A completion goes to the rooms of the conversation's participants (`user:<id>`), or, when it has
// visibleTo (a crisis referral in a group), only to those users. Each completion is emitted once per
// messageId, whatever reaches this service twice (a worker's second publish, a redelivery). Each user's
// last events are kept a while, so that a client that reconnects with the stream sequence it last saw
// (`auth.after`) catches up on what was emitted while it was away.
'use strict';

const { AckPolicy, DeliverPolicy, JSONCodec, nanos } = require('nats');
const { ObjectId } = require('mongodb');
const { OID } = require('./auth');

const jc = JSONCodec();
const userRoom = (userId) => `user:${userId}`;
const MODERATORS = 'moderators';

// The ids seen last, oldest dropped first: a bounded set.
class RecentIds {
  constructor(size) { this.size = size; this.ids = new Set(); }
  has(id) { return this.ids.has(id); }
  add(id) {
    this.ids.add(id);
    if (this.ids.size > this.size) this.ids.delete(this.ids.values().next().value);
  }
}

// Each user's last companion messages with their stream sequence, for a reconnecting client.
class CatchUp {
  constructor({ perUser, secs }, maxUsers = 50000) {
    this.perUser = perUser; this.ms = secs * 1000; this.maxUsers = maxUsers; this.byUser = new Map();
  }
  add(userId, seq, payload) {
    if (this.perUser === 0) return;
    let list = this.byUser.get(userId);
    if (!list) {
      list = [];
      this.byUser.set(userId, list);
      if (this.byUser.size > this.maxUsers) this.byUser.delete(this.byUser.keys().next().value);
    }
    list.push({ seq, at: Date.now(), payload });
    if (list.length > this.perUser) list.shift();
  }
  since(userId, after) {
    const old = Date.now() - this.ms;
    return (this.byUser.get(userId) || []).filter((e) => e.seq > after && e.at >= old);
  }
}

// The dm_messages shape the app renders, from a completion (the worker already stored the document).
function toMessage(c, seq) {
  const m = {
    _id: c.messageId,
    conversationId: c.conversationId,
    senderId: c.senderId,
    content: c.content,
    richContent: c.richContent === undefined ? null : c.richContent, // the crisis card whole
    timestamp: c.createdAt,
    read: false,
    streamSeq: seq,
  };
  for (const k of ['inReplyTo', 'respondsTo', 'covers', 'proactive', 'trigger', 'safety', 'visibleTo', 'aiDisclosure', 'breakReminder']) {
    if (c[k] !== undefined && c[k] !== null) m[k] = c[k];
  }
  return m;
}

class Fanout {
  constructor({ nc, io, db, cfg, log }) {
    this.nc = nc; this.js = nc.jetstream(); this.io = io; this.db = db; this.cfg = cfg; this.log = log;
    this.seen = new RecentIds(cfg.dedupSize);
    this.catchUp = new CatchUp(cfg.catchUp);
    this.conversations = new Map(); // id -> { participants: [hex], isGroup, until }
    this.stopped = false;
    this.running = [];
    this.counts = { emitted: 0, duplicates: 0, rejected: 0, alerts: 0, typing: 0 };
  }

  // The participants of a conversation (cached a minute): who a completion or typing event is for.
  async participants(conversationId) {
    const hit = this.conversations.get(conversationId);
    if (hit && hit.until > Date.now()) return hit;
    const doc = await this.db.collection('dm_conversations').findOne(
      { _id: new ObjectId(conversationId) }, { projection: { participants: 1, isGroup: 1 } },
    );
    const entry = {
      participants: doc ? (doc.participants || []).map((p) => String(p).toLowerCase()) : [],
      isGroup: Boolean(doc && doc.isGroup),
      found: Boolean(doc),
      until: Date.now() + 60000,
    };
    this.conversations.set(conversationId, entry);
    if (this.conversations.size > 10000) this.conversations.delete(this.conversations.keys().next().value);
    return entry;
  }

  // The users an event is for: the participants, or those of visibleTo that are participants.
  async audience(c) {
    const conv = await this.participants(c.conversationId);
    if (!conv.found) return { users: [], why: `conversation ${c.conversationId} is not in dm_conversations` };
    if (Array.isArray(c.visibleTo) && c.visibleTo.length) {
      const members = new Set(conv.participants);
      const users = c.visibleTo.map((u) => String(u).toLowerCase()).filter((u) => members.has(u));
      return { users, why: users.length ? '' : `none of visibleTo is in conversation ${c.conversationId}` };
    }
    return { users: conv.participants, why: '' };
  }

  // A durable pull consumer (created on first start: it delivers what is published from then on;
  // deliverAll: everything the stream holds), waiting for its stream while no worker has created it yet.
  async consumer(stream, name, filter, { deliverAll = false } = {}) {
    const jsm = await this.nc.jetstreamManager();
    for (let wait = 500; ; wait = Math.min(wait * 2, 10000)) {
      try {
        try {
          await jsm.consumers.info(stream, name);
        } catch (e) {
          if (!/consumer not found/i.test(e.message)) throw e;
          await jsm.consumers.add(stream, {
            durable_name: name,
            ack_policy: AckPolicy.Explicit,
            deliver_policy: deliverAll ? DeliverPolicy.All : DeliverPolicy.New,
            filter_subject: filter,
            ack_wait: nanos(30000),
            max_ack_pending: 1000,
          });
          this.log.info(`created the durable consumer ${name} on ${stream} (${filter})`);
        }
        return await this.js.consumers.get(stream, name);
      } catch (e) {
        if (this.stopped) throw e;
        this.log.warn(`consumer ${name} on ${stream} not ready (${e.message}); again in ${wait} ms`);
        await new Promise((r) => setTimeout(r, wait));
      }
    }
  }

  async onCompletion(m) {
    let c;
    try { c = jc.decode(m.data); } catch (e) { c = null; }
    if (!c || typeof c.messageId !== 'string' || !OID.test(c.messageId) || typeof c.conversationId !== 'string' || !OID.test(c.conversationId)) {
      this.counts.rejected++;
      this.log.error(`completion ${m.subject} (stream seq ${m.seq}) is not a completion (no messageId or conversationId): dropped`);
      m.term();
      return;
    }
    if (this.seen.has(c.messageId)) {
      this.counts.duplicates++;
      this.log.info(`completion ${c.messageId} reached the fan-out again (stream seq ${m.seq}): emitted once already, dropped`);
      m.ack();
      return;
    }
    let to;
    try {
      to = await this.audience(c);
    } catch (e) {
      this.log.warn(`completion ${c.messageId}: cannot read its conversation (${e.message}); redelivered in 2 s`);
      m.nak(2000);
      return;
    }
    if (to.users.length === 0) {
      this.log.warn(`completion ${c.messageId}: nobody to emit it to: ${to.why}`);
    } else {
      const payload = toMessage(c, m.seq);
      this.io.to(to.users.map(userRoom)).emit('new_message', payload);
      this.io.to(to.users.map(userRoom)).emit('typing', { conversationId: c.conversationId, userId: c.senderId, isTyping: false });
      for (const u of to.users) this.catchUp.add(u, m.seq, payload);
      this.counts.emitted++;
    }
    this.seen.add(c.messageId);
    m.ack();
  }

  async onAlert(m) {
    let a;
    try { a = jc.decode(m.data); } catch (e) { a = null; }
    if (!a || typeof a !== 'object') {
      this.log.error(`alert ${m.subject} (stream seq ${m.seq}) is not JSON: dropped`);
      m.term();
      return;
    }
    this.counts.alerts++;
    this.io.to(MODERATORS).emit('crisis_alert', { ...a, streamSeq: m.seq });
    m.ack();
  }

  async onTyping(m) {
    let t;
    try { t = jc.decode(m.data); } catch (e) { return; }
    if (!t || typeof t.conversationId !== 'string' || !OID.test(t.conversationId)) return;
    try {
      const to = await this.audience(t);
      if (!to.users.length) return;
      this.counts.typing++;
      this.io.to(to.users.map(userRoom)).emit('typing', { conversationId: t.conversationId, userId: t.senderId, isTyping: t.typing !== false });
    } catch (e) {
      this.log.warn(`typing in ${t.conversationId} not emitted: ${e.message}`);
    }
  }

  // Runs one durable consumer's messages through `handle`, one at a time in stream order.
  async pump(stream, name, filter, handle) {
    const consumer = await this.consumer(stream, name, filter);
    const messages = await consumer.consume({ max_messages: 64 });
    this.running.push(messages);
    this.log.info(`consuming ${stream} as ${name}`);
    for await (const m of messages) {
      try {
        await handle(m);
      } catch (e) {
        this.log.error(`${name}: ${m.subject} (stream seq ${m.seq}) failed: ${e.stack || e.message}; redelivered in 2 s`);
        m.nak(2000);
      }
    }
  }

  async start() {
    const p = this.cfg.subjectPrefix;
    const typing = this.nc.subscribe(`${p}.typing.>`);
    this.running.push(typing);
    (async () => { for await (const m of typing) await this.onTyping(m); })()
      .catch((e) => this.log.error(`typing subscription ended: ${e.message}`));
    const run = (stream, name, filter, handle) => this.pump(stream, name, filter, handle)
      .catch((e) => { if (!this.stopped) this.log.error(`${name} stopped: ${e.stack || e.message}`); });
    this.done = Promise.all([
      run(this.cfg.streams.out, this.cfg.consumers.out, `${p}.out.>`, (m) => this.onCompletion(m)),
      run(this.cfg.streams.alert, this.cfg.consumers.alert, `${p}.alert.>`, (m) => this.onAlert(m)),
    ]);
  }

  // A client just connected: its rooms, and what it missed since the stream sequence it last saw.
  join(socket) {
    const { userId, moderator } = socket.data.user;
    socket.join(userRoom(userId));
    if (moderator) socket.join(MODERATORS);
    const after = Number(socket.handshake.auth && socket.handshake.auth.after);
    if (Number.isInteger(after) && after >= 0) {
      for (const e of this.catchUp.since(userId, after)) socket.emit('new_message', e.payload);
    }
  }

  // Emits a user's own message (stored by the API) to the conversation's participants.
  async emitUserMessage(doc) {
    const to = await this.audience(doc);
    if (to.users.length) this.io.to(to.users.map(userRoom)).emit('new_message', doc);
  }

  async stop() {
    this.stopped = true;
    for (const r of this.running) {
      try { r.stop ? r.stop() : r.unsubscribe(); } catch (e) { /* already closed */ }
    }
  }
}

module.exports = { Fanout, toMessage, RecentIds, CatchUp };
