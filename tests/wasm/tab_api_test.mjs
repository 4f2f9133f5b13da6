// The tab's JavaScript API (apps/wasm/tab_api.cc, the module createDaisyTab) under node.js,
// as the page's worker calls it: a new key pair, or the one of a stored secret (the same
// public key and id again); the hello event with the probe hash the native nodes give; a
// link message that is not serve's first refused with a clear error; events as JSON; and
// the link's first steps against serve's side of the handshake written here in JavaScript
// as far as it goes without a box (the answer's magic, version and key). The full handshake
// and a hop through the tab bit for bit run in tab_test (C++, native and under node.js).
// Exits non-zero on any failure.   node tests/wasm/tab_api_test.mjs BUILD_DIR
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const build = path.resolve(process.argv[2] || path.join(root, 'build-wasm'));
const kNativeProbeHash = process.env.DAISY_NATIVE_PROBE_HASH || 'a184242e9e21bf00';

const createDaisyTab = createRequire(import.meta.url)(path.join(build, 'daisy_tab.js'));
const M = await createDaisyTab({ wasmBinary: readFileSync(path.join(build, 'daisy_tab.wasm')) });

const str = (ptr) => M.UTF8ToString(ptr);
function cstr(s) {
  const n = M.lengthBytesUTF8(s) + 1;
  const p = M._malloc(n);
  M.stringToUTF8(s, p, n);
  return p;
}
function newTab(secret, serverKey = '') {
  const args = [secret, serverKey, 'room1', 'tab-js'].map(cstr);
  const hub = cstr('');
  const t = M._daisy_tab_new(...args, 1 << 30, hub, hub);
  for (const p of [...args, hub]) M._free(p);
  return t;
}
function events(t) {
  return JSON.parse(str(M._daisy_tab_events(t)));
}
function receive(t, bytes) {
  const p = M._malloc(bytes.length);
  M.HEAPU8.set(bytes, p);
  const rc = M._daisy_tab_receive(t, p, bytes.length);
  M._free(p);
  return rc;
}
function takeOutgoing(t) {
  const out = [];
  const sizeP = M._malloc(4);
  for (let i = 0; i < 100; ++i) {
    const p = M._daisy_tab_take_outgoing(t, sizeP);
    if (p === 0) break;
    const n = M.HEAPU32[sizeP / 4];
    out.push(Uint8Array.from(M.HEAPU8.subarray(p, p + n)));
  }
  M._free(sizeP);
  return out;
}

// A new tab: its keys, its hello (probe hash as the native nodes give it), status "linking".
const a = newTab('');
assert.notEqual(a, 0, str(M._daisy_tab_new_error()));
const pub = str(M._daisy_tab_public_key(a));
const secret = str(M._daisy_tab_secret_key(a));
const id = str(M._daisy_tab_id(a));
assert.equal(pub.length, 40);
assert.equal(secret.length, 40);
assert.match(id, /^[0-9a-f]{16}$/);
const ev = events(a);
const hello = ev.find((e) => e.event === 'hello');
assert.ok(hello, JSON.stringify(ev));
assert.equal(hello.probe_hash, kNativeProbeHash);
assert.equal(hello.id, id);
assert.equal(hello.name, 'tab-js');
assert.ok(ev.some((e) => e.event === 'status' && e.state === 'linking'), JSON.stringify(ev));
assert.deepEqual(events(a), []);  // taken once

// The same secret from the page's storage: the same public key and device id.
const b = newTab(secret);
assert.notEqual(b, 0, str(M._daisy_tab_new_error()));
assert.equal(str(M._daisy_tab_public_key(b)), pub);
assert.equal(str(M._daisy_tab_id(b)), id);
// A stored secret that is not Z85 is refused with a message, and no tab is made.
assert.equal(newTab('not a key'), 0);
assert.match(str(M._daisy_tab_new_error()), /secret key must be 40 characters of Z85/);

// serve's first message (DCL1, version 1, its key in Z85, a 32-byte challenge): the tab
// answers with the magic, the version, its own key and one envelope.
const serveKey = str(M._daisy_tab_public_key(newTab('')));  // any CURVE key will do for the answer
const first = new Uint8Array([...Buffer.from('DCL1'), 1, ...Buffer.from(serveKey), ...randomBytes(32)]);
assert.equal(receive(a, first), 0, str(M._daisy_tab_error(a)));
const out = takeOutgoing(a);
assert.equal(out.length, 1);
assert.equal(Buffer.from(out[0].subarray(0, 4)).toString(), 'DCL1');
assert.equal(out[0][4], 1);
assert.equal(Buffer.from(out[0].subarray(5, 45)).toString(), pub);
assert.ok(out[0].length > 45 + 16 + 64);  // an envelope around both challenges
// A proof that is not an envelope from serve: refused, the page must close the link.
assert.equal(receive(a, new Uint8Array([1, 2, 3])), -1);
assert.match(str(M._daisy_tab_error(a)), /link proof/);

// A first message of another version, or with the wrong key for this serve: refused.
const c = newTab('', pub);
const v2 = Uint8Array.from(first);
v2[4] = 2;
assert.equal(receive(c, v2), -1);
assert.match(str(M._daisy_tab_error(c)), /version 2/);
assert.equal(receive(c, first), -1);  // serveKey is not `pub`, the key this tab was shown
assert.match(str(M._daisy_tab_error(c)), /is not the key/);
assert.ok(events(c).some((e) => e.event === 'error'));

for (const t of [a, b, c]) M._daisy_tab_free(t);
console.log('tab_api_test: ok');
