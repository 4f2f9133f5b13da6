// A browser tab holds layers in a real ring (issue 15 item 1), in headless Debian chromium
// through playwright-core, with real processes on 127.0.0.1: `daisychain serve` (no
// auto-approve: the native devices by --approve, the tab by the host's admin API), two
// `daisychain node`, the test Hub server holding stories260K as acme/stories, and
// `daisychain run --join` as the head. The tab's worker runs daisy_tab.wasm (served by serve)
// and reads its own layers from the Hub by synchronous XHR byte ranges, never through serve.
//   (a) a desktop tab: the run over head + 2 nodes + the tab is VERIFIED with the
//       single-device ids, the tab is a relayed stage holding layers, its probe hash (shown on
//       the page) is the native binary's and equal to the ring's, the page shows the turn's
//       text as the head streamed it, and the Hub saw the tab's ranged reads (its origin);
//   (b) a 360 px phone tab whose key sorts after the nodes' (the plan orders the devices after
//       the head by id), so it holds the last stage: VERIFIED, no horizontal scroll;
//   (c) that tab's browser context closed while the turn's tokens flow (the nodes,
//       daisychain_faulty, sleep 30 ms a hop): the turn is replayed without it and ends with
//       the single-device ids.
// Screenshots tab-ring-desktop.png and tab-ring-360.png go to DAISY_ARTIFACT_DIR.
import fs from 'node:fs';
import path from 'node:path';
import {
  check, cli, collectErrors, ended, env, finish, freePort, getJSON, importPackage, inRoom, lastJson, launchChromium,
  nativeProbeHash, postJSON, requireChromium, requireFile, runTest, startServe, startTestHub, testhubPath, testScope,
  waitFor, waitForDevices,
} from './lib.mjs';

const E = env();
const PROMPT = 'Once upon a time';

