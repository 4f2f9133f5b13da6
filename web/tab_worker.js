// The join page's Web Worker: the browser node's wasm module (daisy_engine.js/.wasm, built
// into serve's binary) with its crypto and compute, off the page's main thread. The page
// (join.js) holds the WebSocket link and passes its bytes through; nothing here touches the
// DOM or the page's storage.
//
// Messages, page -> worker:
//   {type: 'init'}                             load the module
//   {type: 'keys', saved}                      the key pair `saved` ({public_key, secret_key}
//                                              in Z85, from the page's storage), or a new one
//                                              when it is null or not a key
//   {type: 'start', secret_key, server_key, room, name, hub_endpoint, device_bytes}
//                                              run the ring member (device_bytes: what
//                                              navigator.deviceMemory says, 0: unknown)
//   {type: 'link', state: 'open'|'closed', code, reason}
//   {type: 'recv', data: ArrayBuffer}          one binary message from the link
//   {type: 'token', token} / {type: 'forget-token'}   the Hub token, held here in memory only;
//                                              the member's next Hub read uses it (or none)
//   {type: 'leave'}                            send Bye, then answer 'left' (the link stays open)
//   {type: 'rejoin'}                           join the room again over the same link
// worker -> page:
//   {type: 'engine', backend, probe_hash}      the module runs; its backend and probe hash
//   {type: 'keys', public_key, secret_key, id, fingerprint}
//   {type: 'send', data: ArrayBuffer}          one binary message for the link
//   {type: 'event', event: {kind, ...}}        status {line, level}, slice {first, end,
//                                              n_layers, model}, progress {done, total},
//                                              probe {state, hash, ring_hash}, text {head_id,
//                                              head, stream, part, index, text},
//                                              budget {bytes}, hub_unauthorized {status:
//                                              401 no token, 403 token refused}, error {message}
//   {type: 'started'}                          the ring member runs: open the link
//   {type: 'close', code, reason}              close the link (the member refused a message)
//   {type: 'left'}
//   {type: 'token', held}                      whether the worker holds a Hub token now
//   {type: 'fatal', message}                   the module cannot run here
'use strict';

let M = null;  // the module
let hubToken = '';

const event = (e) => postMessage({ type: 'event', event: e });
const fatal = (message) => postMessage({ type: 'fatal', message });

function str(ptr) { return M.UTF8ToString(ptr); }

function withCString(s, fn) {
  const n = M.lengthBytesUTF8(s) + 1;
  const p = M._malloc(n);
  try {
    M.stringToUTF8(s, p, n);
    return fn(p);
  } finally {
    M._free(p);
  }
}

async function init() {
  try {
    importScripts('/daisy_engine.js');
  } catch (e) {
    return fatal('Cannot load the browser node\'s module from serve (' + (e && e.message ? e.message : e) + ').');
  }
  try {
    // The .wasm is fetched beside the .js (serve sends it as application/wasm).
    M = await self.createDaisyEngine();
  } catch (e) {
    return fatal('This browser cannot run the browser node\'s WebAssembly module (' +
                 (e && e.message ? e.message : e) + '); it needs WebAssembly with SIMD128 (Chrome 91, Firefox 89, ' +
                 'Safari 16.4 or later).');
  }
  postMessage({ type: 'engine', backend: str(M._daisy_backend_name()), probe_hash: str(M._daisy_probe_hash()) });
}

