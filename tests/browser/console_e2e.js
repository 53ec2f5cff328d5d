// Drives the dispatchd web console in headless Chromium against a running daemon and worker
// (started by console_browser_test.cc): enters the token, submits jobs with dispatchctl, sees
// them appear, run and finish on the page without a reload, cancels one from the page, opens a
// job's timeline and that of a job retried once, the workers and queues views, and keeps
// screenshots. Exits 0 when every
// check held; otherwise prints what did not and exits 1.
//
//   node console_e2e.js --url http://127.0.0.1:9464 --token-file ops.token \
//     --dispatchctl build/client/cpp/dispatchctl --server 127.0.0.1:7411 \
//     --ctl-token-file alice.token --chromium /usr/bin/chromium --out DIR
'use strict';

const { execFileSync, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const puppeteer = require('puppeteer-core');

function args() {
  const out = {};
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) out[argv[i].replace(/^--/, '')] = argv[i + 1];
  for (const k of ['url', 'token-file', 'dispatchctl', 'server', 'ctl-token-file', 'chromium', 'out']) {
    if (!out[k]) throw new Error(`--${k} is required`);
  }
  return out;
}

const opt = args();
const log = (...m) => console.log(new Date().toISOString(), ...m);

function ctl(...rest) {
  return execFileSync(opt.dispatchctl,
    ['--server', opt.server, '--token-file', opt['ctl-token-file'], ...rest],
    { encoding: 'utf8', timeout: 30000 }).trim();
}

function submit(type, payload) {
  const id = ctl('submit', '--type', type, '--payload', payload).split(/\s+/)[0];
  if (!id) throw new Error(`dispatchctl submit --type ${type} printed no id`);
  return id;
}

// The state shown in the jobs table for each id (undefined: no row).
async function statesOf(page, ids) {
  return page.evaluate((want) => {
    const out = {};
    for (const id of want) {
      const cell = document.querySelector(`tr[data-job-id="${CSS.escape(id)}"] td.state`);
      if (cell) out[id] = cell.textContent;
    }
    return out;
  }, ids);
}

async function waitUntil(what, fn, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    last = await fn();
    if (last) return last;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
}

// Clicks what `selector` names from inside the page, finding and clicking it in one task: the
// live page re-renders its tables every second, and an element found by one call and clicked by
// the next may have been replaced in between ("Node is either not clickable or not an Element").
async function clickNow(page, selector, what) {
  await waitUntil(what, () => page.evaluate((s) => {
    const e = document.querySelector(s);
    if (e === null) return false;
    e.click();
    return true;
  }, selector), 15000);
}

