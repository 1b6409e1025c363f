#!/usr/bin/env node
// A Socket.IO client for the tests (tests/it/fanout.rs): connects to the fan-out service as the app does
// and prints each thing that happens as one JSON line on stdout, until stdin closes.
//
//   node test/socket-probe.js <url> <token> [--user <id>]
//
// Lines: {"event":"connect"} · {"event":"connect_error","message","code"} · {"event":"disconnect","reason"}
// · {"event":"new_message"|"typing"|"crisis_alert"|"bot_unavailable","data":{…}}.
// On a reconnect it presents the last stream sequence it saw (auth.after), as the chat page does.
'use strict';

const { io } = require('socket.io-client');

const [url, token, ...rest] = process.argv.slice(2);
const userAt = rest.indexOf('--user');
const userId = userAt >= 0 ? rest[userAt + 1] : undefined;
let after = null;
const print = (o) => process.stdout.write(`${JSON.stringify(o)}\n`);

const socket = io(url, {
  transports: ['websocket'],
  reconnectionDelay: 200,
  reconnectionDelayMax: 1000,
  auth: (cb) => cb({ token, ...(userId ? { userId } : {}), ...(after !== null ? { after } : {}) }),
});
socket.on('connect', () => print({ event: 'connect' }));
socket.on('connect_error', (e) => print({ event: 'connect_error', message: e.message, code: e.data && e.data.code }));
socket.on('disconnect', (reason) => print({ event: 'disconnect', reason }));
for (const name of ['new_message', 'typing', 'crisis_alert', 'bot_unavailable']) {
  socket.on(name, (data) => {
    if (name === 'new_message' && Number.isInteger(data.streamSeq)) after = Math.max(after || 0, data.streamSeq);
    print({ event: name, data });
  });
}
process.stdin.on('end', () => { socket.close(); process.exit(0); });
process.stdin.resume();
