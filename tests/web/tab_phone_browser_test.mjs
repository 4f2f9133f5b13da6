// What a person joining with a phone meets (issue 15 item 1), in headless Debian chromium
// through playwright-core, with real processes on 127.0.0.1: the test Hub serving two gated
// copies of stories260K (acme/gated, acme/gated2: 401 without the token T, 403 with another),
// `daisychain serve` and two `daisychain node` holding T (HF_TOKEN), `daisychain run --join`
// as the head (T too), and one join-page tab that has no token. One start-up, two stories:
//   (a) the Hub token, asked in the tab only after a 401: planned a slice, the tab's read gets
//       401 (serve never gave it a token) and the run fails naming it; the page shows the
//       token field; a wrong token: the next run fails with the Hub's 403 and the page says
//       the token was refused; T: the next run is VERIFIED with the tab holding layers read
//       by ranged GETs straight to the Hub with `Authorization: Bearer T`. T is then in no
//       page storage (local, session, IndexedDB, cookies), no frame of the link, no output of
//       serve, the nodes or the head, no file under the test's DAISY_HOMEs, not in serve's
//       state; after "Forget token" the tab's next read (acme/gated2) carries no token: 401.
//   (b) the screen turning off: the page hidden (document.visibilityState overridden and
//       'visibilitychange' dispatched: headless chromium has no screen to turn off, and this
//       runs the page's own handler exactly as a phone's screen-off does) leaves the room by
//       its Bye while its WebSocket stays open, and the next run is VERIFIED on the native
//       nodes alone; shown again, the tab rejoins over the same link with the same key (no
//       new approval), keeps the slice it held (no new download), and a run with it is
//       VERIFIED.
// Screenshot tab-phone-token.png goes to DAISY_ARTIFACT_DIR.
import fs from 'node:fs';
import path from 'node:path';
import {
  check, cli, collectErrors, ended, env, fail, finish, freePort, getJSON, importPackage, inRoom, lastJson,
  launchChromium, postJSON, requireChromium, requireFile, runTest, startServe, startTestHub, testhubPath, testScope,
  waitFor, waitForDevices,
} from './lib.mjs';

const E = env();
const PROMPT = 'Once upon a time';
const TOKEN = 'hf_TabGivenToken' + process.pid + 'Qx';
const WRONG = 'hf_NotTheTabToken' + process.pid + 'Wv';

// Every file under `dir` (bounded: the test's own few hundred files).
function filesUnder(dir, out = []) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) filesUnder(p, out);
    else if (e.isFile()) out.push(p);
    if (out.length > 20000) fail(`more than 20000 files under ${dir}`);
  }
  return out;
}