// The key pair from the module's crypto (X25519 as libsodium's crypto_box; the fingerprint
// from BLAKE2b as the native nodes make it): the stored one when it is a key, else a new one.
function keys(saved) {
  if (typeof M._daisy_keypair !== 'function' || typeof M._daisy_fingerprint !== 'function')
    return fatal('This build of the browser node cannot make keys (its module has no daisy_keypair).');
  let k = null;
  if (saved && typeof saved.public_key === 'string' && typeof saved.secret_key === 'string') {
    const fingerprint = withCString(saved.public_key, (p) => str(M._daisy_fingerprint(p)));
    if (fingerprint && /^[0-9A-Za-z.\-:+=^!/*?&<>()[\]{}@%$#]{40}$/.test(saved.secret_key))
      k = { public_key: saved.public_key, secret_key: saved.secret_key, fingerprint };
  }
  if (!k) {
    try {
      k = JSON.parse(str(M._daisy_keypair()));
    } catch (e) {
      return fatal('The browser node could not make a key pair (' + (e && e.message ? e.message : e) + ').');
    }
  }
  postMessage({ type: 'keys', public_key: k.public_key, secret_key: k.secret_key, fingerprint: k.fingerprint,
                id: k.fingerprint.replaceAll('-', '') });
}

// ---- the ring member (daisy_tab.js, createDaisyTab: apps/wasm/tab_api.cc) ----
let T = null;       // its module, when this build has one
let tab = 0;        // the DaisyTab handle of the current link
let member = null;  // what 'start' gave: secret key, server key, room, name, Hub endpoint, budget
let ticker = 0;
let myProbe = '';

function tstr(ptr) { return T.UTF8ToString(ptr); }

// Calls fn with each string of `list` as a C string of T's heap (overwritten before it is
// freed: one of them may be the Hub token).
function withTStrings(list, fn) {
  const bufs = list.map((s) => {
    const n = T.lengthBytesUTF8(s) + 1;
    const p = T._malloc(n);
    T.stringToUTF8(s, p, n);
    return [p, n];
  });
  try {
    return fn(...bufs.map((b) => b[0]));
  } finally {
    for (const [p, n] of bufs) {
      T.HEAPU8.fill(0, p, p + n);
      T._free(p);
    }
  }
}

// A new member for a new link (a link that closed cannot be resumed: the tab links again).
function newTab() {
  if (tab) T._daisy_tab_free(tab);
  const m = member;
  tab = withTStrings([m.secret_key, m.server_key, m.room, m.name, m.hub_endpoint, hubToken],
                     (sec, key, room, name, hub, token) =>
                       T._daisy_tab_new(sec, key, room, name, m.budget, hub, token));
  if (!tab) event({ kind: 'error', message: 'The ring member cannot start: ' + tstr(T._daisy_tab_new_error()) });
}

// The Hub's refusal in a line of the member (xhr_source.cc words it, never quoting the token):
// 401, no token or none accepted; 403, the token given has no access.
// The line names the file read as REPO@COMMIT/FILE.
const kTokenWanted = /(?:([\w.-]+\/[\w.-]+)@[\w.-]+\/\S*: )?HTTP (40[13]) \(a gated or private repo/;
function hubRefused(line) {
  const m = kTokenWanted.exec(line || '');
  if (m) event({ kind: 'hub_unauthorized', status: Number(m[2]), repo: m[1] || '', token_held: hubToken !== '' });
}

// Sends what the member has for the link and passes its events on, as join.js shows them.
function flush() {
  if (!tab) return;
  const sizeP = T._malloc(4);
  try {
    for (let i = 0; i < 10000; i++) {  // bounded: the member queues a few messages at a time
      const p = T._daisy_tab_take_outgoing(tab, sizeP);
      if (!p) break;
      const data = T.HEAPU8.slice(p, p + T.HEAPU32[sizeP >> 2]).buffer;
      postMessage({ type: 'send', data }, [data]);
    }
  } finally {
    T._free(sizeP);
  }
  let events = [];
  try {
    events = JSON.parse(tstr(T._daisy_tab_events(tab)));
  } catch (_) {
    return;
  }
  for (const e of events) {
    switch (e.event) {
      case 'hello':
        myProbe = e.probe_hash;
        postMessage({ type: 'engine', backend: e.backend, probe_hash: e.probe_hash, member: true });
        break;
      case 'status':
        event({ kind: 'status', state: e.state, line: e.line });
        break;
      case 'log':
        event({ kind: 'status', line: e.line, level: e.level === 'warning' ? 'warn' : '' });
        hubRefused(e.line);
        break;
      case 'peers': {
        const head = (e.members || []).find((x) => x.head);
        if (head && myProbe)
          event({ kind: 'probe', state: head.probe_hash === myProbe ? 'ok' : 'differs', hash: myProbe,
                  ring_hash: head.probe_hash });
        break;
      }
      case 'slice':
        event({ kind: 'slice', first: e.first, end: e.end, model: e.model, bytes: e.bytes });
        break;
      case 'progress':
        event({ kind: 'progress', done: e.done, total: e.total });
        break;
      case 'text':
        // `part`: begin, piece, retract, end, failed (`kind` names the page's event).
        event({ kind: 'text', head_id: e.head_id, head: e.head_name, stream: e.stream, part: e.kind, index: e.index,
                text: e.text });
        break;
      case 'error':
        event({ kind: 'error', message: e.message });
        hubRefused(e.message);
        break;
      default:
        break;
    }
  }
}

// The ring member: answers 'started' when it runs, then the page opens the link.
async function start(m) {
  if (!T) {
    try {
      importScripts('/daisy_tab.js');
      T = await self.createDaisyTab();
    } catch (e) {
      return event({ kind: 'error', message: 'This build of the browser node holds no layers: its module has no ' +
                     'ring member (' + (e && e.message ? e.message : e) + ').' });
    }
  }
  // The memory this member may offer: wasm32 addresses 4 GiB at most, of which the module already
  // holds its heap; and no more than the device has, when the browser says.
  const kWasm32 = 4 * 1024 * 1024 * 1024;
  let budget = kWasm32 - T.HEAPU8.buffer.byteLength;
  if (m.device_bytes > 0) budget = Math.min(budget, m.device_bytes);
  member = Object.assign({}, m, { budget: Math.max(0, budget) });
  event({ kind: 'budget', bytes: member.budget });
  if (!ticker) ticker = setInterval(() => { if (tab) { T._daisy_tab_tick(tab); flush(); } }, 250);
  postMessage({ type: 'started' });
}

function receive(data) {
  if (!tab) return;
  const bytes = new Uint8Array(data);
  const p = T._malloc(Math.max(1, bytes.length));
  T.HEAPU8.set(bytes, p);
  const rc = T._daisy_tab_receive(tab, p, bytes.length);
  T._free(p);
  flush();
  if (rc < 0) postMessage({ type: 'close', code: 4001, reason: tstr(T._daisy_tab_error(tab)).slice(0, 120) });
}

onmessage = async (ev) => {
  const m = ev.data || {};
  switch (m.type) {
    case 'init':
      await init();
      break;
    case 'keys':
      if (M) keys(m.saved);
      break;
    case 'start':
      if (M) await start(m);
      break;
    case 'link':
      if (m.state === 'open' && member) newTab();
      if (m.state === 'closed' && tab) {
        T._daisy_tab_free(tab);
        tab = 0;
      }
      break;
    case 'recv':
      receive(m.data);
      break;
    case 'token':
    case 'forget-token':
      // The member reads with it from its next Hub request on: no new link, the room and the
      // slice held are kept. Forgotten: overwritten in the module, dropped here.
      hubToken = m.type === 'token' ? String(m.token || '') : '';
      if (tab) withTStrings([hubToken], (p) => T._daisy_tab_set_token(tab, p));
      postMessage({ type: 'token', held: hubToken !== '' });
      break;
    case 'leave':
      if (tab) {
        T._daisy_tab_leave(tab);
        flush();
      }
      postMessage({ type: 'left' });
      break;
    case 'rejoin':
      if (tab) {
        T._daisy_tab_rejoin(tab);
        flush();
      }
      break;
    default:
      break;
  }
};
