// The engine's C API (apps/wasm/engine.cc) called from JavaScript, as the browser node's page
// will call it: the wasm backend passes its gate, the probe hash equals the native nodes',
// stories260K loaded from files handed over in memory gives x86-64's golden digest on the
// wasm and the scalar backend, bad input is refused with a message, and the tab's key pair
// and fingerprints (daisy::crypt) agree with OpenSSL and with the native fingerprint. Exits
// non-zero on any failure.   node tests/wasm/engine_test.mjs BUILD_DIR
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const build = path.resolve(process.argv[2] || path.join(root, 'build-wasm'));
const modelDir = path.join(root, 'models/stories260K');

// ProbeHash() of the native x86-64 build (`daisychain generate --verbose` prints it as
// "probe hash"; scalar = AVX2 = AVX-512 VNNI), or the one scripts/test-wasm.sh just read from
// a native binary. Change the constant only with a deliberate change of the probe's
// arithmetic (docs/KERNELS.md), never to make one ISA pass.
const kNativeProbeHash = process.env.DAISY_NATIVE_PROBE_HASH || 'a184242e9e21bf00';
// stories260K's digest (src/forward/stories_test.cc, LogitsMatchX86GoldenDigestOnEveryBackend).
const kGoldenDigest = 0x9ca58431df672941n;

const createDaisyEngine = createRequire(import.meta.url)(path.join(build, 'daisy_engine.js'));
// Under node the .wasm is handed over; a page lets the module fetch it beside the .js.
const M = await createDaisyEngine({ wasmBinary: readFileSync(path.join(build, 'daisy_engine.wasm')) });

const str = (ptr) => M.UTF8ToString(ptr);
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
const setBackend = (name) => withCString(name, (p) => str(M._daisy_set_backend(p)));

// An engine holding the named files of the model folder, loaded with `ctx` positions.
function loadEngine(files, ctx) {
  const e = M._daisy_engine_new();
  for (const f of files) {
    const bytes = readFileSync(path.join(modelDir, f));
    const dst = withCString(f, (p) => M._daisy_engine_file(e, p, bytes.length));
    assert.notEqual(dst, 0, str(M._daisy_engine_error(e)));
    M.HEAPU8.set(bytes, dst);  // after the call: the heap may have grown (a new HEAPU8)
  }
  const vocab = M._daisy_engine_load(e, ctx);
  return { e, vocab, error: str(M._daisy_engine_error(e)) };
}

// Logits of tokens at positions first.. (every row when `all`).
function forward(e, vocab, tokens, first, all) {
  const tp = M._malloc(4 * tokens.length);
  const n = all ? tokens.length * vocab : vocab;
  const op = M._malloc(4 * n);
  try {
    M.HEAP32.set(tokens, tp / 4);
    const got = M._daisy_engine_forward(e, tp, tokens.length, first, all ? 1 : 0, op);
    assert.equal(got, n, str(M._daisy_engine_error(e)));
    return new Uint8Array(M.HEAPU8.buffer.slice(op, op + 4 * n));
  } finally {
    M._free(tp);
    M._free(op);
  }
}

// FNV-1a over bytes, 64 bits, as the C++ test computes it.
function fnv(h, bytes) {
  const mask = (1n << 64n) - 1n;
  for (const b of bytes) h = ((h ^ BigInt(b)) * 0x100000001b3n) & mask;
  return h;
}

// The first index of the largest logit (testing::Argmax).
function argmax(bytes) {
  const f = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4);
  let best = 0;
  for (let i = 1; i < f.length; ++i) if (f[i] > f[best]) best = i;
  return best;
}

// The digest of stories_test.cc: teacher-forced logits of the reference ids, then a
// 60-token greedy run from a fixed prompt (its ids and every step's logits).
function storiesDigest() {
  const ref = JSON.parse(readFileSync(path.join(modelDir, 'reference/logits.json'), 'utf8'));
  const files = ['config.json', 'model.safetensors'];
  let h = 0xcbf29ce484222325n;
  const a = loadEngine(files, 512);
  assert.ok(a.vocab > 0, a.error);
  h = fnv(h, forward(a.e, a.vocab, ref.token_ids, 0, true));
  M._daisy_engine_free(a.e);
  const b = loadEngine(files, 512);
  const prompt = [1, 403, 407, 261, 378];
  const ids = [];
  const steps = [];
  let l = forward(b.e, b.vocab, prompt, 0, false);
  let pos = prompt.length;
  for (let i = 0; i < 60; ++i) {
    steps.push(l);
    const next = argmax(l);
    ids.push(next);
    if (i + 1 === 60) break;
    l = forward(b.e, b.vocab, [next], pos++, false);
  }
  M._daisy_engine_free(b.e);
  h = fnv(h, new Uint8Array(Int32Array.from(ids).buffer));
  for (const s of steps) h = fnv(h, s);
  return h;
}

let failures = 0;
function check(name, fn) {
  try {
    fn();
    console.log(`ok   ${name}`);
  } catch (err) {
    ++failures;
    console.log(`FAIL ${name}\n${err.stack || err}`);
  }
}

