#!/usr/bin/env node
// TB-Backend's side of the companion system as a small service: Express for the app's API (send a
// message, read conversations), Socket.IO for the events the workers publish (completions, typing,
// crisis alerts for moderators) and a chat page in the browser (public/). docs/tb-backend.md says how
// TB-Backend merges it.
//
//   TB_JWT_SECRET=… node server.js          (settings: lib/config.js; docs/tb-backend.md lists them)
//
// stdout gets one line once it listens: `tb-backend listening on http://HOST:PORT`; the log goes to stderr.
'use strict';

const http = require('node:http');
const express = require('express');
const { Server } = require('socket.io');
const { MongoClient } = require('mongodb');
const { connectNats } = require('./dm-bridge');
const config = require('./lib/config');
const { socketAuth } = require('./lib/auth');
const { Fanout } = require('./lib/fanout');
const { api } = require('./lib/api');

const stamp = () => new Date().toISOString();
const log = {
  info: (m) => process.stderr.write(`${stamp()} INFO tb-backend: ${m}\n`),
  warn: (m) => process.stderr.write(`${stamp()} WARN tb-backend: ${m}\n`),
  error: (m) => process.stderr.write(`${stamp()} ERROR tb-backend: ${m}\n`),
};

async function main() {
  let cfg;
  try {
    cfg = config.load();
  } catch (e) {
    log.error(e.message);
    process.exit(2);
  }
  const mongo = new MongoClient(cfg.mongoUri, { serverSelectionTimeoutMS: 10000 });
  await mongo.connect();
  const db = mongo.db();
  // NATS down at start-up: keep trying (the app's API can wait; its messages are stored first).
  const nc = await connectNats({ name: `tb-backend-${process.pid}`, waitOnFirstConnect: true, maxReconnectAttempts: -1 });
  (async () => {
    for await (const s of nc.status()) {
      if (s.type !== 'pingTimer') log.info(`nats ${s.type} ${typeof s.data === 'string' ? s.data : JSON.stringify(s.data)}`);
    }
  })().catch(() => {});

  const app = express();
  app.disable('x-powered-by');
  // The page loads nothing but its own files; no one else may frame it or guess a file's type.
  app.use((req, res, next) => {
    res.set({
      'Content-Security-Policy': "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
      'X-Content-Type-Options': 'nosniff',
      'Referrer-Policy': 'no-referrer',
    });
    next();
  });
  const server = http.createServer(app);
  const io = new Server(server, { serveClient: true, maxHttpBufferSize: 64 * 1024 });
  const fanout = new Fanout({ nc, io, db, cfg, log });
  io.use(socketAuth(cfg.jwt, log));
  io.on('connection', (socket) => fanout.join(socket));

  app.get('/healthz', (req, res) => {
    const ok = !nc.isClosed();
    res.status(ok ? 200 : 503).json({ nats: ok ? 'connected' : 'closed', ...fanout.counts });
  });
  app.use('/api', api({ db, nc, fanout, cfg, log }));
  app.use(express.static(cfg.staticDir, { index: 'index.html' }));

  await fanout.start();
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(cfg.port, cfg.host, resolve);
  });
  const { address, port } = server.address();
  const shown = address.includes(':') ? `[${address}]` : address;
  process.stdout.write(`tb-backend listening on http://${shown}:${port}\n`);
  log.info(`listening on http://${shown}:${port}; completions from ${cfg.streams.out} as ${cfg.consumers.out}, alerts from ${cfg.streams.alert} as ${cfg.consumers.alert}, typing on ${cfg.subjectPrefix}.typing.>`);

  let stopping = false;
  const stop = async (sig) => {
    if (stopping) return;
    stopping = true;
    log.info(`${sig}: stopping`);
    await fanout.stop();
    io.close();
    await nc.drain().catch(() => {});
    await mongo.close().catch(() => {});
    process.exit(0);
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
}

main().catch((e) => {
  log.error(`cannot start: ${e.stack || e.message}`);
  process.exit(1);
});
