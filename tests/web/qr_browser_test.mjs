// "Use this device" and the QR code of the join page's address on the host's UI (issue 15,
// item 1), and the page's own QR encoder (web/qr.js) read back by a real decoder: a real
// `daisychain serve` on 127.0.0.1, headless Debian chromium through playwright-core, and
// zbarimg (Debian's zbar-tools) on screenshots of the rendered codes.
//   - the UI's "Use this device" link and the URL beside the code are the join URL (this
//     serve listens on loopback: the page's own origin + /join), and the code on the page
//     decodes to it; GET /join answers the join page;
//   - URLs of 5 to 213 bytes (one per version 1..10, each length at a version's limit) and
//     one URL under each of the 8 masks decode to exactly the URL;
//   - the format bits (every mask) and version bits (7..10) equal the standard's tables,
//     which a tolerant decoder alone would not prove;
//   - a text longer than version 10 holds is refused with a message;
//   - the decoder is no rubber stamp: the same encoder with its format bits left unmasked,
//     or with mask 0's formula inverted, gives codes that do not decode to the URL.
// Screenshots of the codes go to DAISY_ARTIFACT_DIR (qr-*.png); the UI at 360 px to
// use-device-360.png.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import {
  SOURCE_DIR, check, collectErrors, env, fail, finish, freePort, getJSON, importPackage, launchChromium,
  requireChromium, requireFile, runTest, signIn, startServe, testScope,
} from './lib.mjs';

const E = env();
const ZBARIMG = process.env.DAISY_ZBARIMG || '/usr/bin/zbarimg';

// The text zbarimg finds in `png` ('' when none).
function decode(png) {
  const r = spawnSync(ZBARIMG, ['--raw', '-q', '-Sdisable', '-Sqrcode.enable', png], { encoding: 'utf8', timeout: 30000 });
  if (r.error) fail(`cannot run ${ZBARIMG}: ${r.error.message}`);
  // Exit status 4: no code found. Anything else but 0 is zbarimg failing.
  if (r.status !== 0 && r.status !== 4) fail(`zbarimg failed (status ${r.status}) on ${png}: ${r.stderr}`);
  return r.status === 0 ? r.stdout.replace(/\n$/, '') : '';
}

// A URL of exactly n bytes.
function urlOfLength(n) {
  const head = 'http://192.168.1.10:8788/join?r=';
  let s = head;
  for (let i = 0; s.length < n; i++) s += 'abcdefghijklmnopqrstuvwxyz0123456789'[i % 36];
  return s.slice(0, n);
}

