// The HTTP side the chat page (and the app) uses, in TB-Backend's shape: who am I, my conversations,
// a conversation's messages, and "send a message". Sending stores the user's message in dm_messages
// first (its _id is the event's messageId), emits it to the conversation's participants, and publishes
// it once to the workers: a DM to its companion (`<prefix>.in.<botId>.<conversationId>`), a group message
// once (`<prefix>.group.<conversationId>`), retried with the same Nats-Msg-Id until JetStream has it.
'use strict';

const express = require('express');
const { ObjectId } = require('mongodb');
const { ErrorCode } = require('nats');
const { publishDm, publishGroupMessage } = require('../dm-bridge');
const { httpAuth, OID } = require('./auth');

// Retries a publish whose PubAck did not come (a reconnect, a stream not there yet): the same msgID
// makes a retry of what was in fact stored a duplicate, never a second event.
async function withRetry(publish, { attempts = 6, log }) {
  let delay = 500;
  for (let i = 1; ; i++) {
    try {
      return await publish();
    } catch (err) {
      const retryable = [ErrorCode.Timeout, ErrorCode.NoResponders, ErrorCode.Disconnect,
        ErrorCode.ConnectionClosed, ErrorCode.ConnectionRefused].includes(err.code);
      if (!retryable || i >= attempts) throw err;
      log.warn(`publish attempt ${i} failed (${err.message}); again in ${delay} ms`);
      await new Promise((r) => setTimeout(r, delay + Math.floor(Math.random() * 250)));
      delay = Math.min(delay * 2, 8000);
    }
  }
}

const hex = (v) => (v === undefined || v === null ? v : String(v).toLowerCase());

// A dm_messages document as JSON for the client (ids as hex strings, dates as RFC 3339).
function messageJson(d) {
  const out = { ...d, _id: hex(d._id), conversationId: hex(d.conversationId), senderId: hex(d.senderId) };
  if (d.timestamp instanceof Date) out.timestamp = d.timestamp.toISOString();
  if (out.richContent === undefined) out.richContent = null;
  return out;
}

function api({ db, nc, fanout, cfg, log }) {
  const r = express.Router();
  const js = nc.jetstream();
  r.use(express.json({ limit: '64kb' }));
  r.use(httpAuth(cfg.jwt));

  const users = db.collection('users');
  const conversations = db.collection('dm_conversations');
  const messages = db.collection('dm_messages');

  // The conversation, if the user takes part in it; else an HTTP error is sent and null returned.
  async function mine(req, res) {
    if (!OID.test(req.params.id)) { res.status(400).json({ error: 'not a conversation id' }); return null; }
    const conv = await conversations.findOne({ _id: new ObjectId(req.params.id) });
    if (!conv || !(conv.participants || []).some((p) => hex(p) === req.user.userId)) {
      res.status(404).json({ error: 'no such conversation of yours' });
      return null;
    }
    return conv;
  }

  r.get('/me', async (req, res) => {
    const u = await users.findOne({ _id: new ObjectId(req.user.userId) }, { projection: { username: 1, name: 1 } });
    res.json({ userId: req.user.userId, username: u ? u.username : null, name: u ? u.name : null, moderator: req.user.moderator });
  });

  r.get('/conversations', async (req, res) => {
    const me = new ObjectId(req.user.userId);
    const convs = await conversations.find({ participants: me }).sort({ updatedAt: -1 }).limit(100).toArray();
    const ids = [...new Set(convs.flatMap((c) => (c.participants || []).map(hex)))];
    const people = await users.find({ _id: { $in: ids.map((i) => new ObjectId(i)) } }, { projection: { username: 1, name: 1, isBot: 1 } }).toArray();
    const byId = new Map(people.map((p) => [hex(p._id), { _id: hex(p._id), username: p.username, name: p.name || p.username, isBot: Boolean(p.isBot) }]));
    res.json(convs.map((c) => {
      const participants = (c.participants || []).map((p) => byId.get(hex(p)) || { _id: hex(p), username: null, name: 'unknown', isBot: false });
      const others = participants.filter((p) => p._id !== req.user.userId);
      return { _id: hex(c._id), isGroup: Boolean(c.isGroup), title: others.map((p) => p.name).join(', ') || 'just you', participants };
    }));
  });

  r.get('/conversations/:id/messages', async (req, res) => {
    const conv = await mine(req, res);
    if (!conv) return;
    const limit = Math.min(Math.max(Number(req.query.limit) || 50, 1), 200);
    const docs = await messages.find({ conversationId: conv._id }).sort({ timestamp: -1 }).limit(limit).toArray();
    // A private message (a referral in a group) is shown only to the users it is for.
    const visible = docs.filter((d) => !Array.isArray(d.visibleTo) || d.visibleTo.length === 0
      || d.visibleTo.map(hex).includes(req.user.userId));
    res.json(visible.reverse().map(messageJson));
  });

  r.post('/conversations/:id/messages', async (req, res) => {
    const conv = await mine(req, res);
    if (!conv) return;
    const content = req.body && req.body.content;
    if (typeof content !== 'string' || content.trim() === '') return res.status(400).json({ error: 'content must be some text' });
    if ([...content].length > cfg.maxContentChars) return res.status(413).json({ error: `a message has at most ${cfg.maxContentChars} characters` });
    const participants = (conv.participants || []).map((p) => new ObjectId(hex(p)));
    const bots = await users.find({ _id: { $in: participants }, isBot: true }, { projection: { _id: 1 } }).toArray();
    const doc = {
      _id: new ObjectId(), conversationId: conv._id, senderId: req.user.userId, content, timestamp: new Date(), read: false,
    };
    await messages.insertOne(doc);
    await conversations.updateOne({ _id: conv._id }, { $set: { updatedAt: doc.timestamp } });
    const json = messageJson(doc);
    fanout.emitUserMessage(json).catch((e) => log.warn(`own message ${json._id} not emitted: ${e.message}`));
    const event = { messageId: json._id, conversationId: json.conversationId, senderId: json.senderId, content, sentAt: json.timestamp };
    let publish = null;
    if (conv.isGroup && bots.length) publish = () => publishGroupMessage(js, event);
    else if (bots.length === 1) publish = () => publishDm(js, { ...event, botId: hex(bots[0]._id) });
    if (publish) {
      // The message is stored whatever happens: answer the request now, publish in the background.
      withRetry(publish, { log })
        .then((ack) => log.info(`queued ${json._id} on ${ack.subject} (stream seq ${ack.seq}${ack.duplicate ? ', a duplicate' : ''})`))
        .catch((e) => {
          log.error(`could not queue ${json._id}: ${e.message}`);
          fanout.io.to(`user:${req.user.userId}`).emit('bot_unavailable', { conversationId: json.conversationId, messageId: json._id });
        });
    }
    res.status(201).json(json);
  });

  // An error of the routes above: logged with the request, a plain answer to the client.
  r.use((err, req, res, next) => { // eslint-disable-line no-unused-vars
    log.error(`${req.method} ${req.originalUrl}: ${err.stack || err.message}`);
    res.status(err.status && err.status < 500 ? err.status : 503).json({ error: err.status && err.status < 500 ? err.message : 'the service cannot answer now; try again' });
  });
  return r;
}

module.exports = { api, messageJson, withRetry };
