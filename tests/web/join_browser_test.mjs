// The join page (GET /join, issue 15 item 1) on a phone-sized screen against a real
// `daisychain serve` (no auto-approve) on 127.0.0.1, headless Debian chromium through
// playwright-core:
//   - serve embeds the browser node: /daisy_engine.wasm is application/wasm, the page's
//     worker runs it and shows its backend and a probe hash equal to the native binary's;
//   - the page at 360 px shows the room and serve's key fingerprint (the one serve prints);
//     it makes this tab's key pair in the wasm module and shows its fingerprint; "Join this
//     room" puts that fingerprint in serve's pending list (admin API) and the page says it
//     waits for the host to approve it; the host approves it in the UI and the page says
//     approved;
//   - a reload keeps the key (the same fingerprint) and is approved at once;
//   - the test Hub answers a browser page across origins: a ranged, authorized GET (a
//     preflight) and a redirect to its CDN server, with Content-Range and X-Repo-Commit
//     readable by the page;
//   - on plain HTTP (a LAN address; here another origin routed to serve) the page says what
//     plain HTTP leaves unprotected; on HTTPS with an http:// Hub endpoint, that the browser
//     blocks the downloads; on 127.0.0.1, nothing;
//   - without the module (a binary built without Emscripten; the test answers 404 for it)
//     the page says the browser node is not built in and offers no Join.
// Screenshots join-360-pending.png and join-360-approved.png go to DAISY_ARTIFACT_DIR.
import fs from 'node:fs';
import path from 'node:path';
import {
  check, collectErrors, env, finish, freePort, getJSON, importPackage, launchChromium, nativeProbeHash,
  requireChromium, requireFile, runTest, signIn, startServe, startTestHub, testhubPath, testScope, waitForDevices,
} from './lib.mjs';

const E = env();
const TOKEN = 'hf_PageToken' + process.pid + 'Zq';