await runTest('qr_browser_test', async () => {
  requireChromium(E.chromium);
  requireFile(ZBARIMG, 'zbarimg', 'run scripts/install-deps.sh (it installs Debian\'s zbar-tools)');
  const { chromium } = await importPackage('playwright-core');
  requireFile(E.bin, 'the daisychain binary', 'build it first (cmake --build build), or set DAISY_BIN_DIR');
  fs.mkdirSync(E.artifacts, { recursive: true });

  const { tmp, procs, pageErrors } = testScope('daisy_web_qr_');
  let browser = null;
  let ok = false;
  try {
    const home = path.join(tmp, 'serve');
    fs.mkdirSync(home, { recursive: true });
    const { base, secret } = await startServe(procs, E, tmp, { port: await freePort(),
      args: ['--name', 'serve', '--no-compute'], env: { DAISY_HOME: home } });
    const state = await getJSON(`${base}/api/state`, secret);
    check(state.join_url === '', `serve on 127.0.0.1 advertises a join URL: ${JSON.stringify(state.join_url)}`);

    browser = await launchChromium(chromium, E);
    const context = await browser.newContext({ viewport: { width: 360, height: 800 }, deviceScaleFactor: 1 });
    const page = await context.newPage();
    page.setDefaultTimeout(30000);
    collectErrors(page, pageErrors);
    const step = (s) => console.log(`-- ${s}`);
    await signIn(page, base, secret);

    step('"Use this device" and the code on the page');
    const joinUrl = base + '/join';
    const link = page.locator('#use-device');
    await link.waitFor();
    check(await link.getAttribute('href') === joinUrl, `"Use this device" links to ${await link.getAttribute('href')}, not ${joinUrl}`);
    check((await link.innerText()).trim() === 'Use this device', `the button says ${JSON.stringify(await link.innerText())}`);
    check((await page.locator('#join-url').innerText()).trim() === joinUrl, 'the address beside the code is not the join URL');
    check(await page.locator('#join-url-note').isVisible(), 'no note that phones cannot reach a loopback serve');
    await page.locator('#join-qr svg').waitFor();
    const shown = path.join(E.artifacts, 'qr-use-device.png');
    await page.locator('#join-qr svg').screenshot({ path: shown });
    const fromPage = decode(shown);
    check(fromPage === joinUrl, `the code on the UI decodes to ${JSON.stringify(fromPage)}, not ${joinUrl}`);
    await page.screenshot({ path: path.join(E.artifacts, 'use-device-360.png'), fullPage: false });
    const joinPage = await fetch(joinUrl);
    check(joinPage.ok && (await joinPage.text()).includes('Join a DaisyChain room'), `GET /join answers ${joinPage.status}, not the join page`);
    const [popup] = await Promise.all([page.waitForEvent('popup'), link.click()]);
    await popup.waitForLoadState();
    check(popup.url() === joinUrl, `"Use this device" opened ${popup.url()}`);
    await popup.close();

    // Renders `text` (optionally with a forced mask, or with the encoder `impl`) into a white
    // box and returns what zbarimg reads from its screenshot.
    let shot = 0;
    async function roundTrip(text, { mask, impl = 'DaisyQR', scale = 4 } = {}) {
      const info = await page.evaluate(({ text, mask, impl, scale }) => {
        let box = document.getElementById('qr-test');
        if (!box) {
          box = document.createElement('div');
          box.id = 'qr-test';
          box.style.cssText = 'position:fixed;left:0;top:0;z-index:99;background:#fff;padding:0;line-height:0';
          document.body.append(box);
        }
        const svg = window[impl].svg(text, scale, mask === undefined ? {} : { mask });
        box.replaceChildren(svg);
        return { version: Number(svg.dataset.version), mask: Number(svg.dataset.mask) };
      }, { text, mask, impl, scale });
      const png = path.join(E.artifacts, `qr-${impl === 'DaisyQR' ? '' : impl + '-'}${++shot}.png`);
      await page.locator('#qr-test svg').screenshot({ path: png });
      return { ...info, decoded: decode(png) };
    }

    step('one URL per version 1..10, each at the longest that version holds at level M');
    const limits = [14, 26, 42, 62, 84, 106, 122, 152, 180, 213];
    const cases = [5, ...limits, 15, 27, 100];
    const versions = new Set();
    for (const n of cases) {
      const url = urlOfLength(n);
      const r = await roundTrip(url);
      check(r.decoded === url, `a ${n}-byte URL (version ${r.version}, mask ${r.mask}) decodes to ${JSON.stringify(r.decoded)}`);
      const expected = limits.findIndex((l) => n <= l) + 1;
      check(r.version === expected, `a ${n}-byte URL took version ${r.version}, not ${expected}`);
      versions.add(r.version);
    }
    check(versions.size === 10, `versions covered: ${[...versions].sort((a, b) => a - b).join(', ')}`);

    step('every mask');
    const url = urlOfLength(62);
    for (let mask = 0; mask < 8; mask++) {
      const r = await roundTrip(url, { mask });
      check(r.mask === mask, `mask ${mask} was asked, ${r.mask} used`);
      check(r.decoded === url, `with mask ${mask} the code decodes to ${JSON.stringify(r.decoded)}`);
    }

    step('format and version bits equal the standard\'s tables (a decoder corrects a few wrong ones)');
    // ISO/IEC 18004 table C.1, level M, masks 0..7; table D.1, versions 7..10.
    const kFormatM = [0x5412, 0x5125, 0x5e7c, 0x5b4b, 0x45f9, 0x40ce, 0x4f97, 0x4aa0];
    const kVersionInfo = { 7: 0x07c94, 8: 0x085bc, 9: 0x09a99, 10: 0x0a4d3 };
    const bits = await page.evaluate(({ shortUrl, longUrls }) => {
      const out = { format: [], version: {} };
      for (let mask = 0; mask < 8; mask++) {
        const q = window.DaisyQR.encode(shortUrl, { mask });
        const m = q.modules;
        const n = q.size;
        let a = 0;
        let b = 0;
        // Both copies, bit i at the places the standard gives (figure 25).
        const first = [[0, 8], [1, 8], [2, 8], [3, 8], [4, 8], [5, 8], [7, 8], [8, 8], [8, 7], [8, 5], [8, 4], [8, 3],
          [8, 2], [8, 1], [8, 0]];
        for (let i = 0; i < 15; i++) {
          a |= m[first[i][0]][first[i][1]] << i;
          b |= (i < 8 ? m[8][n - 1 - i] : m[n - 15 + i][8]) << i;
        }
        out.format.push({ a, b, dark: m[n - 8][8] });
      }
      for (const u of longUrls) {
        const q = window.DaisyQR.encode(u);
        let a = 0;
        let b = 0;
        for (let i = 0; i < 18; i++) {
          a += q.modules[Math.floor(i / 3)][q.size - 11 + (i % 3)] * 2 ** i;
          b += q.modules[q.size - 11 + (i % 3)][Math.floor(i / 3)] * 2 ** i;
        }
        out.version[q.version] = { a, b };
      }
      return out;
    }, { shortUrl: urlOfLength(40), longUrls: [107, 123, 153, 181].map(urlOfLength) });
    for (let mask = 0; mask < 8; mask++) {
      const f = bits.format[mask];
      check(f.a === kFormatM[mask] && f.b === kFormatM[mask] && f.dark === 1,
        `mask ${mask}: format bits ${f.a.toString(2)} / ${f.b.toString(2)}, the standard's are ${kFormatM[mask].toString(2)}`);
    }
    for (const [v, want] of Object.entries(kVersionInfo)) {
      const got = bits.version[v];
      check(got && got.a === want && got.b === want, `version ${v}: version bits ${JSON.stringify(got)}, want ${want.toString(2)}`);
    }

    step('a text longer than version 10 holds is refused');
    const tooLong = await page.evaluate((t) => {
      try { window.DaisyQR.encode(t); return ''; } catch (e) { return String(e.message); }
    }, urlOfLength(214));
    check(tooLong.includes('214 bytes') && tooLong.includes('213'), `a 214-byte text gives: ${JSON.stringify(tooLong)}`);

    step('the decoder rejects broken encoders (format bits unmasked; mask 0 inverted)');
    const source = fs.readFileSync(path.join(SOURCE_DIR, 'web', 'qr.js'), 'utf8');
    const mutants = {
      UnmaskedFormat: ['^ 0x5412', '^ 0'],
      InvertedMask0: ['(r, c) => (r + c) % 2 === 0,', '(r, c) => (r + c) % 2 === 1,'],
    };
    for (const [name, [from, to]] of Object.entries(mutants)) {
      check(source.includes(from), `web/qr.js no longer holds ${JSON.stringify(from)}: update the mutant ${name}`);
      await page.evaluate(({ code, name }) => {
        const real = window.DaisyQR;
        new Function(code)();  // the mutant sets window.DaisyQR; keep it under its own name
        window[name] = window.DaisyQR;
        window.DaisyQR = real;
      }, { code: source.replace(from, to), name });
      for (const n of [26, 84, 213]) {
        const u = urlOfLength(n);
        const r = await roundTrip(u, { impl: name, mask: 0 });
        check(r.decoded !== u, `the mutant ${name} still decodes (${n} bytes): the decode check proves nothing`);
      }
    }
    check(pageErrors.length === 0, 'the page threw:\n' + pageErrors.join('\n'));
    ok = true;
  } finally {
    await finish({ browser, procs, tmp, ok, pageErrors });
  }
});
