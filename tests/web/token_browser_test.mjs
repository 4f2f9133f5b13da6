// The web UI asks for a Hub token only after the Hub refused a load for want of one: a real
// `daisychain serve` (no token of its own) against the test Hub serving a gated copy of the
// bundled model, headless Debian chromium through playwright-core. Load: refused, a password
// field appears; the token typed there: the model loads, the field is emptied, "Forget
// token" appears; a turn shows under "What the room sees" as serve's own device received it;
// Forget: the next load is refused again. The token is in no page storage and not in serve's
// log.
//
// Environment: as browser_test.mjs (DAISY_BIN_DIR, DAISY_MODELS, DAISY_ARTIFACT_DIR,
// DAISY_CHROMIUM); the test Hub is build/tests/support/testhub (tools/testhub.cc).
import fs from 'node:fs';
import path from 'node:path';
import {
  check, collectErrors, env, finish, freePort, getJSON, importPackage, requireChromium, requireFile, runTest, signIn,
  testScope, waitForServe,
} from './lib.mjs';

const E = env();
const TOKEN = 'hf_BrowserGivenToken' + process.pid + 'zQ';

await runTest('token_browser_test', async () => {
  requireChromium(E.chromium);
  const { chromium } = await importPackage('playwright-core');
  requireFile(E.bin, 'the daisychain binary', 'build it first (cmake --build build), or set DAISY_BIN_DIR');
  const testhub = path.resolve(E.binDir, '..', '..', 'tests', 'support', 'testhub');
  requireFile(testhub, 'the test Hub server', 'build it first (cmake --build build --target testhub)');
  fs.mkdirSync(E.artifacts, { recursive: true });

  const { tmp, procs, pageErrors } = testScope('daisy_web_token_');
  let browser = null;
  let ok = false;
  try {
    fs.cpSync(path.join(E.models, 'stories260K'), path.join(tmp, 'repos', 'acme', 'gated'), { recursive: true });
    const hubPort = await freePort();
    procs.start('testhub', testhub, ['--root', path.join(tmp, 'repos'), '--port', String(hubPort), '--gate', 'acme/gated', '--token', TOKEN]);
    const port = await freePort();
    const base = `http://127.0.0.1:${port}`;
    const home = path.join(tmp, 'serve');
    fs.mkdirSync(home, { recursive: true });
    const secretFile = path.join(tmp, 'admin-secret');
    // No token of its own: nothing in the environment, no token file.
    procs.start('serve', E.bin, ['serve', '--port', String(port), '--name', 'serve', '--admin-secret-file', secretFile], {
      DAISY_HOME: home, HF_ENDPOINT: `http://127.0.0.1:${hubPort}`, HF_TOKEN: '', HF_HOME: path.join(home, 'hf'),
      HF_TOKEN_PATH: path.join(home, 'no-token'),
    });
    const secret = await waitForServe(base, procs, secretFile);

    browser = await chromium.launch({
      executablePath: E.chromium,
      args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--disable-dev-shm-usage'],
    });
    const context = await browser.newContext({ viewport: { width: 360, height: 800 } });
    const page = await context.newPage();
    page.setDefaultTimeout(30000);
    collectErrors(page, pageErrors);
    const step = (s) => console.log(`-- ${s}`);
    await signIn(page, base, secret);

    step('load the gated repo without a token');
    check(await page.locator('#token-form').isHidden(), 'the token field shows before any refusal');
    await page.fill('#model-input', 'acme/gated');
    await page.click('#load-btn');
    await page.locator('#token-form').waitFor({ state: 'visible' });
    const refused = await page.locator('#load-error').innerText();
    check(refused.includes('needs a Hugging Face token'), `the load error does not say a token is needed: ${refused}`);
    check(await page.locator('#token-input').getAttribute('type') === 'password', 'the token field is not a password field');

    step('give the token');
    await page.fill('#token-input', TOKEN);
    await page.click('#token-btn');
    await page.locator('#model-info [data-key="model"] dd').filter({ hasText: 'acme/gated' }).waitFor();
    check(await page.locator('#token-form').isHidden(), 'the token field stays after the load succeeded');
    check(await page.locator('#token-input').inputValue() === '', 'the page kept the token in its field');
    await page.locator('#token-held').waitFor({ state: 'visible' });
    check((await getJSON(`${base}/api/hub-token`, secret)).set === true, 'serve says no token is held');

    step('a turn: "What the room sees" shows it as serve\'s own device received it');
    await page.fill('#max-tokens', '24');
    await page.fill('#prompt', 'Once upon a time');
    await page.click('#generate-btn');
    const turn = page.locator('[data-testid="room-turn"][data-state="done"]').first();
    await turn.waitFor();
    await page.locator('#output[data-state="done"]').waitFor();
    const output = await page.locator('#output').innerText();
    const seen = await turn.locator('pre').innerText();
    check(seen.length > 0 && output.endsWith(seen), `the room's view ${JSON.stringify(seen)} is not the end of the output ${JSON.stringify(output)}`);
    check((await turn.locator('.who').innerText()).includes('24 tokens'), 'the room\'s view does not say 24 tokens');
    await page.screenshot({ path: path.join(E.artifacts, 'token-360.png'), fullPage: true });

    step('forget it: the next load is refused again');
    await page.click('#token-forget');
    await page.locator('#token-held').waitFor({ state: 'hidden' });
    check((await getJSON(`${base}/api/hub-token`, secret)).set === false, 'serve still holds the token after Forget');
    await page.click('#load-btn');
    await page.locator('#token-form').waitFor({ state: 'visible' });

    const stored = await page.evaluate(() => JSON.stringify(Object.entries(localStorage)) + JSON.stringify(Object.entries(sessionStorage)) + document.cookie);
    check(!stored.includes(TOKEN), 'the token is in the page\'s storage');
    check(!procs.log('serve').includes(TOKEN), 'the token is in serve\'s log');
    check(pageErrors.length === 0, 'the page threw:\n' + pageErrors.join('\n'));
    ok = true;
  } finally {
    await finish({ browser, procs, tmp, ok, pageErrors });
  }
});
