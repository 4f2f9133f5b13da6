// The chat view in headless Debian chromium (playwright-core) against a real `daisychain
// serve` with a chat-template model split over 2 devices (chat_room.mjs): the mode
// indicator, Enter / Shift+Enter, two turns of one conversation (the second reuses the
// prefix: fewer positions sent, and its ids equal a fresh conversation's sent by this
// script), Verify and the timings of each reply, Stop in the middle of a reply (the server
// ends the turn and the next message is answered), Regenerate, Copy, an error shown as a
// message, Markdown and hostile HTML shown safely, New chat, the conversations after a
// page reload (and no secret in localStorage); screenshots at 1280 and 360 px.
//
// What the hostile-HTML step proves: a tiny story model will not write `<img src=x
// onerror=...>` on request, so that step answers one /api/chat request of the page with a
// canned event stream (playwright's page.route) whose reply holds the HTML, Markdown and
// a javascript: link. It checks the UI's rendering of a streamed reply, not the server;
// the user's own message with the same HTML goes to the real server.
//
// Environment: DAISY_BIN_DIR, DAISY_MODELS, DAISY_ARTIFACT_DIR, DAISY_CHROMIUM (see browser_test.mjs).
import fs from 'node:fs';
import path from 'node:path';
import {
  check, collectErrors, env, fail, finish, importPackage, requireChromium, runTest, testScope,
} from './lib.mjs';
import { chatTurn, startChatRoom } from './chat_room.mjs';

const E = env();
const step = (s) => console.log(`-- ${s}`);
const XSS = '<img src=x onerror="window.__xss=1">';