check('the wasm backend is supported and passed its gate', () => {
  const report = JSON.parse(str(M._daisy_backend_report()));
  const wasm = report.find((r) => r.backend === 'wasm');
  assert.ok(wasm && wasm.supported && wasm.gate_passed, JSON.stringify(report));
  assert.equal(report.find((r) => r.backend === 'avx2').supported, false);
  console.log(`     chosen at start-up: ${str(M._daisy_backend_name())}`);
});

check('set_backend forces a backend and refuses what cannot run here', () => {
  assert.equal(setBackend('wasm'), '');
  assert.equal(str(M._daisy_backend_name()), 'wasm');
  assert.match(setBackend('avx2'), /avx2.*not supported/);
  assert.match(setBackend('avx9000'), /'avx9000' is not a backend/);
  assert.equal(str(M._daisy_backend_name()), 'wasm');
});

for (const backend of ['wasm', 'scalar']) {
  check(`probe hash on ${backend} equals the native nodes'`, () => {
    assert.equal(setBackend(backend), '');
    const probe = str(M._daisy_probe_hash());
    console.log(`     probe hash on ${backend}: ${probe}`);
    assert.equal(probe, kNativeProbeHash);
  });
  check(`stories260K from memory gives x86-64's golden digest on ${backend}`, () => {
    assert.equal(setBackend(backend), '');
    const d = storiesDigest();
    console.log(`     stories260K digest on ${backend}: 0x${d.toString(16).padStart(16, '0')}`);
    assert.equal(d, kGoldenDigest);
  });
}

check('a load without the model files is refused, naming what is missing', () => {
  const r = loadEngine([], 64);
  assert.equal(r.vocab, -1);
  assert.match(r.error, /config\.json/);
  M._daisy_engine_free(r.e);
});

check('a forward before any load, and an unsafe file name, are refused', () => {
  const e = M._daisy_engine_new();
  const op = M._malloc(4);
  assert.equal(M._daisy_engine_forward(e, op, 1, 0, 0, op), -1);
  assert.match(str(M._daisy_engine_error(e)), /no model is loaded/);
  assert.equal(withCString('../secret', (p) => M._daisy_engine_file(e, p, 4)), 0);
  assert.match(str(M._daisy_engine_error(e)), /refused/);
  M._free(op);
  M._daisy_engine_free(e);
});

// Z85 (ZeroMQ RFC 32) decoding, for the key checks below.
const kZ85 = '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#';
function z85Decode(s) {
  assert.equal(s.length % 5, 0, `'${s}' is not Z85`);
  const out = Buffer.alloc((s.length / 5) * 4);
  for (let i = 0; i < s.length; i += 5) {
    let v = 0;
    for (let j = 0; j < 5; ++j) {
      const d = kZ85.indexOf(s[i + j]);
      assert.ok(d >= 0, `'${s}' is not Z85`);
      v = v * 85 + d;
    }
    out.writeUInt32BE(v, (i / 5) * 4);
  }
  return out;
}

// The X25519 public key of a raw secret as OpenSSL (node:crypto) computes it: a second,
// independent implementation.
function x25519Public(secret) {
  const pkcs8 = Buffer.concat([Buffer.from('302e020100300506032b656e04220420', 'hex'), secret]);
  const key = crypto.createPrivateKey({ key: pkcs8, format: 'der', type: 'pkcs8' });
  return crypto.createPublicKey(key).export({ format: 'der', type: 'spki' }).subarray(-32);
}

const fingerprint = (z85) => withCString(z85, (p) => str(M._daisy_fingerprint(p)));

check('the fingerprint of a fixed key is the one net::Fingerprint gives natively', () => {
  // RFC 7748's Alice public key; src/crypt/crypt_golden.h holds the same constants, which
  // crypt_test gets from real libsodium and libzmq.
  const alice = 'G=]<>I7>&bBC>O5V{aj/4zK}kco8}o(.HIuS*=:#';
  assert.equal(z85Decode(alice).toString('hex'), '8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a');
  assert.equal(fingerprint(alice), '7a91-869e-4c11-4964');
  assert.equal(fingerprint('not a key'), '');
  assert.equal(fingerprint(alice.slice(0, 39) + ' '), '');
});

check('the tab makes X25519 key pairs whose public key OpenSSL derives from the secret', () => {
  const a = JSON.parse(str(M._daisy_keypair()));
  const b = JSON.parse(str(M._daisy_keypair()));
  for (const k of [a, b]) {
    assert.equal(k.public_key.length, 40);
    assert.equal(k.secret_key.length, 40);
    assert.equal(x25519Public(z85Decode(k.secret_key)).toString('hex'), z85Decode(k.public_key).toString('hex'));
    assert.match(k.fingerprint, /^[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}$/);
    assert.equal(k.fingerprint, fingerprint(k.public_key));
  }
  assert.notEqual(a.secret_key, b.secret_key);
  console.log(`     a new key pair: fingerprint ${a.fingerprint}`);
});

if (failures > 0) {
  console.log(`engine_test: ${failures} check(s) failed`);
  process.exit(1);
}
console.log('engine_test: all passed');