await runTest('tab_phone_browser_test', async () => {
  requireChromium(E.chromium);
  const { chromium } = await importPackage('playwright-core');
  requireFile(E.bin, 'the daisychain binary', 'build it first (cmake --build build), or set DAISY_BIN_DIR');
  testhubPath(E);
  fs.mkdirSync(E.artifacts, { recursive: true });

  const { tmp, procs, pageErrors } = testScope('daisy_web_tabphone_');
  let browser = null;
  let ok = false;
  try {
    const step = (s) => console.log(`-- ${s}`);
    const stories = path.join(E.models, 'stories260K');
    const truth = lastJson('\n' + cli(E, ['generate', '--model', stories, '--prompt', PROMPT, '-n', '24', '--json'],
      { DAISY_HOME: path.join(tmp, 'gen') })).ids;

    step('the test Hub (two gated repos), serve, two nodes: all but the tab hold the token');
    const repos = path.join(tmp, 'repos');
    for (const r of ['gated', 'gated2']) fs.cpSync(stories, path.join(repos, 'acme', r), { recursive: true });
    // testhub.log holds T (its command line): the one file the search below leaves out.
    const hub = await startTestHub(procs, E, repos, ['--gate', 'acme/gated', '--gate', 'acme/gated2', '--token', TOKEN],
      { probe: '/acme/gated/resolve/main/config.json', status: 401 });
    const homes = [];
    const home = (name) => {
      const d = path.join(tmp, 'home-' + name);
      fs.mkdirSync(d, { recursive: true });
      homes.push(d);
      return { DAISY_HOME: d, HF_ENDPOINT: hub, HF_TOKEN: TOKEN, HF_HOME: path.join(d, 'hf') };
    };
    const fpr = (name, role) => /([0-9a-f]{4}(-[0-9a-f]{4}){3})/.exec(cli(E, ['id', '--role', role], home(name)))[1];
    const approve = [fpr('head', 'head'), fpr('node-1', 'node'), fpr('node-2', 'node')]
      .flatMap((f) => ['--approve', f]);
    const port = await freePort();
    const room = 'phone' + port;
    const { base, secret, join } = await startServe(procs, E, tmp, { port, env: home('serve'),
      args: ['--room', room, '--name', 'host', '--no-compute', ...approve] });
    for (const n of ['node-1', 'node-2'])
      procs.start(n, E.bin, ['node', '--join', join, '--room', room, '--name', n], home(n));
    const member = async (id) => (await getJSON(`${base}/api/state`, secret)).devices.find((d) => d.id === id);
    await waitForDevices(base, secret, 'both nodes in the room',
      (ds) => ds.filter((d) => d.name.startsWith('node-') && inRoom(d)).length === 2, { procs, timeoutMs: 60000 });

    browser = await launchChromium(chromium, E);
    const ctx = await browser.newContext({ viewport: { width: 360, height: 800 }, isMobile: true, hasTouch: true });
    // The tab's reads of the Hub as the Hub answered them (its worker's XHRs), with the
    // Authorization header each carried.
    const hubReads = [];
    ctx.on('response', async (r) => {
      if (!r.url().startsWith(hub + '/')) return;
      const h = await r.request().allHeaders().catch(() => r.request().headers());
      hubReads.push({ url: r.url(), method: r.request().method(), range: h.range || '', auth: h.authorization || '',
        status: r.status() });
    });
    const page = await ctx.newPage();
    page.setDefaultTimeout(60000);
    collectErrors(page, pageErrors);
    page.on('console', (m) => { if (m.type() === 'error') console.log(`[tab] ${m.text()}`); });
    // Every frame of the link, both ways (ciphertext: this shows no plaintext channel carries T).
    const frames = [];
    page.on('websocket', (ws) => {
      ws.on('framesent', (f) => frames.push(Buffer.from(f.payload)));
      ws.on('framereceived', (f) => frames.push(Buffer.from(f.payload)));
    });
    // The page's WebSockets, so the test can see the link stay open while the page is hidden.
    await page.addInitScript(() => {
      const Native = window.WebSocket;
      window.__links = [];
      window.WebSocket = class extends Native {
        constructor(...a) {
          super(...a);
          window.__links.push(this);
        }
      };
    });
    const links = () => page.evaluate(() => window.__links.map((w) => w.readyState));

    step('the tab joins and is approved by the host');
    await page.goto(`${base}/join`);
    await page.locator('#my-fpr').filter({ hasText: /^[0-9a-f]{4}(-[0-9a-f]{4}){3}$/ }).waitFor();
    const tabId = await page.locator('#my-fpr').getAttribute('data-id');
    await page.fill('#name-input', 'tab-phone');
    await page.click('#join-btn');
    await waitFor('the tab pending on serve', async () => (await member(tabId))?.status === 'pending', { procs });
    const r = await postJSON(`${base}/api/approve`, { id: tabId }, secret);
    check(r.status === 200, `POST /api/approve: HTTP ${r.status} ${r.text}`);
    await waitFor('the tab\'s ring member in the room', async () => inRoom(await member(tabId)),
      { procs, timeoutMs: 60000 });
    check(await page.locator('#token-card').isHidden(), 'the token field shows before any refusal');

    let runs = 0;
    const runHead = (model, extra) => {
      const name = `run-${++runs}`;
      return procs.start(name, E.bin, ['run', '--join', join, '--room', room, '--json', '--name', 'head',
        '--model', model, '--prompt', PROMPT, '-n', '24', ...extra], home('head'));
    };
    // A run that must be VERIFIED with the single-device ids.
    const verified = async (model, extra) => {
      const p = runHead(model, ['--verify', ...extra]);
      const log = await ended(procs, p);
      check(p.code === 0, `${p.name} exited with ${p.code}:\n${log.slice(-4000)}`);
      const j = lastJson(log);
      console.log(`   ${p.name}: verified ${j.verified}, plan ` +
        j.plan.map((s) => `${s.device}[${s.layers[0]},${s.layers[1]})`).join(' '));
      check(j.verified === true, `${p.name} is not VERIFIED: ${JSON.stringify(j).slice(0, 2000)}`);
      check(JSON.stringify(j.ids) === JSON.stringify(truth), `${p.name}'s ids ${j.ids} are not generate's ${truth}`);
      return j;
    };
    // A run the tab's Hub refusal ends: the head names the tab's stage and the HTTP status.
    const refused = async (model, status) => {
      const p = runHead(model, ['--stages', '4']);
      const log = await ended(procs, p);
      check(p.code !== 0, `${p.name} succeeded; the tab should have refused its slice:\n${log.slice(-3000)}`);
      check(log.includes('tab-phone') && log.includes(`HTTP ${status}`),
        `${p.name} does not name the tab's HTTP ${status}:\n${log.slice(-3000)}`);
      console.log(`   ${p.name}: failed, naming the tab's HTTP ${status}`);
    };
    const tabReads = (pred) => hubReads.filter(pred);

    // ---------- (a) the Hub token, asked only after a 401 ----------
    step('(a) planned a slice of the gated repo, the tab (no token) is refused: 401');
    await refused('acme/gated', 401);
    await page.locator('#token-form').waitFor({ state: 'visible' });
    await page.locator('#work-error[data-status="401"]').waitFor();
    const err401 = await page.locator('#work-error').innerText();
    check(/refused acme\/gated without a token \(HTTP 401/.test(err401), `the page says: ${err401}`);
    check(await page.locator('#token-input').getAttribute('type') === 'password',
      'the token field is no password field');
    check(tabReads((x) => x.status === 401 && !x.auth).length > 0,
      `the Hub answered the tab no 401 without a token: ${JSON.stringify(hubReads.slice(-5))}`);
    check(tabReads((x) => x.auth).length === 0, 'the tab sent some token before one was typed: serve gave it one?');

    step('a wrong token: the next run fails with the Hub\'s 403, the page says the token was refused');
    await page.fill('#token-input', WRONG);
    await page.click('#token-btn');
    await page.locator('#token-held[data-held="true"]').waitFor();
    check(await page.locator('#token-input').inputValue() === '', 'the page kept the token in its field');
    await refused('acme/gated', 403);
    await page.locator('#work-error[data-status="403"]').waitFor();
    const err403 = await page.locator('#work-error').innerText();
    check(/refused the token given here \(HTTP 403\): it has no access to acme\/gated\./.test(err403),
      `the page says: ${err403}`);
    await page.locator('#token-form').waitFor({ state: 'visible' });
    check(tabReads((x) => x.status === 403 && x.auth === `Bearer ${WRONG}`).length > 0,
      'the Hub answered no 403 to the wrong token');

    step('the right token: a run with the tab holding layers is VERIFIED');
    const before = hubReads.length;
    await page.fill('#token-input', TOKEN);
    await page.click('#token-btn');
    await page.locator('#token-held[data-held="true"]').waitFor();
    const j3 = await verified('acme/gated', ['--stages', '4']);
    const slice3 = j3.plan.find((s) => s.device === 'tab-phone');
    check(slice3 && slice3.relayed && slice3.layers[1] > slice3.layers[0],
      `the tab holds no layers: ${JSON.stringify(j3.plan)}`);
    await page.locator('#slice').filter({ hasText: /layers\) of acme\/gated/ }).waitFor();
    const ranged = hubReads.slice(before).filter((x) => x.url.endsWith('/model.safetensors') && x.status === 206);
    check(ranged.length > 0 && ranged.every((x) => /^bytes=\d+-\d+$/.test(x.range) && x.auth === `Bearer ${TOKEN}`),
      `the tab's ranged reads do not carry the token: ${JSON.stringify(hubReads.slice(before).slice(0, 10))}`);
    check(await page.locator('#work-error').isHidden(),
      `the page shows: ${await page.locator('#work-error').innerText()}`);
    await page.screenshot({ path: path.join(E.artifacts, 'tab-phone-token.png'), fullPage: true });

    step('the token is held in memory only');
    const stored = await page.evaluate(async () => {
      const out = [JSON.stringify(Object.entries(localStorage)), JSON.stringify(Object.entries(sessionStorage)),
        document.cookie];
      for (const info of await indexedDB.databases()) {
        const db = await new Promise((res, rej) => {
          const q = indexedDB.open(info.name);
          q.onsuccess = () => res(q.result);
          q.onerror = () => rej(q.error);
        });
        for (const store of db.objectStoreNames) {
          const all = await new Promise((res) => {
            const q = db.transaction(store).objectStore(store).getAll();
            q.onsuccess = () => res(q.result);
            q.onerror = () => res([]);
          });
          out.push(info.name, JSON.stringify(all));
        }
        db.close();
      }
      return out.join('\n');
    });
    const cookies = JSON.stringify(await ctx.cookies());
    for (const [t, what] of [[TOKEN, 'the token'], [WRONG, 'the wrong token']]) {
      check(!stored.includes(t) && !cookies.includes(t), `${what} is in the page's storage or cookies`);
      check(!frames.some((f) => f.includes(t)), `${what} is in a frame of the link`);
      check(!JSON.stringify(await getJSON(`${base}/api/state`, secret)).includes(t), `${what} is in serve's state`);
      for (const f of filesUnder(tmp)) {
        if (path.basename(f) === 'testhub.log') continue;
        check(!fs.readFileSync(f).includes(t), `${what} is in ${path.relative(tmp, f)}`);
      }
    }
    check(homes.length >= 4 && frames.length > 0, 'the search saw no homes or no frames');

    // ---------- (b) the screen turns off, and on again ----------
    step('(b) the page hidden: the tab says Bye and leaves the room, its link still open');
    check(JSON.stringify(await links()) === '[1]', `the page's links before: ${JSON.stringify(await links())}`);
    await page.evaluate(() => {
      Object.defineProperty(document, 'visibilityState', { value: 'hidden', configurable: true });
      Object.defineProperty(document, 'hidden', { value: true, configurable: true });
      document.dispatchEvent(new Event('visibilitychange'));
    });
    await waitFor('the hidden tab out of the room', async () => !inRoom(await member(tabId)), { procs });
    check(JSON.stringify(await links()) === '[1]', `the link did not stay open: ${JSON.stringify(await links())}`);
    await page.locator('#link-state[data-state="away"]').waitFor();
    const j4 = await verified('acme/gated', ['--stages', '3']);
    check(j4.plan.every((s) => s.device !== 'tab-phone'), `the hidden tab is in the plan: ${JSON.stringify(j4.plan)}`);
    check(JSON.stringify(await links()) === '[1]', `the link closed while hidden: ${JSON.stringify(await links())}`);

    step('shown again: the tab rejoins over the same link, no new approval, its slice kept');
    const readsBefore = hubReads.length;
    await page.evaluate(() => {
      Object.defineProperty(document, 'visibilityState', { value: 'visible', configurable: true });
      Object.defineProperty(document, 'hidden', { value: false, configurable: true });
      document.dispatchEvent(new Event('visibilitychange'));
    });
    await waitFor('the tab back in the room', async () => inRoom(await member(tabId)), { procs, timeoutMs: 60000 });
    check(JSON.stringify(await links()) === '[1]', `the tab linked again instead: ${JSON.stringify(await links())}`);
    const j5 = await verified('acme/gated', ['--stages', '4']);
    const slice5 = j5.plan.find((s) => s.device === 'tab-phone');
    check(slice5 && slice5.layers[1] > slice5.layers[0], `the tab holds no layers: ${JSON.stringify(j5.plan)}`);
    if (JSON.stringify(slice5.layers) === JSON.stringify(slice3.layers))
      check(hubReads.length === readsBefore,
        `the tab downloaded its slice again: ${JSON.stringify(hubReads.slice(readsBefore, readsBefore + 5))}`);

    // ---------- (a, end) Forget token ----------
    step('"Forget token": the tab\'s next read carries no token, and the Hub answers 401');
    await page.click('#token-forget');
    await page.locator('#token-held[data-held="false"]').waitFor({ state: 'attached' });
    const forgotAt = hubReads.length;
    await refused('acme/gated2', 401);
    await page.locator('#token-form').waitFor({ state: 'visible' });
    await page.locator('#work-error[data-status="401"]').waitFor();
    const after = hubReads.slice(forgotAt).filter((x) => x.url.includes('/acme/gated2/'));
    check(after.length > 0 && after.every((x) => !x.auth && x.status === 401),
      `after Forget the tab's reads: ${JSON.stringify(after)}`);

    check(pageErrors.length === 0, 'the page threw:\n' + pageErrors.join('\n'));
    ok = true;
  } finally {
    await finish({ browser, procs, tmp, ok, pageErrors });
  }
}, { watchdogS: 250 });