await runTest('chat_browser_test', async () => {
  requireChromium(E.chromium);
  const { chromium } = await importPackage('playwright-core');
  fs.mkdirSync(E.artifacts, { recursive: true });
  const { tmp, procs, pageErrors } = testScope('daisy_web_chat_ui_');
  let browser = null;
  let ok = false;
  try {
    step('serve with a chat-template copy of stories260K, and a slow node (2 stages)');
    const { base, secret, openUrl } = await startChatRoom(E, procs, tmp);

    browser = await chromium.launch({
      executablePath: E.chromium,
      args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--disable-dev-shm-usage'],
    });
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: base });
    const page = await context.newPage();
    page.setDefaultTimeout(30000);
    collectErrors(page, pageErrors);
    page.on('console', (m) => { if (m.type() === 'error') console.log('[browser console] ' + m.text()); });

    step('open the UI');
    await page.goto(openUrl);
    await page.waitForURL(base + '/', { timeout: 15000 });
    await page.waitForSelector('#conn[data-state="live"]', { timeout: 15000 });
    await page.waitForSelector('#chat-mode[data-mode="template"]', { timeout: 15000 }).catch(async () =>
      fail('the chat does not say it uses the chat template: ' + await page.locator('#chat-mode').innerText()));
    console.log(`   mode: ${await page.locator('#chat-mode').innerText()}`);
    await page.fill('#max-tokens', '16');
    await page.check('#verify');

    const assistants = page.locator('#chat-messages .msg-row.assistant');
    const waitReplies = async (n, what) => {
      await page.waitForFunction((k) => {
        const rows = document.querySelectorAll('#chat-messages .msg-row.assistant');
        return rows.length >= k && !window.daisy.chat.busy;
      }, n, { timeout: 90000 }).catch(async () => fail(`${what}: no reply; the chat shows:\n` +
        await page.locator('#chat-messages').innerText() + '\nstate: ' +
        await page.locator('#chat-state').innerText()));
      const errors = await page.locator('#chat-messages .msg-row.error').allInnerTexts();
      check(errors.length === 0, `${what}: the chat shows an error: ${errors.join(' | ')}`);
    };

    // ---- turn 1: system prompt, Shift+Enter, Enter, the user's HTML as text ----
    step('turn 1: a system prompt, Shift+Enter makes a new line, Enter sends');
    await page.click('#chat-system-box summary');
    await page.fill('#chat-system', 'You tell short stories.');
    await page.click('#chat-input');
    await page.keyboard.type('Tell me about a cat. ' + XSS);
    await page.keyboard.press('Shift+Enter');
    await page.keyboard.type('Please.');
    check((await page.inputValue('#chat-input')).includes('\nPlease.'), 'Shift+Enter did not make a new line');
    check(await page.locator('#chat-messages .msg-row.user').count() === 0, 'Shift+Enter sent the message');
    await page.keyboard.press('Enter');
    await waitReplies(1, 'turn 1');
    const userText = await page.locator('#chat-messages .msg-row.user .bubble').first().innerText();
    check(userText.includes(XSS) && userText.includes('\nPlease.'),
      `the user's message is not shown as typed: ${JSON.stringify(userText)}`);
    const stats1 = page.locator('#chat-messages .msg-row.assistant .msg-stats').last();
    check(/^reused 0 positions/.test(await stats1.innerText()), `turn 1 stats: ${await stats1.innerText()}`);
    const verify1 = await page.locator('#chat-messages .msg-row.assistant .msg-verify').last();
    check(await verify1.getAttribute('data-verified') === 'true',
      `turn 1 is not VERIFIED: ${await verify1.innerText()}`);
    const timings = page.locator('#chat-messages .msg-row.assistant .msg-timings').last();
    await timings.locator('summary').click();
    check(/prefill .* decode/.test(await timings.locator('summary').innerText()), 'no timings line');
    check(await timings.locator('tbody tr').count() === 2, 'the timings do not list 2 stages');
    check((await timings.innerText()).includes('slow-node'), 'the timings do not name the slow node');
    const done1 = await page.evaluate(() => window.daisy.chat.lastDone);
    console.log(`   reply 1 ${JSON.stringify(done1.text)}; ${await stats1.innerText()}`);

    // ---- turn 2: the prefix is reused; the ids equal a fresh conversation's ----
    step('turn 2 of the same conversation');
    await page.fill('#chat-input', 'What did the cat eat?');
    await page.press('#chat-input', 'Enter');
    await waitReplies(2, 'turn 2');
    const stats2 = page.locator('#chat-messages .msg-row.assistant .msg-stats').last();
    const stats2Text = await stats2.innerText();
    const reused = Number(await stats2.getAttribute('data-reused'));
    const sent = Number(await stats2.getAttribute('data-ring-positions'));
    const promptTokens = Number(await stats2.getAttribute('data-prompt-tokens'));
    check(new RegExp(`^reused ${reused} positions`).test(stats2Text) && reused >= done1.prompt_ids.length,
      `turn 2 does not reuse turn 1's prompt (${done1.prompt_ids.length} positions): ${stats2Text}`);
    check(sent < promptTokens, `turn 2 sent ${sent} positions around the ring for a prompt of ${promptTokens}`);
    const done2 = await page.evaluate(() => window.daisy.chat.lastDone);
    const stored = await page.evaluate(() => JSON.parse(localStorage.getItem('daisy.chat.v1')));
    const conv = stored.conversations.find((c) => c.id === stored.current);
    const wire = [{ role: 'system', content: conv.system }, ...conv.messages.slice(0, 3).map((m) => ({ role: m.role,
      content: m.content }))];
    const fresh = await chatTurn(base, secret, { conversation: 'fresh-' + Date.now(), messages: wire, max_tokens: 16,
      temperature: 0 });
    check(fresh.done && fresh.done.reused_positions === 0, `the fresh run: ${JSON.stringify(fresh).slice(0, 300)}`);
    check(JSON.stringify(fresh.done.prompt_ids) === JSON.stringify(done2.prompt_ids),
      'the script did not rebuild the UI\'s turn-2 prompt');
    check(JSON.stringify(fresh.done.ids) === JSON.stringify(done2.ids),
      `turn 2's ids ${JSON.stringify(done2.ids)} differ from a fresh run's ${JSON.stringify(fresh.done.ids)}`);
    console.log(`   ${stats2Text}; a fresh conversation sent ${fresh.done.ring_positions} positions, same ids`);

    // ---- Regenerate and Copy ----
    step('Regenerate the last reply (greedy: the same text), Copy it');
    const before = await assistants.last().locator('.bubble').innerText();
    await assistants.last().locator('.msg-regen').click();
    await page.waitForFunction(() => !window.daisy.chat.busy &&
      document.querySelectorAll('#chat-messages .msg-row.assistant').length === 2,
      null, { timeout: 90000 });
    check(await assistants.count() === 2, 'Regenerate added a reply instead of replacing the last one');
    const after = await assistants.last().locator('.bubble').innerText();
    check(after === before,
      `a greedy Regenerate gave another text: ${JSON.stringify(before)} -> ${JSON.stringify(after)}`);
    await assistants.last().locator('.msg-copy').click();
    await page.waitForFunction(
      () => Array.from(document.querySelectorAll('.msg-copy')).some((b) => b.textContent === 'Copied'),
      null, { timeout: 5000 });
    const clip = await page.evaluate(() => navigator.clipboard.readText());
    check(clip === done2.text,
      `Copy put ${JSON.stringify(clip)} on the clipboard, expected the reply ${JSON.stringify(done2.text)}`);

    // ---- Stop ----
    step('Stop in the middle of a long reply, then send again');
    await page.fill('#max-tokens', '400');
    await page.uncheck('#verify');
    await page.fill('#chat-input', 'Tell me a long story.');
    await page.press('#chat-input', 'Enter');
    await page.waitForFunction(() => {
      const rows = document.querySelectorAll('#chat-messages .msg-row.assistant');
      const r = rows[rows.length - 1];
      return r && Number(r.dataset.tokens || 0) >= 5;
    }, null, { timeout: 30000 });
    check(await page.locator('#chat-stop').isVisible(), 'no Stop button while a reply streams');
    await page.click('#chat-stop');
    await page.waitForFunction(() => !window.daisy.chat.busy, null, { timeout: 10000 });
    check(await assistants.last().locator('.msg-stopped').count() === 1, 'the stopped reply is not marked stopped');
    check((await assistants.last().locator('.bubble').innerText()).length > 0, 'the stopped reply kept no text');
    const shownTokens = await page.evaluate(() => {
      const c = window.daisy.chat.store.conversations.find((x) => x.id === window.daisy.chat.store.current);
      return c.messages[c.messages.length - 1].meta.tokens;
    });
    const stopLine = await page.waitForFunction(() => {
      const lines = Array.from(document.querySelectorAll('#status-log .line')).map((l) => l.textContent);
      const m = lines.map((l) => l.match(/turn stopped by the client after (\d+) tokens?/)).find(Boolean);
      return m ? Number(m[1]) : false;
    }, null, { timeout: 10000 }).then((h) => h.jsonValue())
      .catch(() => fail('the server did not say it stopped the turn'));
    // The server ends the turn a few tokens after the stream closed (tokens already on their
    // way count too); the whole reply would run to the context's end, over 300 tokens here.
    check(stopLine >= shownTokens && stopLine <= shownTokens + 60,
      `the server ran the stopped turn for ${stopLine} tokens; the page had shown ${shownTokens} when it stopped`);
    console.log(`   the page showed ${shownTokens} tokens at Stop; the server ended the turn after ${stopLine}`);
    await page.fill('#max-tokens', '8');
    await page.fill('#chat-input', 'And then?');
    await page.press('#chat-input', 'Enter');
    await waitReplies(4, 'the message after Stop');
    check(/^reused \d+ positions/.test(await assistants.last().locator('.msg-stats').innerText()),
      'the turn after Stop has no stats');

    // ---- an error as a message ----
    step('a message longer than the context, in a new chat: the error shows in the conversation');
    await page.click('#chat-new');
    await page.fill('#chat-input', 'Once upon a time '.repeat(200));
    await page.press('#chat-input', 'Enter');
    await page.waitForSelector('#chat-messages .msg-row.error', { timeout: 30000 });
    const errText = await page.locator('#chat-messages .msg-row.error').last().innerText();
    check(/context holds/.test(errText), `the error message does not say why: ${errText}`);

    // ---- hostile HTML and Markdown in a reply ----
    step('a reply with HTML, Markdown and a javascript: link (a canned stream, see the top of this file)');
    await page.click('#chat-new');
    check(await page.locator('#chat-messages .msg-row').count() === 0, 'New chat did not start an empty conversation');
    const reply = `Here: ${XSS} and **bold**, _italic_, snake_case_name and \`<b>code</b>\`\n\n` +
      '- one\n- two <script>window.__xss=2</script>\n\n' +
      '```\n<img src=x onerror="window.__xss=3">\n```\n[safe](https://example.org/) [bad](javascript:window.__xss=4)';
    const pieces = reply.match(/[\s\S]{1,7}/g);
    const sse = pieces.map((p, i) => `event: token\ndata: ${JSON.stringify({ id: i + 10, text: p })}\n\n`).join('') +
      `event: done\ndata: ${JSON.stringify({ text: reply, ids: pieces.map((_, i) => i + 10), prompt_ids: [1],
        reused_positions: 0,
        ring_positions: 1, prompt_tokens: 1, finish_reason: 'stop', stages: [], mode: 'template',
          verified: null })}\n\n`;
    await page.route('**/api/chat', (route) => route.fulfill({ status: 200, contentType: 'text/event-stream',
      body: sse }), { times: 1 });
    await page.fill('#chat-input', 'Show me HTML: ' + XSS);
    await page.press('#chat-input', 'Enter');
    await waitReplies(1, 'the canned reply');
    const bubble = assistants.last().locator('.bubble');
    const shown = await bubble.innerText();
    check(shown.includes(XSS) && shown.includes('<script>window.__xss=2</script>') &&
      shown.includes('<img src=x onerror="window.__xss=3">'),
      `the HTML of the reply is not shown as text: ${JSON.stringify(shown)}`);
    const dom = await page.evaluate(() => {
      const box = document.getElementById('chat-messages');
      return {
        imgs: box.querySelectorAll('img').length, scripts: box.querySelectorAll('script').length,
        bold: Array.from(box.querySelectorAll('.msg-row.assistant strong')).map((e) => e.textContent),
        italic: Array.from(box.querySelectorAll('.msg-row.assistant em')).map((e) => e.textContent),
        code: Array.from(box.querySelectorAll('.msg-row.assistant code')).map((e) => e.textContent),
        items: box.querySelectorAll('.msg-row.assistant li').length,
        links: Array.from(box.querySelectorAll('a')).map((a) => ({ href: a.getAttribute('href'), rel: a.rel })),
        xss: window.__xss,
      };
    });
    check(dom.imgs === 0 && dom.scripts === 0, `HTML from the reply reached the DOM: ${JSON.stringify(dom)}`);
    check(dom.xss === undefined, `a handler of the reply ran: window.__xss = ${dom.xss}`);
    check(dom.bold.includes('bold') && dom.code.includes('<b>code</b>') && dom.items === 2,
      `Markdown not rendered: ${JSON.stringify(dom)}`);
    check(dom.code.some((c) => c.includes('<img src=x')), `the code block is missing: ${JSON.stringify(dom.code)}`);
    check(JSON.stringify(dom.italic) === '["italic"]' && shown.includes('snake_case_name'),
      `italic: ${JSON.stringify(dom.italic)} (only _italic_, not the underscores of snake_case_name)`);
    check(dom.links.length === 1 && dom.links[0].href === 'https://example.org/' && /noopener/.test(dom.links[0].rel),
      `links: ${JSON.stringify(dom.links)} (only the https one may be a link, with rel=noopener)`);
    check(shown.includes('[bad](javascript:window.__xss=4)'), 'the javascript: link is not shown as text');

    // ---- reload ----
    step('reload: the three conversations are still there');
    const storedBefore = await page.evaluate(() => localStorage.getItem('daisy.chat.v1'));
    check(!storedBefore.includes(secret), 'the admin secret is in localStorage');
    await page.reload();
    await page.waitForSelector('#conn[data-state="live"]', { timeout: 15000 });
    check(await page.locator('#chat-list .chat-item').count() === 3,
      `after a reload the side panel lists ${await page.locator('#chat-list .chat-item').count()} conversations`);
    check((await assistants.last().locator('.bubble').innerText()) === shown,
      'after a reload the current conversation differs');
    await page.locator('#chat-list .chat-item .chat-open', { hasText: 'Tell me about a cat.' }).click();
    check(await page.locator('#chat-messages .msg-row.user').count() === 4,
      'after a reload the first conversation lost messages');
    check(await assistants.count() === 4,
      `after a reload the first conversation (2 replies, a stopped one, one more) shows ${await assistants.count()}`);
    check(/^reused \d+ positions/.test(await assistants.nth(1).locator('.msg-stats').innerText()),
      'after a reload the stats are gone');
    check(await page.inputValue('#chat-system') === 'You tell short stories.',
      'after a reload the system prompt is gone');
    check(await assistants.nth(2).locator('.msg-stopped').count() === 1,
      'after a reload the stopped reply is not marked stopped');
    await page.locator('#chat-list .chat-item .chat-open', { hasText: 'Once upon a time' }).click();
    check(await page.locator('#chat-messages .msg-row.error').count() === 1,
      'after a reload the error message is gone');
    await page.locator('#chat-list .chat-item .chat-open', { hasText: 'Tell me about a cat.' }).click();

    // ---- screenshots ----
    const shot1280 = path.join(E.artifacts, 'chat-1280.png');
    await page.screenshot({ path: shot1280, fullPage: true });
    await page.setViewportSize({ width: 360, height: 800 });
    await page.waitForTimeout(200);
    await page.locator('#chat-section').scrollIntoViewIfNeeded();
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth);
    const shot360 = path.join(E.artifacts, 'chat-360.png');
    await page.screenshot({ path: shot360, fullPage: true });
    console.log(`   screenshots: ${shot1280} ${shot360}`);
    check(overflow <= 361, `at 360 px the page is ${overflow} px wide (it scrolls sideways)`);
    check(await page.locator('#chat-send').isVisible() && await page.locator('#chat-input').isVisible(),
      'at 360 px the composer is not visible');
    const sendBox = await page.locator('#chat-send').boundingBox();
    check(sendBox && sendBox.x >= 0 && sendBox.x + sendBox.width <= 360,
      `at 360 px Send is outside the screen: ${JSON.stringify(sendBox)}`);

    check(pageErrors.length === 0, 'the page threw:\n' + pageErrors.join('\n'));
    ok = true;
  } finally {
    await finish({ browser, procs, tmp, ok, pageErrors, logsTo: path.join(E.artifacts, 'chat_browser_test') });
  }
});
