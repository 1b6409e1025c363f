#!/usr/bin/env node
// The chat page in a real browser: headless Chromium (Debian's package), driven by playwright-core, opens
// the page with a user's token, sends messages in a DM and in a group, and waits for what the app shows:
// the replies, a tricklist card, the reminder the companion promised arriving by itself, the group's
// companions answering. Used by `deploy/local/demo.sh --web` and tests/it/fanout.rs.
//
//   node test/web-check.js --url http://127.0.0.1:3000 --token <jwt> --dm <conversationId>
//        [--group <conversationId>] [--screenshot file.png] [--chromium /usr/bin/chromium]
//        [--crisis '<a message in crisis>']
//
// --crisis: last, sends that message in the DM and waits for the crisis card; the summary's `crisisLines`
// is what the card shows of each line ({name, kind, tags, cost, links}), in order.
//
// stdout: one line per step ("[web] …"), then the JSON summary {"ok", "steps", "typingSeen", ...}.
// exit: 0 every step seen; 1 a step failed (a screenshot of that moment goes next to --screenshot);
// 2 bad usage or no Chromium.
'use strict';

const fs = require('node:fs');
const { chromium } = require('playwright-core');

function args(argv) {
  const o = { chromium: process.env.CHROMIUM || '/usr/bin/chromium', waitMs: 60000 };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i].replace(/^--/, '');
    if (!['url', 'token', 'dm', 'group', 'screenshot', 'chromium', 'crisis'].includes(k)) {
      process.stderr.write(`web-check: unknown option ${argv[i]}\n`);
      process.exit(2);
    }
    o[k] = argv[++i];
  }
  if (!o.url || !o.token || !o.dm) {
    process.stderr.write('usage: web-check.js --url URL --token JWT --dm CONVERSATION [--group CONVERSATION] [--screenshot PNG]\n');
    process.exit(2);
  }
  if (!fs.existsSync(o.chromium)) {
    process.stderr.write(`web-check: no Chromium at ${o.chromium} (Debian: apt-get install chromium)\n`);
    process.exit(2);
  }
  return o;
}

const say = (m) => process.stdout.write(`[web] ${m}\n`);

async function main() {
  const o = args(process.argv.slice(2));
  const browser = await chromium.launch({
    executablePath: o.chromium,
    headless: true,
    // No sandbox as root; no background traffic to Google's hosts on a closed network.
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'],
  });
  const page = await browser.newPage({ viewport: { width: 1100, height: 750 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  const summary = { ok: false, steps: [], typingSeen: false, errors };
  const step = (name, detail) => { summary.steps.push(name); say(detail ? `${name}: ${detail}` : name); };
  try {
    await page.goto(`${o.url}/?token=${encodeURIComponent(o.token)}`);
    await page.waitForFunction(() => document.querySelector('#status').textContent.trim() === 'connected', null, { timeout: o.waitMs });
    step('connected', await page.locator('#me').textContent());
    // The typing indicator shows for as long as the worker takes; a watcher notes that it ever showed.
    await page.evaluate(() => {
      const t = document.querySelector('#typing');
      new MutationObserver(() => { if (!t.hidden) window.typingSeen = true; }).observe(t, { attributes: true });
    });

    // Opens a conversation and waits for its messages to be loaded.
    const open = async (id) => {
      const loaded = page.waitForResponse((r) => r.url().includes(`/api/conversations/${id}/messages`), { timeout: o.waitMs });
      await page.click(`.conversation[data-conversation-id="${id}"]`);
      await loaded;
      await page.waitForTimeout(100);
    };
    // Sends `text` and waits until `count` companion messages more than before are on the screen.
    const send = async (text, count = 1) => {
      const before = await page.locator('#messages .message.theirs').count();
      await page.fill('#message-input', text);
      await page.click('#send');
      await page.waitForFunction((t) => [...document.querySelectorAll('#messages .message.mine .text')]
        .some((n) => n.textContent.includes(t)), text, { timeout: o.waitMs });
      await page.waitForFunction((n) => document.querySelectorAll('#messages .message.theirs').length >= n,
        before + count, { timeout: o.waitMs });
      return page.locator('#messages .message.theirs').nth(before).locator('.text').textContent();
    };

    await open(o.dm);
    const list = await send('make me a park list with kickflip, 50-50 and boardslide');
    await page.waitForSelector('#messages .message.theirs .card[data-card-type="tricklist_card"]', { timeout: o.waitMs });
    step('reply with a card', `${list.trim().slice(0, 80)} [tricklist_card]`);
    const promise = await send('remind me to wax my board in a few seconds');
    step('reply', promise.trim().slice(0, 80));
    await page.waitForSelector('#messages .message.theirs.proactive', { timeout: o.waitMs });
    const due = await page.locator('#messages .message.theirs.proactive .text').last().textContent();
    step('reminder arrived', due.trim().slice(0, 80));
    summary.typingSeen = Boolean(await page.evaluate(() => window.typingSeen));
    if (o.screenshot) {
      await page.screenshot({ path: o.screenshot });
      step('screenshot', o.screenshot);
    }
    if (o.group) {
      await open(o.group);
      const first = await send('kaori and tony, any tips for my first drop in?', 2);
      step('group answered', first.trim().slice(0, 80));
    }
    if (o.crisis) {
      await open(o.dm);
      await send(o.crisis);
      const card = page.locator('#messages .message.theirs .card[data-card-type="crisis_resources"]').last();
      await card.waitFor({ timeout: o.waitMs });
      summary.crisisLines = await card.locator('.crisis-line').evaluateAll((lines) => lines.map((l) => ({
        name: l.querySelector('.line-name').textContent,
        kind: l.dataset.kind,
        tags: [...l.querySelectorAll('.line-tags .chip')].map((c) => c.textContent),
        cost: (l.querySelector('.line-cost') || { textContent: null }).textContent,
        links: [...l.querySelectorAll('a')].map((a) => a.getAttribute('href')),
      })));
      step('crisis card', `${summary.crisisLines.length} lines: ${summary.crisisLines.map((l) => l.name).join(', ')}`);
      if (o.screenshot) {
        await card.scrollIntoViewIfNeeded();
        await page.screenshot({ path: o.screenshot.replace(/(\.png)?$/, '.crisis.png') });
      }
    }
    summary.ok = true;
  } catch (e) {
    summary.error = e.message.split('\n')[0];
    say(`FAILED: ${summary.error}`);
    if (o.screenshot) {
      const failed = o.screenshot.replace(/(\.png)?$/, '.failed.png');
      await page.screenshot({ path: failed }).catch(() => {});
      say(`the page at that moment: ${failed}`);
    }
  } finally {
    await browser.close();
  }
  process.stdout.write(`${JSON.stringify(summary)}\n`);
  process.exit(summary.ok ? 0 : 1);
}

main().catch((e) => { process.stderr.write(`web-check: ${e.stack || e.message}\n`); process.exit(1); });