async function main() {
  fs.mkdirSync(opt.out, { recursive: true });
  const token = fs.readFileSync(opt['token-file'], 'utf8').trim();
  const launchArgs = ['--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'];
  // Chromium refuses to run as root with its sandbox on.
  if (process.getuid && process.getuid() === 0) launchArgs.push('--no-sandbox');
  const browser = await puppeteer.launch({
    executablePath: opt.chromium, headless: true, args: launchArgs,
    defaultViewport: { width: 1400, height: 900 }, timeout: 60000,
  });
  try {
    const page = await browser.newPage();
    page.on('dialog', (d) => d.accept());  // the confirmations of cancel and drain
    page.on('pageerror', (e) => log('page error:', e.message));
    let loads = 0;
    page.on('load', () => { loads += 1; });

    await page.goto(`${opt.url}/console/#/jobs`, { waitUntil: 'load' });
    // Without a token the API refuses, and the page says so.
    await page.waitForFunction(
      () => !document.querySelector('#error').hidden &&
            /token/.test(document.querySelector('#error').textContent), { timeout: 15000 });
    log('without a token:', await page.$eval('#error', (e) => e.textContent));
    await page.type('#token', token);
    await page.click('#token-save');
    await page.waitForFunction(() => document.querySelector('#error').hidden, { timeout: 15000 });
    if ((await page.evaluate(() => sessionStorage.getItem('dispatchd.token'))) !== token) {
      throw new Error('the token was not kept in sessionStorage');
    }

    // Jobs appear, move and finish while the page stays loaded.
    const held = submit('held', 'never runs');
    const ids = [submit('echo', 'one'), submit('echo', 'two'), submit('echo', 'three')];
    const flaky = submit('flaky', 'second try');  // its first attempt fails, retryably
    log('submitted', ids.join(' '), 'and', held, 'and', flaky);
    const seen = {};  // id -> every state the page showed for it
    await waitUntil('every echo job SUCCEEDED on the page', async () => {
      const states = await statesOf(page, [...ids, held]);
      for (const [id, s] of Object.entries(states)) {
        seen[id] = seen[id] || [];
        if (seen[id][seen[id].length - 1] !== s) seen[id].push(s);
      }
      return ids.every((id) => states[id] === 'SUCCEEDED') && states[held] === 'QUEUED';
    }, 90000);
    log('states seen:', JSON.stringify(seen));
    const moved = ids.filter((id) => seen[id].some((s) => s !== 'SUCCEEDED'));
    if (moved.length === 0) {
      throw new Error(`no job was seen before it succeeded: ${JSON.stringify(seen)}`);
    }
    await page.screenshot({ path: path.join(opt.out, 'console-jobs.png'), fullPage: true });

    // Cancel the job that waits, from the page.
    await clickNow(page, `button.cancel[data-job-id="${held}"]`, `the cancel button of ${held}`);
    await waitUntil('the held job CANCELLED on the page',
      async () => (await statesOf(page, [held]))[held] === 'CANCELLED', 15000);
    // dispatchctl status exits non-zero for a job that did not succeed: read what it printed.
    const status = spawnSync(opt.dispatchctl, ['--server', opt.server, '--token-file',
      opt['ctl-token-file'], 'status', held], { encoding: 'utf8', timeout: 30000 });
    if (!/CANCELLED/.test(status.stdout)) {
      throw new Error(`dispatchctl status ${held}: ${status.stdout}${status.stderr}`);
    }
    log('cancelled', held);

    // A job's page and its timeline.
    await clickNow(page, `tr[data-job-id="${ids[0]}"] a`, `the link to ${ids[0]}`);
    await page.waitForSelector('tr[data-event="finished"]', { timeout: 15000 });
    const events = await page.$$eval('tr[data-event]', (rows) => rows.map((r) => r.dataset.event));
    log('timeline of', ids[0], events.join(' '));
    for (const e of ['created', 'dispatched', 'started', 'finished']) {
      if (!events.includes(e)) throw new Error(`timeline of ${ids[0]} lacks ${e}: ${events}`);
    }
    const shown = await page.$eval('#job-state', (e) => e.textContent);
    if (shown !== 'SUCCEEDED') throw new Error(`job page shows ${shown}`);
    await page.screenshot({ path: path.join(opt.out, 'console-job.png'), fullPage: true });

    // A job retried once, opened by its id from the search form: each attempt in the timeline.
    await page.click('#nav-jobs');
    await page.waitForSelector('#job-search input[name="id"]', { timeout: 15000 });
    await page.type('#job-search input[name="id"]', flaky);
    await page.keyboard.press('Enter');
    await waitUntil(`the page of ${flaky}, SUCCEEDED on its second attempt`, () => page.evaluate((id) => {
      const title = document.querySelector('#view h2');
      const state = document.querySelector('#job-state');
      return title !== null && title.textContent.includes(id) && state !== null &&
        state.textContent === 'SUCCEEDED' && document.querySelector('tr[data-event="finished"]') !== null;
    }, flaky), 30000);
    const lines = await page.$$eval('tr[data-event]',
      (rows) => rows.map((r) => ({ event: r.dataset.event, detail: r.cells[2].textContent })));
    log('timeline of', flaky, JSON.stringify(lines));
    const order = lines.map((l) => l.event).filter((e) => e !== 'not_before').join(' ');
    const want = 'created dispatched started retried dispatched started finished';
    if (order !== want) throw new Error(`timeline of ${flaky}: ${order}, want ${want}`);
    const retried = lines.find((l) => l.event === 'retried').detail;
    if (!/^attempt 1 of 2 failed: .*CUDA out of memory/.test(retried)) {
      throw new Error(`timeline of ${flaky}: the retried attempt says "${retried}"`);
    }
    const second = lines.filter((l) => l.event === 'started')[1].detail;
    if (!/^attempt 2 of 2 on worker gpu\/w2$/.test(second)) {
      throw new Error(`timeline of ${flaky}: the second start says "${second}"`);
    }
    await page.screenshot({ path: path.join(opt.out, 'console-job-retried.png'), fullPage: true });

    // Workers and queues, as the admin sees them.
    await page.click('#nav-workers');
    // An authenticated worker's id is qualified by its principal.
    await page.waitForSelector('tr[data-worker-id="gpu/w1"]', { timeout: 15000 });
    await page.screenshot({ path: path.join(opt.out, 'console-workers.png'), fullPage: true });
    await page.click('#nav-queues');
    await page.waitForSelector('tr[data-type="echo"]', { timeout: 15000 });
    await waitUntil('echo with 3 succeeded in the queues view', () => page.$eval(
      'tr[data-type="echo"] td.succeeded', (e) => e.textContent === '3'), 15000);
    await page.screenshot({ path: path.join(opt.out, 'console-queues.png'), fullPage: true });

    if (loads !== 1) throw new Error(`the page loaded ${loads} times; updates must not reload it`);
    log('screenshots in', opt.out);
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error('FAILED:', e.message);
  process.exit(1);
});