await runTest('tab_ring_browser_test', async () => {
  requireChromium(E.chromium);
  const { chromium } = await importPackage('playwright-core');
  requireFile(E.bin, 'the daisychain binary', 'build it first (cmake --build build), or set DAISY_BIN_DIR');
  testhubPath(E);
  // The nodes sleep 30 ms a hop (the test fault hooks' DAISY_TEST_HOP_DELAY_MS), so that (c)
  // closes the tab while the turn's tokens still flow.
  const faulty = path.join(E.binDir, 'daisychain_faulty');
  requireFile(faulty, 'daisychain with the test fault hooks',
    'build it (cmake --build build --target daisychain_faulty)');
  fs.mkdirSync(E.artifacts, { recursive: true });

  const { tmp, procs, pageErrors } = testScope('daisy_web_tabring_');
  let browser = null;
  let ok = false;
  try {
    const step = (s) => console.log(`-- ${s}`);
    const stories = path.join(E.models, 'stories260K');
    // The single-device truth, and the native probe hash.
    const truth = (n) => lastJson('\n' + cli(E, ['generate', '--model', stories, '--prompt', PROMPT, '-n', String(n),
      '--json'], { DAISY_HOME: path.join(tmp, 'gen') })).ids;
    const native = nativeProbeHash(E, { DAISY_HOME: path.join(tmp, 'gen') });

    step('the test Hub, serve, two nodes');
    const repos = path.join(tmp, 'repos');
    fs.cpSync(stories, path.join(repos, 'acme', 'stories'), { recursive: true });
    const hub = await startTestHub(procs, E, repos, [],
      { probe: '/acme/stories/resolve/main/config.json', status: 200 });

    const home = (name) => {
      const d = path.join(tmp, 'home-' + name);
      fs.mkdirSync(d, { recursive: true });
      return { DAISY_HOME: d, HF_ENDPOINT: hub };
    };
    // The native devices' keys, made first, so serve approves them by fingerprint.
    const fpr = (name, role) => /([0-9a-f]{4}(-[0-9a-f]{4}){3})/.exec(cli(E, ['id', '--role', role], home(name)))[1];
    const approve = [fpr('head', 'head'), fpr('node-1', 'node'), fpr('node-2', 'node')]
      .flatMap((f) => ['--approve', f]);
    const port = await freePort();
    const room = 'tabs' + port;
    const { base, secret, join } = await startServe(procs, E, tmp, { port, env: home('serve'),
      args: ['--room', room, '--name', 'host', '--no-compute', ...approve] });
    for (const n of ['node-1', 'node-2'])
      procs.start(n, faulty, ['node', '--join', join, '--room', room, '--name', n],
        { ...home(n), DAISY_TEST_HOP_DELAY_MS: '30' });
    const nodes = await waitForDevices(base, secret, 'both nodes in the room', (ds) => {
      const got = ds.filter((d) => d.name.startsWith('node-') && inRoom(d));
      return got.length === 2 ? got : null;
    }, { procs, timeoutMs: 60000 });
    const key = await getJSON(`${base}/api/key`);
    check(key.hub_endpoint === hub, `serve tells tabs the Hub ${key.hub_endpoint}, not ${hub}`);

    browser = await launchChromium(chromium, E);

    // A page of the join page in `ctx`, joined (approved by the host's admin API) and linked,
    // its ring member in the room; `secretKey` (optional) is the key pair it starts with.
    async function tabPage(ctx, name, keyPair) {
      const page = await ctx.newPage();
      page.setDefaultTimeout(60000);
      collectErrors(page, pageErrors);
      page.on('console', (m) => { if (m.type() === 'error') console.log(`[${name}] ${m.text()}`); });
      if (keyPair)
        await page.addInitScript((k) => localStorage.setItem('daisy_tab_key_v1', k), JSON.stringify(keyPair));
      await page.goto(`${base}/join`);
      await page.locator('#my-fpr').filter({ hasText: /^[0-9a-f]{4}(-[0-9a-f]{4}){3}$/ }).waitFor();
      const id = await page.locator('#my-fpr').getAttribute('data-id');
      await page.fill('#name-input', name);
      await page.click('#join-btn');
      await waitForDevices(base, secret, `${name} pending on serve`,
        (ds) => ds.find((d) => d.id === id && d.status === 'pending'), { procs });
      const r = await postJSON(`${base}/api/approve`, { id }, secret);
      check(r.status === 200, `POST /api/approve: HTTP ${r.status} ${r.text}`);
      await page.locator('#join-status[data-state="approved"]').waitFor();
      await waitForDevices(base, secret, `${name}'s ring member in the room`,
        (ds) => ds.find((d) => d.id === id && inRoom(d)), { procs, timeoutMs: 60000 });
      return { page, id };
    }

    function runHead(name, n, extra = []) {
      return procs.start(name, E.bin, ['run', '--join', join, '--room', room, '--json', '--name', 'head',
        '--model', 'acme/stories', '--prompt', PROMPT, '-n', String(n), ...extra], home('head'));
    }
    async function headResult(p, timeoutMs = 120000) {
      const log = await ended(procs, p, timeoutMs);
      check(p.code === 0, `${p.name} exited with ${p.code}:\n${log.slice(-4000)}`);
      const j = lastJson(log);
      console.log(`   ${p.name}: ${j.ids.length} tokens, verified ${j.verified}, replays ${j.replays}, plan ` +
        j.plan.map((s) => `${s.device}[${s.layers[0]},${s.layers[1]})`).join(' '));
      return j;
    }

    // ---------- (a) a desktop tab in the ring ----------
    step('(a) a desktop tab joins, is approved and holds layers; run --verify over 4 stages');
    const desk = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const hubReads = [];
    desk.on('request', (r) => {
      if (r.url().startsWith(hub + '/')) hubReads.push({ url: r.url(), range: r.headers().range });
    });
    const a = await tabPage(desk, 'tab-desk');
    const want40 = truth(40);
    const runA = runHead('run-a', 40, ['--verify', '--stages', '4']);
    const ja = await headResult(runA);
    check(ja.verified === true, `the run is not VERIFIED: ${JSON.stringify(ja).slice(0, 2000)}`);
    check(JSON.stringify(ja.ids) === JSON.stringify(want40), `the ring's ids ${ja.ids} are not generate's ${want40}`);
    check(ja.plan.length === 4, `the plan has ${ja.plan.length} stages: ${JSON.stringify(ja.plan)}`);
    const stageA = ja.plan.find((s) => s.device === 'tab-desk');
    check(stageA && stageA.relayed && stageA.layers[1] > stageA.layers[0],
      `the tab holds no layers in the plan: ${JSON.stringify(ja.plan)}`);
    await a.page.locator('#slice').filter({ hasText: /layers\) of acme\/stories/ }).waitFor();
    await a.page.locator('#probe[data-state="ok"]').waitFor();
    const probeA = await a.page.locator('#probe').innerText();
    check(probeA.startsWith(native + ' = the ring'), `the tab's probe: ${probeA} (native ${native})`);
    const turnA = a.page.locator('[data-testid="room-turn"][data-state="done"] pre').first();
    await turnA.waitFor();
    const shownA = await turnA.innerText();
    check(shownA.trim().length > 0 && shownA.trim() === String(ja.text).trim(),
      `the tab shows the turn as ${JSON.stringify(shownA)}, the head made ${JSON.stringify(ja.text)}`);
    const budget = Number(await a.page.locator('#budget').getAttribute('data-bytes'));
    check(budget > 0 && budget < 4 * 1024 ** 3, `the tab offers ${budget} bytes (wasm32 holds at most 4 GiB)`);
    // The tab read its layers from the Hub itself, by byte ranges (its worker's requests).
    check(hubReads.some((r) => r.url.endsWith('/model.safetensors') && /^bytes=\d+-\d+$/.test(r.range || '')),
      `the tab made no ranged read of the Hub: ${JSON.stringify(hubReads.slice(0, 20))}`);
    check(await a.page.locator('#fatal').isHidden(), `the page shows: ${await a.page.locator('#fatal').innerText()}`);
    await a.page.screenshot({ path: path.join(E.artifacts, 'tab-ring-desktop.png'), fullPage: true });
    step('the desktop tab leaves');
    await desk.close();
    await waitForDevices(base, secret, 'the desktop tab gone from the room',
      (ds) => !inRoom(ds.find((x) => x.id === a.id)), { procs });

    // ---------- (b) a phone tab holding the last stage ----------
    step('(b) a 360 px tab whose id sorts after the nodes\': the plan puts it last');
    const phone = await browser.newContext({ viewport: { width: 360, height: 800 }, isMobile: true, hasTouch: true });
    const keyPage = await phone.newPage();
    await keyPage.goto(`${base}/join`);
    const maxNode = nodes.map((d) => d.id).sort().pop();
    // Key pairs from the page's own worker (its module's keys) until one's id sorts last.
    const pair = await keyPage.evaluate(async (above) => {
      const w = new Worker('/tab_worker.js');
      const next = (type) => new Promise((resolve) => {
        w.onmessage = (ev) => { if (ev.data.type === type || ev.data.type === 'fatal') resolve(ev.data); };
      });
      const ready = next('engine');
      w.postMessage({ type: 'init' });
      await ready;
      for (let i = 0; i < 500; i++) {
        const k = next('keys');
        w.postMessage({ type: 'keys', saved: null });
        const got = await k;
        if (got.id > above) {
          w.terminate();
          return { public_key: got.public_key, secret_key: got.secret_key };
        }
      }
      w.terminate();
      return null;
    }, maxNode);
    check(pair, `no key of 500 sorted after ${maxNode}`);
    await keyPage.close();
    const b = await tabPage(phone, 'tab-phone', pair);
    const runB = runHead('run-b', 40, ['--verify', '--stages', '4']);
    const jb = await headResult(runB);
    check(jb.verified === true, `the run is not VERIFIED: ${JSON.stringify(jb).slice(0, 2000)}`);
    check(JSON.stringify(jb.ids) === JSON.stringify(want40), `the ring's ids ${jb.ids} are not generate's ${want40}`);
    const lastB = jb.plan[jb.plan.length - 1];
    check(jb.plan.length === 4 && lastB.device === 'tab-phone' && lastB.relayed && lastB.layers[1] > lastB.layers[0],
      `the phone tab does not hold the last stage: ${JSON.stringify(jb.plan)}`);
    await b.page.locator('#probe[data-state="ok"]').waitFor();
    const turnB = b.page.locator('[data-testid="room-turn"][data-state="done"] pre').first();
    await turnB.waitFor();
    check((await turnB.innerText()).trim() === String(jb.text).trim(),
      'the phone tab shows another text than the head');
    const width = await b.page.evaluate(() => document.documentElement.scrollWidth);
    check(width <= 360, `the join page is ${width} px wide at a 360 px viewport`);
    await b.page.screenshot({ path: path.join(E.artifacts, 'tab-ring-360.png'), fullPage: true });

    // ---------- (c) the tab closed mid-turn ----------
    step('(c) the phone tab\'s browser context closes while the tokens flow');
    const want = truth(120);
    const runC = runHead('run-c', 120, ['--stages', '4']);
    // Some of the turn's pieces on the page: the tab is in the turn's plan and the hops flow.
    await b.page.locator('[data-testid="room-turn"][data-state="streaming"]').first().waitFor({ timeout: 60000 });
    await waitFor('a few tokens on the page', async () => {
      const t = await b.page.locator('[data-testid="room-turn"][data-state="streaming"] pre').first().innerText();
      return t.length >= 8;
    }, { procs, timeoutMs: 60000 });
    await phone.close();
    const jc = await headResult(runC);
    check(jc.replays === 1, `the head reports ${jc.replays} replays, not 1: ${JSON.stringify(jc).slice(0, 2000)}`);
    check(JSON.stringify(jc.ids) === JSON.stringify(want), `after the replay the ids ${jc.ids} are not generate's`);
    check(jc.plan.every((s) => s.device !== 'tab-phone'),
      `the closed tab is still in the plan: ${JSON.stringify(jc.plan)}`);

    check(pageErrors.length === 0, 'the pages threw:\n' + pageErrors.join('\n'));
    ok = true;
  } finally {
    await finish({ browser, procs, tmp, ok, pageErrors });
  }
}, { watchdogS: 400 });