await runTest('join_browser_test', async () => {
  requireChromium(E.chromium);
  const { chromium } = await importPackage('playwright-core');
  requireFile(E.bin, 'the daisychain binary', 'build it first (cmake --build build), or set DAISY_BIN_DIR');
  testhubPath(E);
  fs.mkdirSync(E.artifacts, { recursive: true });

  const { tmp, procs, pageErrors } = testScope('daisy_web_join_');
  let browser = null;
  let page = null;
  let ok = false;
  try {
    const port = await freePort();
    const room = 'phones' + port;
    const home = path.join(tmp, 'serve');
    fs.mkdirSync(home, { recursive: true });
    const { base, secret } = await startServe(procs, E, tmp, { port,
      args: ['--room', room, '--name', 'host', '--no-compute'],
      env: { DAISY_HOME: home, HF_ENDPOINT: 'http://127.0.0.1:9/hub-for-tabs' } });
    const step = (s) => console.log(`-- ${s}`);

    step('serve\'s key and the browser node\'s files');
    const printed = /server key fingerprint: ([0-9a-f-]{19})/.exec(procs.log('serve'));
    check(printed, 'serve did not print its key fingerprint');
    const key = await getJSON(`${base}/api/key`);
    check(key.fingerprint === printed[1], `GET /api/key says ${key.fingerprint}, serve printed ${printed[1]}`);
    check(key.room === room, `GET /api/key names room ${key.room}`);
    check(key.hub_endpoint === 'http://127.0.0.1:9/hub-for-tabs', `GET /api/key gives hub_endpoint ${key.hub_endpoint}`);
    const wasm = await fetch(`${base}/daisy_engine.wasm`);
    check(wasm.ok, `GET /daisy_engine.wasm: HTTP ${wasm.status} (was the binary built without Emscripten?)`);
    check(wasm.headers.get('content-type') === 'application/wasm', `/daisy_engine.wasm is ${wasm.headers.get('content-type')}`);
    const magic = new Uint8Array(await wasm.arrayBuffer()).slice(0, 4);
    check(magic.join(',') === '0,97,115,109', 'GET /daisy_engine.wasm is not a WebAssembly module');
    const etag = wasm.headers.get('etag');
    const again = await fetch(`${base}/daisy_engine.wasm`, { headers: { 'If-None-Match': etag } });
    check(etag && again.status === 304, `a revalidation of the module answers ${again.status}, not 304`);
    const native = nativeProbeHash(E);

    browser = await launchChromium(chromium, E);
    const phone = await browser.newContext({ viewport: { width: 360, height: 800 }, isMobile: true, hasTouch: true });
    page = await phone.newPage();
    page.setDefaultTimeout(30000);
    collectErrors(page, pageErrors);
    page.on('console', (m) => { if (m.type() === 'error') console.log('[join page] ' + m.text()); });

    step('the join page at 360 px');
    await page.goto(`${base}/join`);
    await page.locator('#server-fpr').filter({ hasText: key.fingerprint }).waitFor();
    check((await page.locator('#room').innerText()) === room, 'the page does not name the room');
    await page.locator('#my-fpr').filter({ hasText: /^[0-9a-f]{4}(-[0-9a-f]{4}){3}$/ }).waitFor();
    const mine = (await page.locator('#my-fpr').innerText()).trim();
    const myId = await page.locator('#my-fpr').getAttribute('data-id');
    check(myId === mine.replaceAll('-', ''), `the page's id ${myId} is not its fingerprint ${mine}`);
    check(mine !== key.fingerprint, 'the tab shows the server\'s fingerprint as its own');
    check((await page.locator('#backend').innerText()).includes('wasm'), `the tab computes on ${await page.locator('#backend').innerText()}`);
    check((await page.locator('#probe').innerText()).startsWith(native),
      `the tab's probe hash ${await page.locator('#probe').innerText()} is not the native ${native}`);
    const width = await page.evaluate(() => document.documentElement.scrollWidth);
    check(width <= 360, `the join page is ${width} px wide at a 360 px viewport`);
    check(await page.locator('#fatal').isHidden(), `the page shows an error: ${await page.locator('#fatal').innerText()}`);

    step('ask to join: pending on serve, "waiting" on the page');
    await page.fill('#name-input', 'test phone');
    await page.click('#join-btn');
    await page.locator('#join-status[data-state="pending"]').waitFor();
    const waiting = await page.locator('#join-status').innerText();
    check(waiting.includes('Waiting for the host to approve ' + mine), `the page says: ${waiting}`);
    const pending = await waitForDevices(base, secret, 'the tab in serve\'s pending list',
      (ds) => ds.find((d) => d.fingerprint === mine && d.status === 'pending'), { procs });
    check(pending.name === 'test phone', `serve lists the tab as ${JSON.stringify(pending.name)}`);
    await page.screenshot({ path: path.join(E.artifacts, 'join-360-pending.png'), fullPage: true });

    step('the host approves it in the UI');
    const host = await (await browser.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
    collectErrors(host, pageErrors);
    await signIn(host, base, secret);
    await host.locator(`.approve-btn[data-id="${myId}"]`).click();
    await page.locator('#join-status[data-state="approved"]').waitFor();
    check((await page.locator('#join-status').innerText()).includes('Approved'), 'the page does not say approved');
    await page.screenshot({ path: path.join(E.artifacts, 'join-360-approved.png'), fullPage: true });

    step('a reload keeps the key and is approved at once');
    await page.reload();
    await page.locator('#join-status[data-state="approved"]').waitFor();
    const after = (await page.locator('#my-fpr').innerText()).trim();
    check(after === mine, `after a reload the tab's fingerprint is ${after}, was ${mine}`);
    const stored = JSON.parse(await page.evaluate(() => localStorage.getItem('daisy_tab_key_v1')) || 'null');
    const z85 = /^[0-9A-Za-z.\-:+=^!/*?&<>()[\]{}@%$#]{40}$/;
    check(stored && z85.test(stored.public_key) && z85.test(stored.secret_key) && stored.public_key !== stored.secret_key,
      `the page's storage holds ${JSON.stringify(stored)}, not its key pair in Z85`);
    check(pending.id === myId, `serve's id for the tab ${pending.id} is not the page's ${myId}`);

    step('the test Hub answers a browser page across origins (CORS)');
    const repos = path.join(tmp, 'repos');
    fs.cpSync(path.join(E.models, 'stories260K'), path.join(repos, 'acme', 'tiny'), { recursive: true });
    const hub = await startTestHub(procs, E, repos,
      ['--gate', 'acme/tiny', '--token', TOKEN, '--redirect-above', '100000'],
      { probe: '/acme/tiny/resolve/main/config.json', status: 401 });
    const got = await page.evaluate(async ({ hub, token }) => {
      const out = {};
      const small = await fetch(`${hub}/acme/tiny/resolve/main/config.json`,
        { headers: { Range: 'bytes=0-9', Authorization: 'Bearer ' + token } });
      out.small = { status: small.status, range: small.headers.get('content-range'),
        commit: small.headers.get('x-repo-commit'), body: await small.text() };
      const big = await fetch(`${hub}/acme/tiny/resolve/main/model.safetensors`,
        { headers: { Range: 'bytes=0-7', Authorization: 'Bearer ' + token } });
      out.big = { status: big.status, range: big.headers.get('content-range'), url: big.url,
        bytes: Array.from(new Uint8Array(await big.arrayBuffer())) };
      const refused = await fetch(`${hub}/acme/tiny/resolve/main/config.json`);
      out.refused = { status: refused.status, code: refused.headers.get('x-error-code') };
      return out;
    }, { hub, token: TOKEN });
    const config = fs.readFileSync(path.join(repos, 'acme', 'tiny', 'config.json'), 'utf8');
    check(got.small.status === 206 && got.small.body === config.slice(0, 10), `a ranged GET from the page: ${JSON.stringify(got.small)}`);
    check(/^bytes 0-9\/\d+$/.test(got.small.range || ''), `Content-Range unreadable by the page: ${got.small.range}`);
    check(/^[0-9a-f]{40}$/.test(got.small.commit || ''), `X-Repo-Commit unreadable by the page: ${got.small.commit}`);
    const model = fs.readFileSync(path.join(repos, 'acme', 'tiny', 'model.safetensors'));
    check(got.big.status === 206 && !got.big.url.startsWith(hub + '/') &&
      Buffer.from(got.big.bytes).equals(model.subarray(0, 8)), `a ranged GET through the CDN redirect: ${JSON.stringify(got.big)}`);
    check(got.refused.status === 401 && got.refused.code === 'GatedRepo', `without a token: ${JSON.stringify(got.refused)}`);

    step('what the page says on plain HTTP and on HTTPS (the page under another origin, routed here)');
    for (const origin of ['http://daisy-host.test:8788', 'https://daisy-host.test']) {
      const other = await phone.newPage();
      await other.route(origin + '/**', async (r) => {
        const u = new URL(r.request().url());
        r.fulfill({ response: await r.fetch({ url: base + u.pathname + u.search }) });
      });
      await other.goto(origin + '/join');
      await other.locator('#server-fpr').filter({ hasText: key.fingerprint }).waitFor();
      const note = other.locator('#transport-note');
      await note.waitFor();
      const text = await note.innerText();
      if (origin.startsWith('http:'))
        check(text.includes('plain HTTP') && text.includes('check both fingerprints'), `on plain HTTP the page says: ${text}`);
      else  // this serve's Hub endpoint is http://: an HTTPS page may not fetch from it
        check(text.includes('HTTPS') && text.includes('http://127.0.0.1:9/hub-for-tabs') && text.includes('blocks'),
          `on HTTPS with an http:// Hub the page says: ${text}`);
      await other.close();
    }
    check(await page.locator('#transport-note').isHidden(), 'on 127.0.0.1 the page warns about plain HTTP');

    step('a binary without the browser node: the page says so');
    const bare = await phone.newPage();
    await bare.route('**/daisy_engine.*', (r) => r.fulfill({ status: 404, body: '' }));
    await bare.goto(`${base}/join`);
    await bare.locator('#fatal').waitFor();
    const said = await bare.locator('#fatal').innerText();
    check(said.includes('built without Emscripten') && said.includes('daisychain node'), `the page says: ${said}`);
    check(await bare.locator('#join-btn').isDisabled(), 'Join is offered without a browser node');
    await bare.close();

    check(pageErrors.length === 0, 'the pages threw:\n' + pageErrors.join('\n'));
    ok = true;
  } finally {
    if (!ok && page) await page.screenshot({ path: path.join(E.artifacts, 'join-failure.png'), fullPage: true }).catch(() => {});
    await finish({ browser, procs, tmp, ok, pageErrors });
  }
});
