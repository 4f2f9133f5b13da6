// The OpenAI-compatible API of `daisychain serve`, driven by the official `openai` npm
// client: completions and chat completions, streaming and not, JSON mode, stop strings,
// usage, and errors in OpenAI's shape.
//
// The bundled stories260K has no chat template: chat on it must be refused with a 400.
// For the chat cases the test makes a copy of the model in a temp folder whose
// tokenizer_config.json carries a small ChatML-like template (plain text only: the
// tokenizer's byte fallback encodes anything), loads it with POST /api/load and goes on.
//
// Environment: DAISY_BIN_DIR, DAISY_MODELS, DAISY_ARTIFACT_DIR (see browser_test.mjs).
import fs from 'node:fs';
import path from 'node:path';
import {
  Procs, check, env, fail, freePort, getJSON, importPackage, killOnSignals, postJSON, requireFile, runTest,
  tempDir, waitFor, waitForServe,
} from './lib.mjs';

const E = env();
// bos_token first, as real templates do: chat prompts are encoded without adding special
// tokens (as transformers' apply_chat_template), completions with them.
const CHAT_TEMPLATE =
  "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";

const step = (s) => console.log(`-- ${s}`);

function checkUsage(u, what, maxCompletion) {
  check(u && typeof u === 'object', `${what}: no usage`);
  for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens'])
    check(Number.isInteger(u[k]) && u[k] >= 0, `${what}: usage.${k} is ${u[k]}`);
  check(u.prompt_tokens > 0, `${what}: usage.prompt_tokens is 0`);
  check(u.total_tokens === u.prompt_tokens + u.completion_tokens, `${what}: usage does not add up: ${JSON.stringify(u)}`);
  if (maxCompletion !== undefined) check(u.completion_tokens <= maxCompletion, `${what}: ${u.completion_tokens} completion tokens, max_tokens was ${maxCompletion}`);
}

function checkFinish(choice, u, maxTokens, what) {
  check(['stop', 'length'].includes(choice.finish_reason), `${what}: finish_reason is ${JSON.stringify(choice.finish_reason)}`);
  if (choice.finish_reason === 'length' && u) check(u.completion_tokens === maxTokens, `${what}: finish_reason 'length' after ${u.completion_tokens} of ${maxTokens} tokens`);
}

// Expects the call to throw an OpenAI APIError with this status, in OpenAI's shape.
async function expectApiError(OpenAI, what, status, call, { param, messageHas } = {}) {
  let err = null;
  try {
    await call();
  } catch (e) {
    err = e;
  }
  check(err, `${what}: expected an HTTP ${status} error, the call succeeded`);
  check(err instanceof OpenAI.APIError, `${what}: expected an APIError, got ${err && err.constructor && err.constructor.name}: ${err && err.message}`);
  check(err.status === status, `${what}: expected status ${status}, got ${err.status} (${err.message})`);
  const body = err.error;  // the "error" object of the body
  check(body && typeof body === 'object', `${what}: the error body has no "error" object: ${JSON.stringify(err.error)}`);
  check(typeof body.message === 'string' && body.message.length > 0, `${what}: error.message missing: ${JSON.stringify(body)}`);
  check(typeof body.type === 'string' && body.type.length > 0, `${what}: error.type missing: ${JSON.stringify(body)}`);
  check('param' in body && 'code' in body, `${what}: error.param / error.code missing: ${JSON.stringify(body)}`);
  if (status === 400) check(body.type === 'invalid_request_error', `${what}: error.type is ${body.type}`);
  if (param) check(body.param === param, `${what}: error.param is ${JSON.stringify(body.param)}, expected ${param}`);
  if (messageHas) check(messageHas.test(body.message), `${what}: the message does not say ${messageHas}: ${body.message}`);
  console.log(`   ${what}: ${status} ${body.type}: ${body.message}`);
  return err;
}

async function collectCompletionStream(stream) {
  let text = '';
  let chunks = 0;
  let finish = null;
  let usage = null;
  for await (const c of stream) {
    check(c.object === 'text_completion', `stream chunk object is ${c.object}`);
    if (c.usage) usage = c.usage;
    for (const ch of c.choices || []) {
      chunks++;
      text += ch.text || '';
      if (ch.finish_reason) {
        check(finish === null, 'two chunks carry a finish_reason');
        finish = ch.finish_reason;
      }
    }
  }
  return { text, chunks, finish, usage };
}

