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
//   {type: 'start', server_key, room, name, hub_endpoint, budget}
//                                              run the ring member
//   {type: 'link', state: 'open'|'closed', code, reason}
//   {type: 'recv', data: ArrayBuffer}          one binary message from the link
//   {type: 'token', token} / {type: 'forget-token'}   the Hub token, held here in memory only
//   {type: 'leave'}                            send Bye, then answer 'left'
// worker -> page:
//   {type: 'engine', backend, probe_hash}      the module runs; its backend and probe hash
//   {type: 'keys', public_key, secret_key, id, fingerprint}
//   {type: 'send', data: ArrayBuffer}          one binary message for the link
//   {type: 'event', event: {kind, ...}}        status {line, level}, slice {first, end,
//                                              n_layers, model}, progress {done, total},
//                                              probe {state, hash, ring_hash}, text {head_id,
//                                              head, stream, kind, index, text},
//                                              hub_unauthorized {repo}, error {message}
//   {type: 'started'}                          the ring member runs: open the link
//   {type: 'left'}
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

// The ring member: answers 'started' when it runs, then the page opens the link.
function start() {
  event({ kind: 'error', message: 'This build of the browser node holds no layers: its module has no ring member.' });
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
      if (M) start(m);
      break;
    case 'token':
      hubToken = String(m.token || '');
      break;
    case 'forget-token':
      hubToken = '';
      break;
    case 'leave':
      postMessage({ type: 'left' });
      break;
    default:
      break;
  }
};
