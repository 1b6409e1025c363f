// The service's settings, from the environment, checked once at start-up: a wrong value stops the
// service with a line that names it instead of failing on the first request.
'use strict';

function int(name, dflt, min, max) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return dflt;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new Error(`${name}=${raw}: expected a whole number from ${min} to ${max}`);
  }
  return n;
}

function load() {
  const secret = process.env.TB_JWT_SECRET || '';
  if (secret.length < 32) {
    throw new Error('TB_JWT_SECRET is missing or shorter than 32 characters: the key that signs and checks the app\'s tokens (HS256)');
  }
  const addr = process.env.TB_HTTP_ADDR || '127.0.0.1:3000';
  const at = addr.lastIndexOf(':');
  const host = at > 0 ? addr.slice(0, at).replace(/^\[|\]$/g, '') : '127.0.0.1';
  const port = Number(at >= 0 ? addr.slice(at + 1) : addr);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`TB_HTTP_ADDR=${addr}: expected host:port`);
  const subjectPrefix = process.env.COMPANION_SUBJECT_PREFIX || 'dm.bot';
  const streamPrefix = process.env.COMPANION_STREAM_PREFIX || 'DM_BOT';
  return {
    host,
    port,
    jwt: {
      secret,
      // Optional: a token must name this issuer / audience when set.
      issuer: process.env.TB_JWT_ISSUER || undefined,
      audience: process.env.TB_JWT_AUDIENCE || undefined,
    },
    mongoUri: process.env.ATLAS_URI || 'mongodb://127.0.0.1:27017/TrickList2?directConnection=true',
    subjectPrefix,
    streams: { out: `${streamPrefix}_OUT`, alert: `${streamPrefix}_ALERT` },
    consumers: {
      // Durable names: one per fan-out deployment (see docs/tb-backend.md, "Several instances").
      out: process.env.TB_OUT_CONSUMER || 'tb-backend-out',
      alert: process.env.TB_ALERT_CONSUMER || 'tb-backend-alerts',
    },
    // How many completion ids are remembered to drop a repeat (a worker's second publish, a redelivery).
    dedupSize: int('TB_DEDUP_SIZE', 20000, 100, 10000000),
    // What a reconnecting client can catch up on: the last N events per user, for so many seconds.
    catchUp: { perUser: int('TB_CATCHUP_PER_USER', 100, 0, 10000), secs: int('TB_CATCHUP_SECS', 3600, 0, 86400) },
    // The largest message a user may send (the worker's COMPANION_MAX_CONTENT_CHARS).
    maxContentChars: int('COMPANION_MAX_CONTENT_CHARS', 4000, 1, 100000),
    staticDir: process.env.TB_STATIC_DIR || require('node:path').join(__dirname, '..', 'public'),
  };
}

module.exports = { load };