async function collectChatStream(stream) {
  let text = '';
  let chunks = 0;
  let finish = null;
  let usage = null;
  let firstRole = null;
  for await (const c of stream) {
    check(c.object === 'chat.completion.chunk', `stream chunk object is ${c.object}`);
    if (c.usage) usage = c.usage;
    for (const ch of c.choices || []) {
      if (chunks === 0) firstRole = ch.delta && ch.delta.role;
      chunks++;
      text += (ch.delta && ch.delta.content) || '';
      if (ch.finish_reason) {
        check(finish === null, 'two chunks carry a finish_reason');
        finish = ch.finish_reason;
      }
    }
  }
  return { text, chunks, finish, usage, firstRole };
}

function copyModelWithTemplate(src, dst) {
  fs.mkdirSync(dst, { recursive: true });
  for (const f of fs.readdirSync(src)) {
    const p = path.join(src, f);
    if (fs.statSync(p).isFile()) fs.copyFileSync(p, path.join(dst, f));
  }
  const cfgPath = path.join(dst, 'tokenizer_config.json');
  const cfg = JSON.parse(fs.readFileSync(cfgPath, 'utf8'));
  cfg.chat_template = CHAT_TEMPLATE;
  fs.writeFileSync(cfgPath, JSON.stringify(cfg, null, 2));
}

