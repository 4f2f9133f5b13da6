// The room of the chat tests: a copy of stories260K with a chat template (stories260K has
// none), `daisychain serve` with it loaded and turns split over 2 devices, and one node
// run by the test build `daisychain_faulty` with a delay on every hop, so a reply takes
// long enough to be stopped in its middle. Used by chat_api_test.mjs and chat_browser_test.mjs.
import fs from 'node:fs';
import path from 'node:path';
import { freePort, requireFile, waitFor, waitForServe } from './lib.mjs';

// A ChatML-like template (plain text; the tokenizer's byte fallback encodes anything),
// bos_token first as real templates do: the chat prompt is encoded without adding special tokens.
export const CHAT_TEMPLATE =
  "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";
export const HOP_DELAY_MS = 4;

export function copyModelWithTemplate(src, dst) {
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

// Starts serve and the slow node; returns {base, secret, modelDir, openUrl} once the node
// is in the room.
export async function startChatRoom(E, procs, tmp) {
  const faulty = path.join(E.binDir, 'daisychain_faulty');
  requireFile(E.bin, 'the daisychain binary', 'build it first (cmake --build build), or set DAISY_BIN_DIR');
  requireFile(faulty, 'the test build daisychain_faulty', 'build it (cmake --build build --target daisychain_faulty)');
  const stories = path.join(E.models, 'stories260K');
  requireFile(path.join(stories, 'config.json'), 'the bundled model',
    'set DAISY_MODELS to the folder holding stories260K');
  const models = path.join(tmp, 'models');
  const modelDir = path.join(models, 'stories260K-chat');
  copyModelWithTemplate(stories, modelDir);
  const home = (n) => {
    const d = path.join(tmp, n);
    fs.mkdirSync(d, { recursive: true });
    return { DAISY_HOME: d };
  };
  const port = await freePort();
  const room = 'chat' + port;
  const base = `http://127.0.0.1:${port}`;
  const secretFile = path.join(tmp, 'admin-secret');
  procs.start('serve', E.bin, ['serve', '--port', String(port), '--room', room, '--name', 'head', '--auto-approve',
    '--model', modelDir, '--stages', '2', '--admin-secret-file', secretFile], home('serve'));
  const secret = await waitForServe(base, procs, secretFile);
  procs.start('slow-node', faulty, ['node', '--join', `127.0.0.1:${port}`, '--room', room, '--name', 'slow-node',
    '--models-dir', models], { ...home('slow-node'), DAISY_TEST_HOP_DELAY_MS: String(HOP_DELAY_MS) });
  // Only the room is awaited, not the plan preview of /api/state: each turn plans afresh and,
  // asked for 2 stages, waits for the second device itself (the tests check each turn's stages).
  await waitFor('the slow node to join and the chat model to be loaded', async () => {
    const res = await fetch(`${base}/api/state`, { headers: { Cookie: `daisy_admin=${secret}` } });
    const s = await res.json();
    const joined = s.devices.some((d) => d.name === 'slow-node' && d.status === 'approved');
    return s.model && s.model.has_chat_template && joined;
  }, { timeoutMs: 45000, procs, intervalMs: 250 });
  return { base, secret, modelDir, openUrl: `${base}/?token=${secret}` };
}

// POST /api/chat from a script: the parsed events, or {status, error} for a refused request.
// onToken(count, controller) may abort the request (Stop).
export async function chatTurn(base, secret, body, { onToken, timeoutMs = 90000 } = {}) {
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(new Error('timeout')), timeoutMs);
  try {
    const res = await fetch(`${base}/api/chat`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Cookie: `daisy_admin=${secret}` },
      body: JSON.stringify(body),
      signal: ctrl.signal,
    });
    if (!res.ok || !(res.headers.get('content-type') || '').startsWith('text/event-stream')) {
      const text = await res.text();
      let json = null;
      try { json = JSON.parse(text); } catch (_) { /* not JSON */ }
      return { status: res.status, error: json && json.error, text };
    }
    const events = [];
    let tokens = 0;
    let buf = '';
    const decoder = new TextDecoder();
    try {
      for await (const chunk of res.body) {
        buf += decoder.decode(chunk, { stream: true });
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, k);
          buf = buf.slice(k + 2);
          let name = 'message';
          const data = [];
          for (const line of block.split('\n')) {
            if (line.startsWith('event: ')) name = line.slice(7);
            else if (line.startsWith('data: ')) data.push(line.slice(6));
          }
          if (!data.length) continue;
          const ev = { name, data: JSON.parse(data.join('\n')) };
          events.push(ev);
          if (name === 'token' && ev.data.id !== null) {
            tokens++;
            if (onToken) onToken(tokens, ctrl);
          }
        }
      }
    } catch (e) {
      if (!ctrl.signal.aborted || String(ctrl.signal.reason) === 'Error: timeout') throw e;
      return { status: res.status, events, tokens, aborted: true };
    }
    const done = events.find((e) => e.name === 'done');
    const error = events.find((e) => e.name === 'error');
    return { status: res.status, events, tokens, done: done && done.data, streamError: error && error.data };
  } finally {
    clearTimeout(timer);
  }
}
