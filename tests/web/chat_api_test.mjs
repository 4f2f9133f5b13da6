// POST /api/chat against a real `daisychain serve` with a chat-template model split over 2
// devices (chat_room.mjs): strict validation (400s naming the field), the admin cookie,
// two turns of one conversation (the second reuses the prefix: fewer positions go around
// the ring, the ids equal a fresh conversation's), an unknown id starts fresh, Verify, and
// Stop (the client closes the stream) ends the turn on the server and frees the ring.
//
// Environment: DAISY_BIN_DIR, DAISY_MODELS, DAISY_ARTIFACT_DIR (see browser_test.mjs).
import fs from 'node:fs';
import path from 'node:path';
import { Procs, check, env, killOnSignals, runTest, tempDir, waitFor } from './lib.mjs';
import { chatTurn, startChatRoom } from './chat_room.mjs';

const E = env();
const step = (s) => console.log(`-- ${s}`);
const SYSTEM = { role: 'system', content: 'You tell short stories.' };

await runTest('chat_api_test', async () => {
  fs.mkdirSync(E.artifacts, { recursive: true });
  const tmp = tempDir('daisy_web_chat_api_');
  const procs = new Procs(tmp);
  killOnSignals(procs);
  let ok = false;
  try {
    step('serve with a chat-template copy of stories260K, and a slow node (2 stages)');
    const { base, secret } = await startChatRoom(E, procs, tmp);
    const turn = (body, opts) => chatTurn(base, secret, body, opts);
    const expect400 = async (what, body, param, says) => {
      const r = await turn(body);
      check(r.status === 400,
        `${what}: answered ${r.status}, expected 400: ${r.text || JSON.stringify(r.events || []).slice(0, 300)}`);
      check(r.error && r.error.param === param,
        `${what}: param is ${r.error && JSON.stringify(r.error.param)}, expected ${param}: ${r.text}`);
      check(says.test(r.error.message), `${what}: the message does not say ${says}: ${r.error.message}`);
      console.log(`   ${what}: 400 ${r.error.message}`);
    };

    // ---- refusals ----
    step('bad requests: clear 400s');
    const user = (content) => ({ role: 'user', content });
    await expect400('a bad role', { messages: [{ role: 'wizard', content: 'x' }] }, 'messages[0].role',
      /"system", "user" or "assistant"/);
    await expect400('no messages', { messages: [] }, 'messages', /at least one/);
    await expect400('messages of the wrong type', { messages: 'hello' }, 'messages', /must be an array/);
    await expect400('content of the wrong type', { messages: [{ role: 'user', content: 5 }] }, 'messages[0].content',
      /a string/);
    await expect400('an empty user message', { messages: [user('')] }, 'messages[0].content', /empty/);
    await expect400('max_tokens of the wrong type', { messages: [user('x')], max_tokens: 'ten' }, 'max_tokens',
      /an integer/);
    await expect400('a bad conversation id', { conversation: '../x', messages: [user('x')] }, 'conversation',
      /letters, digits/);
    await expect400('too long', { messages: [user('a'.repeat((1 << 20) + 1))] }, 'messages[0].content', /too long/);
    await expect400('longer than the context', { messages: [user('Once upon a time '.repeat(200))] }, 'messages',
      /context holds/);
    await expect400('the last message not the user\'s', { messages: [user('x'), { role: 'assistant', content: 'y' }] },
      'messages[1].role', /the user's/);
    const noCookie = await fetch(`${base}/api/chat`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ messages: [user('x')] }) });
    check(noCookie.status === 401, `without the admin cookie /api/chat answered ${noCookie.status}, expected 401`);
    const crossSite = await fetch(`${base}/api/chat`, { method: 'POST',
      headers: { 'Content-Type': 'application/json', Cookie: `daisy_admin=${secret}`, Origin: 'http://evil.example' },
      body: JSON.stringify({ messages: [user('x')] }) });
    check(crossSite.status === 403, `a cross-site /api/chat answered ${crossSite.status}, expected 403`);

    // ---- two turns of one conversation ----
    step('turn 1 of conversation A');
    const convA = 'test-a-' + Date.now();
    const m1 = [SYSTEM, user('Tell me about a cat.')];
    const t1 = await turn({ conversation: convA, messages: m1, max_tokens: 20, temperature: 0 });
    check(t1.status === 200 && t1.done, `turn 1: ${JSON.stringify(t1).slice(0, 400)}`);
    check(t1.done.mode === 'template', `turn 1: mode is ${t1.done.mode}, expected template`);
    check(t1.done.conversation === convA, `turn 1: conversation is ${t1.done.conversation}`);
    check(t1.done.reused_positions === 0, `turn 1 of a new conversation reused ${t1.done.reused_positions} positions`);
    check(Array.isArray(t1.done.ids) && t1.done.ids.length > 0 && t1.done.text.length > 0,
      `turn 1: no reply: ${JSON.stringify(t1.done)}`);
    const streamed = t1.events.filter((e) => e.name === 'token').map((e) => e.data.text).join('');
    check(streamed === t1.done.text,
      `turn 1: the streamed text ${JSON.stringify(streamed)} is not done.text ${JSON.stringify(t1.done.text)}`);
    check(t1.done.stages.length === 2 && t1.done.stages[1].name === 'slow-node',
      `turn 1 ran on ${JSON.stringify(t1.done.stages.map((s) => s.name))}, expected head and slow-node`);
    console.log(`   reply ${JSON.stringify(t1.done.text)}; ${t1.done.prompt_tokens} prompt tokens, ` +
      `${t1.done.ring_positions} positions sent`);

    step('turn 2 of conversation A: the prefix is reused');
    const m2 = [...m1, { role: 'assistant', content: t1.done.text }, user('What did the cat eat?')];
    const t2 = await turn({ conversation: convA, messages: m2, max_tokens: 20, temperature: 0 });
    check(t2.status === 200 && t2.done, `turn 2: ${JSON.stringify(t2).slice(0, 400)}`);
    check(t2.done.reused_positions > 0, `turn 2 reused no positions: ${JSON.stringify(t2.done)}`);
    check(t2.done.reused_positions >= t1.done.prompt_tokens,
      `turn 2 reused ${t2.done.reused_positions} positions, less than turn 1's prompt (${t1.done.prompt_tokens})`);
    const d2 = t2.done;
    console.log(`   reused ${d2.reused_positions} of ${d2.prompt_tokens}; ${d2.ring_positions} positions sent`);

    step('the same turn 2 in a conversation the server never saw: fresh, same ids');
    const t2fresh = await turn({ conversation: 'never-seen-' + Date.now(), messages: m2, max_tokens: 20,
      temperature: 0 });
    check(t2fresh.status === 200 && t2fresh.done, `fresh turn 2: ${JSON.stringify(t2fresh).slice(0, 400)}`);
    check(t2fresh.done.reused_positions === 0,
      `an unknown conversation reused ${t2fresh.done.reused_positions} positions`);
    check(JSON.stringify(t2fresh.done.ids) === JSON.stringify(t2.done.ids),
      `the ids depend on the cache: cached ${JSON.stringify(t2.done.ids)}, fresh ${JSON.stringify(t2fresh.done.ids)}`);
    check(JSON.stringify(t2fresh.done.prompt_ids) === JSON.stringify(t2.done.prompt_ids),
      'the two turn-2 prompts differ');
    check(t2.done.ring_positions < t2fresh.done.ring_positions,
      `the cached turn sent ${d2.ring_positions} positions, a fresh one ${t2fresh.done.ring_positions}`);
    console.log(`   positions sent: ${d2.ring_positions} (cached) < ${t2fresh.done.ring_positions} (fresh); ids equal`);

    step('Verify');
    const tv = await turn({ conversation: convA, messages: m2, max_tokens: 12, temperature: 0, verify: true });
    check(tv.done && tv.done.verified === true, `verify: ${JSON.stringify(tv.done || tv).slice(0, 400)}`);
    check(JSON.stringify(tv.done.ids) === JSON.stringify(t2.done.ids.slice(0, 12)), 'the verified turn gave other ids');
    console.log(`   ${tv.done.verify_message}`);

    // ---- Stop ----
    step('a long reply, in full (the length a stop must cut short)');
    const longMsgs = [user('Once upon a time there was a big dog.')];
    const full = await turn({ conversation: 'long-full', messages: longMsgs, max_tokens: 400, temperature: 0 });
    check(full.done, `the long reply: ${JSON.stringify(full).slice(0, 300)}`);
    const fullTokens = full.done.ids.length;
    console.log(`   ${fullTokens} tokens (${full.done.finish_reason})`);
    check(fullTokens >= 60, `the long reply has only ${fullTokens} tokens: too short to stop in its middle`);

    step('the same reply, stopped after 5 tokens; then the next request');
    const before = procs.log('serve');
    const stopped = await turn({ conversation: 'long-stopped', messages: longMsgs, max_tokens: 400, temperature: 0 },
      { onToken: (n, ctrl) => { if (n === 5) ctrl.abort(); } });
    check(stopped.aborted && stopped.tokens === 5,
      `the stopped turn: ${JSON.stringify({ aborted: stopped.aborted, tokens: stopped.tokens })}`);
    const next = await turn({ conversation: convA, messages: m1, max_tokens: 8, temperature: 0 }, { timeoutMs: 30000 });
    check(next.done, `the request after a stop did not finish: ${JSON.stringify(next).slice(0, 300)}`);
    check(JSON.stringify(next.done.ids) === JSON.stringify(t1.done.ids.slice(0, next.done.ids.length)),
      'the request after a stop gave other ids than turn 1');
    // The server says when and where it ended the stopped turn.
    const line = await waitFor('serve to log the stopped turn', () => {
      const m = procs.log('serve').slice(before.length).match(/turn stopped by the client after (\d+) tokens?/);
      return m ? m : null;
    }, { timeoutMs: 10000, procs });
    const servedTokens = Number(line[1]);
    console.log(`   the server ended the turn after ${servedTokens} tokens (a full reply is ${fullTokens})`);
    check(servedTokens >= 5 && servedTokens < Math.min(fullTokens, 5 + 40),
      `the server ran the stopped turn for ${servedTokens} tokens (stopped after 5; a full reply is ${fullTokens})`);
    const queuedBehind = next.events.filter((e) => e.name === 'queued').map((e) => e.data.position);
    console.log(`   the next request's queue positions: ${JSON.stringify(queuedBehind)}`);

    // ---- a base model: plain completion ----
    step('a model without a chat template: plain completion');
    const plainDir = path.join(tmp, 'models', 'stories260K-plain');
    fs.cpSync(path.join(E.models, 'stories260K'), plainDir, { recursive: true });
    const load = await fetch(`${base}/api/load`, { method: 'POST',
      headers: { 'Content-Type': 'application/json', Cookie: `daisy_admin=${secret}` },
        body: JSON.stringify({ model: plainDir }) });
    const loaded = await load.json();
    check(load.status === 200 && loaded.model.has_chat_template === false,
      `loading the plain copy: ${JSON.stringify(loaded).slice(0, 300)}`);
    const tp = await turn({ conversation: 'plain-1', messages: [user('Once upon a time'), { role: 'assistant',
      content: ' there was' },
      user(' a dog')], max_tokens: 10, temperature: 0 });
    check(tp.done && tp.done.mode === 'plain', `plain turn: ${JSON.stringify(tp.done || tp).slice(0, 300)}`);
    // The same text through /api/generate: the same prompt ids and reply.
    const gen = await fetch(`${base}/api/generate`, { method: 'POST',
      headers: { 'Content-Type': 'application/json', Cookie: `daisy_admin=${secret}` },
      body: JSON.stringify({ prompt: 'Once upon a time there was a dog', max_tokens: 10, temperature: 0 }) });
    const genText = await gen.text();
    const genDone = JSON.parse(genText.split('event: done\ndata: ')[1].split('\n')[0]);
    check(JSON.stringify(genDone.prompt_ids) === JSON.stringify(tp.done.prompt_ids),
      `plain chat prompt ${JSON.stringify(tp.done.prompt_ids)} is not the joined text's ` +
      JSON.stringify(genDone.prompt_ids));
    check(JSON.stringify(genDone.ids) === JSON.stringify(tp.done.ids), 'plain chat and /api/generate gave other ids');
    console.log(`   ${JSON.stringify(tp.done.text)} (the same as /api/generate of the joined text)`);

    ok = true;
  } finally {
    await procs.stopAll();
    for (const p of procs.list) {
      try { fs.copyFileSync(p.logFile, path.join(E.artifacts,
        `chat_api_test-${p.name}.log`)); } catch (_) { /* none */ }
    }
    if (!ok) {
      for (const p of procs.list) console.error(`---- ${p.name} log (tail) ----\n${procs.tail(p.name, 40)}`);
      console.error(`logs kept in ${tmp}`);
    } else {
      fs.rmSync(tmp, { recursive: true, force: true });
    }
  }
});
