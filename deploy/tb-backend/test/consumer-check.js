#!/usr/bin/env node
// For deploy/nats/test-permissions.sh: the fan-out's own code (lib/fanout.js) creates or finds its durable
// consumers on <SP>_OUT and <SP>_ALERT as the NATS user it runs as, reads one message from each and acks
// it. Prints one JSON line per consumer: {"stream","consumer","subject"} or {"stream","consumer","error"}.
'use strict';

const { connectNats } = require('../dm-bridge');
const { Fanout } = require('../lib/fanout');
const config = require('../lib/config');

async function main() {
  process.env.TB_JWT_SECRET = process.env.TB_JWT_SECRET || 'x'.repeat(32);
  const cfg = config.load();
  const nc = await connectNats({ name: 'tb-backend-consumer-check' });
  const quiet = { info() {}, warn() {}, error() {} };
  const fanout = new Fanout({ nc, io: null, db: null, cfg, log: quiet });
  let failed = false;
  for (const [stream, name, filter] of [
    [cfg.streams.out, cfg.consumers.out, `${cfg.subjectPrefix}.out.>`],
    [cfg.streams.alert, cfg.consumers.alert, `${cfg.subjectPrefix}.alert.>`],
  ]) {
    try {
      // deliverAll: a first start reads what the check published before it.
      const consumer = await Promise.race([
        fanout.consumer(stream, name, filter, { deliverAll: true }),
        new Promise((_, reject) => setTimeout(() => reject(new Error('no consumer within 10 s')), 10000)),
      ]);
      const m = await consumer.next({ expires: 3000 });
      if (!m) throw new Error('no message within 3 s');
      await m.ackAck();
      process.stdout.write(`${JSON.stringify({ stream, consumer: name, subject: m.subject })}\n`);
    } catch (e) {
      failed = true;
      process.stdout.write(`${JSON.stringify({ stream, consumer: name, error: e.message })}\n`);
    }
  }
  fanout.stopped = true;
  await nc.close();
  process.exit(failed ? 1 : 0);
}

main().catch((e) => { process.stdout.write(`${JSON.stringify({ error: e.message })}\n`); process.exit(1); });