await runTest('openai_test', async () => {
  const { default: OpenAI } = await importPackage('openai');
  requireFile(E.bin, 'the daisychain binary', 'build it first (cmake --build build), or set DAISY_BIN_DIR');
  const stories = path.join(E.models, 'stories260K');
  requireFile(path.join(stories, 'config.json'), 'the bundled model', 'set DAISY_MODELS to the folder holding stories260K');
  fs.mkdirSync(E.artifacts, { recursive: true });

  const tmp = tempDir('daisy_web_openai_');
  const procs = new Procs(tmp);
  killOnSignals(procs);
  let ok = false;
  try {
    const home = (n) => {
      const d = path.join(tmp, n);
      fs.mkdirSync(d, { recursive: true });
      return { DAISY_HOME: d };
    };

    // ---- a server with no model: 503, and an empty model list ----
    step('serve without a model');
    const port0 = await freePort();
    procs.start('serve-empty', E.bin, ['serve', '--port', String(port0), '--room', 'empty' + port0, '--no-compute', '--auto-approve',
      '--admin-secret-file', path.join(tmp, 'secret-empty')], home('serve-empty'));
    const base0 = `http://127.0.0.1:${port0}`;
    await waitForServe(base0, procs, path.join(tmp, 'secret-empty'));
    const client0 = new OpenAI({ baseURL: base0 + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 30000 });
    const models0 = await client0.models.list();
    check(Array.isArray(models0.data) && models0.data.length === 0, `GET /v1/models before a load lists ${JSON.stringify(models0.data)}`);
    await expectApiError(OpenAI, 'completion with no model loaded', 503,
      () => client0.completions.create({ model: 'x', prompt: 'Once', max_tokens: 4 }));

    // ---- the real server, the bundled model ----
    step('serve --auto-approve --model stories260K');
    const port = await freePort();
    procs.start('serve', E.bin, ['serve', '--port', String(port), '--room', 'oai' + port, '--auto-approve', '--model', stories,
      '--admin-secret-file', path.join(tmp, 'secret')], home('serve'));
    const base = `http://127.0.0.1:${port}`;
    const secret = await waitForServe(base, procs, path.join(tmp, 'secret'));
    const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 120000 });
    const modelId = await waitFor('the model to show in /v1/models', async () => {
      const m = await client.models.list();
      return m.data.length === 1 ? m.data[0].id : null;
    }, { procs, timeoutMs: 60000, intervalMs: 200 });
    const listed = (await client.models.list()).data[0];
    check(listed.object === 'model' && listed.owned_by === 'daisychain', `the model entry: ${JSON.stringify(listed)}`);
    console.log(`   model id: ${modelId}`);

    // ---- completions ----
    step('completions, not streaming (greedy)');
    const creq = { model: modelId, prompt: 'Once upon a time', max_tokens: 24, temperature: 0 };
    const c1 = await client.completions.create(creq);
    check(c1.object === 'text_completion', `object is ${c1.object}`);
    check(typeof c1.id === 'string' && c1.id.startsWith('cmpl-'), `id is ${c1.id}`);
    check(Number.isInteger(c1.created) && c1.created > 1.6e9, `created is ${c1.created}`);
    check(c1.model === modelId, `model is ${c1.model}`);
    check(c1.choices.length === 1 && c1.choices[0].index === 0, `choices: ${JSON.stringify(c1.choices)}`);
    const text1 = c1.choices[0].text;
    check(typeof text1 === 'string' && text1.length > 0, `empty completion: ${JSON.stringify(c1)}`);
    checkUsage(c1.usage, 'completion', 24);
    checkFinish(c1.choices[0], c1.usage, 24, 'completion');
    check(c1.usage.prompt_tokens === 5, `"Once upon a time" is 5 tokens with BOS ([1, 403, 407, 261, 378]), usage says ${c1.usage.prompt_tokens}`);
    console.log(`   ${JSON.stringify(text1)} (${c1.choices[0].finish_reason}, ${JSON.stringify(c1.usage)})`);
    const c2 = await client.completions.create(creq);
    check(c2.choices[0].text === text1, `greedy is not repeatable: ${JSON.stringify(c2.choices[0].text)} vs ${JSON.stringify(text1)}`);
    check(c2.id !== c1.id, 'two completions share an id');

    step('completions, streaming (with include_usage)');
    const s1 = await collectCompletionStream(await client.completions.create({ ...creq, stream: true, stream_options: { include_usage: true } }));
    check(s1.chunks > 1, `only ${s1.chunks} streamed chunk(s)`);
    check(s1.text === text1, `the streamed text differs from the non-streamed one:\n  ${JSON.stringify(s1.text)}\n  ${JSON.stringify(text1)}`);
    check(s1.finish === c1.choices[0].finish_reason, `streamed finish_reason ${s1.finish}, non-streamed ${c1.choices[0].finish_reason}`);
    checkUsage(s1.usage, 'streamed completion', 24);
    check(JSON.stringify(s1.usage) === JSON.stringify(c1.usage), `streamed usage ${JSON.stringify(s1.usage)} differs from ${JSON.stringify(c1.usage)}`);
    const s1b = await collectCompletionStream(await client.completions.create({ ...creq, stream: true }));
    check(s1b.usage === null, 'usage streamed without stream_options.include_usage');
    check(s1b.text === text1, 'the second stream differs');

    step('sampling: the same seed repeats, top_p works');
    const sreq = { model: modelId, prompt: 'Lily went to the park', max_tokens: 20, temperature: 1.0, top_p: 0.9, seed: 42 };
    const r1 = await client.completions.create(sreq);
    const r2 = await client.completions.create(sreq);
    check(r1.choices[0].text === r2.choices[0].text, 'the same seed gave different text');
    checkUsage(r1.usage, 'sampled completion', 20);

    step('stop strings');
    const st = await client.completions.create({ model: modelId, prompt: 'Once upon a time', max_tokens: 60, temperature: 0, stop: ['.'] });
    check(!st.choices[0].text.includes('.'), `the text goes past the stop string: ${JSON.stringify(st.choices[0].text)}`);
    check(st.choices[0].finish_reason === 'stop', `finish_reason after a stop string: ${st.choices[0].finish_reason}`);
    check(text1.startsWith(st.choices[0].text), `the stopped text is not a prefix of the greedy text: ${JSON.stringify(st.choices[0].text)}`);
    checkUsage(st.usage, 'stopped completion', 60);

    step('JSON mode (completions): every output that stopped parses');
    let stopped = 0;
    let runs = 0;
    for (const temperature of [0, 0.7, 1.0]) {
      for (const seed of temperature === 0 ? [1] : [1, 2, 3, 4]) {
        const j = await client.completions.create({
          model: modelId, prompt: 'Once upon a time', max_tokens: 80, temperature, seed, response_format: { type: 'json_object' },
        });
        runs++;
        const t = j.choices[0].text;
        checkUsage(j.usage, 'JSON completion', 80);
        checkFinish(j.choices[0], j.usage, 80, 'JSON completion');
        if (j.choices[0].finish_reason === 'stop') {
          stopped++;
          try { JSON.parse(t); } catch (e) { fail(`JSON mode (temperature ${temperature}, seed ${seed}) stopped with text that is not JSON (${e.message}): ${JSON.stringify(t)}`); }
        } else {
          check(t.trimStart().startsWith('{'), `JSON mode output does not start with '{': ${JSON.stringify(t)}`);
        }
      }
    }
    console.log(`   ${stopped} of ${runs} JSON runs stopped and parsed`);
    check(stopped > 0, `none of the ${runs} JSON-mode runs finished with 'stop' within 80 tokens`);

    // ---- errors ----
    step('bad requests');
    await expectApiError(OpenAI, 'temperature: "hot"', 400,
      () => client.completions.create({ model: modelId, prompt: 'Once', temperature: 'hot' }), { param: 'temperature' });
    await expectApiError(OpenAI, 'chat without messages', 400,
      () => client.chat.completions.create({ model: modelId }), { param: 'messages' });
    await expectApiError(OpenAI, 'n: 2', 400,
      () => client.completions.create({ model: modelId, prompt: 'Once', n: 2 }));
    await expectApiError(OpenAI, 'an unknown model', 404,
      () => client.completions.create({ model: 'nobody/no-such-model', prompt: 'Once', max_tokens: 4 }));
    await expectApiError(OpenAI, 'a prompt longer than the context', 400,
      () => client.completions.create({ model: modelId, prompt: 'Once upon a time '.repeat(300), max_tokens: 4 }));
    await expectApiError(OpenAI, 'chat on a model without a chat template', 400,
      () => client.chat.completions.create({ model: modelId, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4 }),
      { messageHas: /template/i });
    // A body that is not JSON: the client cannot send one, so plain fetch.
    const bad = await fetch(base + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{"prompt": "Once",' });
    const badBody = await bad.json().catch(() => null);
    check(bad.status === 400, `a body that is not JSON answered ${bad.status}`);
    check(badBody && badBody.error && typeof badBody.error.message === 'string' && badBody.error.type === 'invalid_request_error',
      `a body that is not JSON: the error is not in OpenAI's shape: ${JSON.stringify(badBody)}`);

    // ---- chat, on a copy of the model with a chat template ----
    step('load a copy of stories260K with a chat template');
    const chatModel = path.join(tmp, 'stories260K-chat');
    copyModelWithTemplate(stories, chatModel);
    const load = await postJSON(base + '/api/load', { model: chatModel }, secret);
    check(load.status === 200, `POST /api/load of the chat copy answered ${load.status}: ${load.text}`);
    check(load.json.model && load.json.model.has_chat_template === true, `the loaded copy has no chat template: ${load.text.slice(0, 400)}`);
    const chatId = (await client.models.list()).data[0].id;
    console.log(`   model id: ${chatId}`);
    const messages = [{ role: 'system', content: 'You tell short stories.' }, { role: 'user', content: 'Tell me about a cat.' }];

    const applied = await postJSON(base + '/apply-template', { messages, add_generation_prompt: true });
    check(applied.status === 200 && typeof applied.json.prompt === 'string', `POST /apply-template answered ${applied.status}: ${applied.text}`);
    const expectedPrompt = '<s><|system|>\nYou tell short stories.\n<|user|>\nTell me about a cat.\n<|assistant|>\n';
    check(applied.json.prompt === expectedPrompt, `the template rendered ${JSON.stringify(applied.json.prompt)}, expected ${JSON.stringify(expectedPrompt)}`);

    step('chat completions, not streaming (greedy)');
    const chreq = { model: chatId, messages, max_tokens: 24, temperature: 0 };
    const ch1 = await client.chat.completions.create(chreq);
    check(ch1.object === 'chat.completion', `object is ${ch1.object}`);
    check(typeof ch1.id === 'string' && ch1.id.startsWith('chatcmpl-'), `id is ${ch1.id}`);
    check(ch1.model === chatId, `model is ${ch1.model}`);
    const msg = ch1.choices[0].message;
    check(msg && msg.role === 'assistant' && typeof msg.content === 'string' && msg.content.length > 0, `message: ${JSON.stringify(msg)}`);
    checkUsage(ch1.usage, 'chat', 24);
    checkFinish(ch1.choices[0], ch1.usage, 24, 'chat');
    console.log(`   ${JSON.stringify(msg.content)} (${ch1.choices[0].finish_reason}, ${JSON.stringify(ch1.usage)})`);
    // The chat turn is the completion of the rendered prompt (whose BOS the completion adds).
    const viaCompletion = await client.completions.create({ model: chatId, prompt: expectedPrompt.slice('<s>'.length), max_tokens: 24, temperature: 0 });
    check(viaCompletion.usage.prompt_tokens === ch1.usage.prompt_tokens,
      `chat counted ${ch1.usage.prompt_tokens} prompt tokens, the completion of the rendered prompt ${viaCompletion.usage.prompt_tokens}`);
    check(viaCompletion.choices[0].text === msg.content, `chat and the completion of its rendered prompt differ:\n  ${JSON.stringify(msg.content)}\n  ${JSON.stringify(viaCompletion.choices[0].text)}`);

    step('chat completions, streaming');
    const cs = await collectChatStream(await client.chat.completions.create({ ...chreq, stream: true, stream_options: { include_usage: true } }));
    check(cs.firstRole === 'assistant', `the first chat chunk has delta.role ${JSON.stringify(cs.firstRole)}`);
    check(cs.chunks > 2, `only ${cs.chunks} chat chunk(s)`);
    check(cs.text === msg.content, `streamed chat differs:\n  ${JSON.stringify(cs.text)}\n  ${JSON.stringify(msg.content)}`);
    check(cs.finish === ch1.choices[0].finish_reason, `streamed finish_reason ${cs.finish}`);
    checkUsage(cs.usage, 'streamed chat', 24);
    check(JSON.stringify(cs.usage) === JSON.stringify(ch1.usage), `streamed chat usage ${JSON.stringify(cs.usage)} vs ${JSON.stringify(ch1.usage)}`);

    step('chat: max_completion_tokens, and JSON mode');
    const mct = await client.chat.completions.create({ model: chatId, messages, max_completion_tokens: 3, temperature: 0 });
    check(mct.usage.completion_tokens <= 3, `max_completion_tokens 3 gave ${mct.usage.completion_tokens} tokens`);
    let chatStopped = 0;
    for (const seed of [1, 2, 3]) {
      const j = await client.chat.completions.create({ model: chatId, messages, max_tokens: 80, temperature: 0.8, seed, response_format: { type: 'json_object' } });
      checkUsage(j.usage, 'chat JSON', 80);
      const t = j.choices[0].message.content;
      if (j.choices[0].finish_reason === 'stop') {
        chatStopped++;
        try { JSON.parse(t); } catch (e) { fail(`chat JSON mode (seed ${seed}) stopped with text that is not JSON (${e.message}): ${JSON.stringify(t)}`); }
      }
    }
    console.log(`   ${chatStopped} of 3 chat JSON runs stopped and parsed`);
    await expectApiError(OpenAI, 'chat with a message that is not an object', 400,
      () => client.chat.completions.create({ model: chatId, messages: ['hello'] }));

    procs.checkAlive();
    ok = true;
  } finally {
    await procs.stopAll();
    for (const p of procs.list) {
      try { fs.copyFileSync(p.logFile, path.join(E.artifacts, `openai_test-${p.name}.log`)); } catch (_) { /* none */ }
    }
    if (!ok) {
      for (const p of procs.list) console.error(`---- ${p.name} log (tail) ----\n${procs.tail(p.name, 40)}`);
      console.error(`logs kept in ${tmp} and ${E.artifacts}`);
    } else {
      fs.rmSync(tmp, { recursive: true, force: true });
    }
  }
});
