// PM2 recipe for the companion worker, for the single-box setup TrickBook runs today
// (PM2 on one EC2 instance next to TB-Backend).
//
//   cargo build --release --locked          # or copy a release binary to ./target/release/companion
//   cp deploy/systemd/companion.env.example .env && $EDITOR .env
//   set -a && . ./.env && set +a && target/release/companion migrate && target/release/companion provision
//   pm2 start deploy/pm2/ecosystem.config.js
//   pm2 logs companion-worker   |   pm2 reload companion-worker   |   pm2 stop companion-worker
//
// Settings (environment of the `pm2 start` shell):
//   COMPANION_HOME       project folder: binary, characters/, .env        (default: two levels up from here)
//   COMPANION_BIN        the worker binary                                (default: $COMPANION_HOME/target/release/companion)
//   COMPANION_ENV_FILE   env file to load                                 (default: $COMPANION_HOME/.env)
//   COMPANION_INSTANCES  worker processes                                 (default: 2)
//
// Workers are independent processes sharing one durable JetStream consumer, so they run in
// fork mode (cluster mode is for Node.js HTTP servers, and needs a Node.js script).
//
// Stopping: PM2 sends SIGINT (PM2_KILL_SIGNAL of the PM2 daemon; the worker treats SIGINT and
// SIGTERM alike), then SIGKILL after kill_timeout. The worker gives in-flight turns
// COMPANION_SHUTDOWN_GRACE_SECS (20 s) and then NAKs what is left, so kill_timeout must be longer
// than that grace plus the NAKs and the disconnect: 30 s. If you raise the grace, raise kill_timeout.
'use strict';

const fs = require('fs');
const path = require('path');

const home = path.resolve(process.env.COMPANION_HOME || path.join(__dirname, '..', '..'));
const bin = process.env.COMPANION_BIN || path.join(home, 'target', 'release', 'companion');
const envFile = process.env.COMPANION_ENV_FILE || path.join(home, '.env');
const instances = Number.parseInt(process.env.COMPANION_INSTANCES || '2', 10);

// Minimal .env reader (KEY=VALUE, `export KEY=VALUE`, # comments, optional single/double
// quotes). The worker reads `.env` in its working directory itself too (without overriding
// variables already set), but putting the values in PM2's env makes `pm2 show` / `pm2 env`
// truthful and works whatever COMPANION_ENV_FILE is.
function readEnvFile(file) {
  const env = {};
  let text;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    if (e.code === 'ENOENT') return env; // no file: defaults and the shell's environment apply
    throw e;
  }
  for (const raw of text.split(/\r?\n/)) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const m = /^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$/.exec(line);
    if (!m) continue;
    let value = m[2];
    if (/^"(.*)"$/.test(value) || /^'(.*)'$/.test(value)) {
      value = value.slice(1, -1);
    } else {
      value = value.replace(/\s+#.*$/, ''); // trailing comment on an unquoted value
    }
    env[m[1]] = value;
  }
  return env;
}

const fileEnv = readEnvFile(envFile);
const grace = Number.parseInt(fileEnv.COMPANION_SHUTDOWN_GRACE_SECS || process.env.COMPANION_SHUTDOWN_GRACE_SECS || '20', 10);
const killTimeoutMs = Math.max(30000, (grace + 10) * 1000);

module.exports = {
  apps: [
    {
      name: 'companion-worker',
      script: bin,
      args: ['worker'],
      interpreter: 'none', // a native binary, not a Node.js script
      exec_mode: 'fork',
      instances: Number.isFinite(instances) && instances > 0 ? instances : 2,
      cwd: home, // characters/ and migrations/ are found relative to it
      env: {
        LOG_FORMAT: 'json', // PM2 stores the logs; JSON lines are easy to ship
        ...fileEnv,
      },
      // Stop: SIGINT, then SIGKILL after this long. Must exceed the turn grace (20 s).
      kill_timeout: killTimeoutMs,
      // A worker that cannot reach NATS/MongoDB/PostgreSQL exits non-zero: restart it with
      // exponential backoff (100 ms doubling up to 15 s) instead of a tight loop.
      autorestart: true,
      exp_backoff_restart_delay: 100,
      min_uptime: '10s',
      max_restarts: 50,
      // The worker's resident size is small (~30-60 MB); this only catches a leak.
      max_memory_restart: '400M',
      // Logs: one file per app (all instances), ISO timestamps added by PM2.
      merge_logs: true,
      time: true,
      // Each instance gets COMPANION_INSTANCE=0..N-1 (handy in logs).
      instance_var: 'COMPANION_INSTANCE',
      watch: false,
    },
  ],
};
