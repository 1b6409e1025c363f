#!/usr/bin/env node
// Mints the JWT a client presents to the fan-out service (the app's API does this in production).
//
//   TB_JWT_SECRET=… node mint-token.js <userId> [--expires-in 12h|-60] [--role moderator]
//
// Prints the token. --expires-in takes seconds or a span ("12h", "30m"); a negative number of seconds
// mints a token that has already expired (the tests use it).
'use strict';

const { mint, OID } = require('./lib/auth');

const args = process.argv.slice(2);
let userId; let expiresIn = '12h'; let role;
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--expires-in') { const v = args[++i]; expiresIn = /^-?\d+$/.test(v) ? Number(v) : v; }
  else if (args[i] === '--role') role = args[++i];
  else if (userId === undefined) userId = args[i];
  else { process.stderr.write(`mint-token: unexpected ${args[i]}\n`); process.exit(2); }
}
if (!userId || !OID.test(userId)) {
  process.stderr.write('usage: mint-token.js <userId: 24 hex> [--expires-in 12h] [--role moderator]\n');
  process.exit(2);
}
const secret = process.env.TB_JWT_SECRET || '';
if (secret.length < 32) {
  process.stderr.write('mint-token: TB_JWT_SECRET is missing or shorter than 32 characters\n');
  process.exit(2);
}
process.stdout.write(`${mint(userId.toLowerCase(), { secret, issuer: process.env.TB_JWT_ISSUER || undefined, audience: process.env.TB_JWT_AUDIENCE || undefined }, { expiresIn, role })}\n`);
