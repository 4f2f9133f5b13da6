// crypt: our own implementation of the few primitives of libsodium and ZeroMQ the project
// uses (X25519, crypto_box = XSalsa20-Poly1305, BLAKE2b, Z85), for the WebAssembly build,
// where Debian has neither library. Same semantics, return values and bytes as libsodium
// 1.0.18 and libzmq 4.3 (src/crypt/crypt_test.cc compares them on fixed and random cases).
// The native build keeps using real libsodium/libzmq everywhere else; the names here live
// in daisy::crypt so both can be linked into one binary. src/crypt/shim/sodium.h and zmq.h
// map the C names onto these for the wasm build (docs/ARCHITECTURE.md, "crypt").
//
// Thread-safe: every function is a pure function of its arguments, but RandomBytes (the
// operating system's generator) and Init (an atomic flag). Secret-dependent work is
// constant-time: the X25519 ladder swaps by masks, tags are compared without early exit.
// Misuse libsodium aborts on (a null key with a length, a message over 2^64 bytes) returns
// -1 here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace daisy::crypt {

inline constexpr size_t kScalarMultBytes = 32;  // crypto_scalarmult_BYTES
inline constexpr size_t kScalarBytes = 32;      // crypto_scalarmult_SCALARBYTES
inline constexpr size_t kBoxPublicKeyBytes = 32;
inline constexpr size_t kBoxSecretKeyBytes = 32;
inline constexpr size_t kBoxBeforeNmBytes = 32;
inline constexpr size_t kBoxNonceBytes = 24;
inline constexpr size_t kBoxMacBytes = 16;
inline constexpr size_t kGenericHashBytes = 32;
inline constexpr size_t kGenericHashBytesMin = 16;
inline constexpr size_t kGenericHashBytesMax = 64;
inline constexpr size_t kGenericHashKeyBytes = 32;
inline constexpr size_t kGenericHashKeyBytesMin = 16;
inline constexpr size_t kGenericHashKeyBytesMax = 64;
inline constexpr size_t kOneTimeAuthBytes = 16;
inline constexpr size_t kOneTimeAuthKeyBytes = 32;
inline constexpr size_t kHSalsa20OutputBytes = 32;
inline constexpr size_t kHSalsa20InputBytes = 16;
inline constexpr size_t kHSalsa20KeyBytes = 32;
inline constexpr size_t kXSalsa20NonceBytes = 24;
inline constexpr size_t kXSalsa20KeyBytes = 32;

// sodium_init: 0 the first time, 1 after (nothing to set up; kept for the callers' sake).
int Init();

// randombytes_buf: `size` bytes from the operating system (getrandom(); in a browser or
// node.js, crypto.getRandomValues, which plain-HTTP pages have too). Aborts with a message
// when there is no generator: a key from anything weaker would be worse than none.
void RandomBytes(void* buf, size_t size);

// sodium_memzero: zeroes `size` bytes, not optimized away.
void MemZero(void* pnt, size_t size);

// sodium_memcmp: 0 when equal, -1 otherwise, in time independent of the bytes.
int MemCmp(const void* a, const void* b, size_t size);

// crypto_scalarmult_base / crypto_scalarmult (X25519, RFC 7748). ScalarMult returns -1,
// like libsodium, when the result is all zeros (a point of small order).
int ScalarMultBase(unsigned char* q, const unsigned char* n);
int ScalarMult(unsigned char* q, const unsigned char* n, const unsigned char* p);

// crypto_core_hsalsa20 with the "expand 32-byte k" constants; crypto_stream_xsalsa20_xor;
// crypto_onetimeauth_poly1305 (RFC 8439) and its verify (0 or -1, constant-time).
void CoreHSalsa20(unsigned char* out, const unsigned char* in, const unsigned char* k);
void StreamXSalsa20Xor(unsigned char* c, const unsigned char* m, unsigned long long mlen, const unsigned char* n,
                       const unsigned char* k);
void OneTimeAuth(unsigned char* tag, const unsigned char* m, unsigned long long mlen, const unsigned char* k);
int OneTimeAuthVerify(const unsigned char* tag, const unsigned char* m, unsigned long long mlen,
                      const unsigned char* k);

// crypto_box_* (X25519 + XSalsa20-Poly1305), "easy" layout: c = MAC (16) | ciphertext.
// BeforeNm returns -1 for a public key of small order. The opens return -1, writing
// nothing, when the box does not open. c and m may overlap, as libsodium allows.
int BoxKeypair(unsigned char* pk, unsigned char* sk);
int BoxBeforeNm(unsigned char* k, const unsigned char* pk, const unsigned char* sk);
int BoxEasyAfterNm(unsigned char* c, const unsigned char* m, unsigned long long mlen, const unsigned char* n,
                   const unsigned char* k);
int BoxOpenEasyAfterNm(unsigned char* m, const unsigned char* c, unsigned long long clen, const unsigned char* n,
                       const unsigned char* k);
int BoxEasy(unsigned char* c, const unsigned char* m, unsigned long long mlen, const unsigned char* n,
            const unsigned char* pk, const unsigned char* sk);
int BoxOpenEasy(unsigned char* m, const unsigned char* c, unsigned long long clen, const unsigned char* n,
                const unsigned char* pk, const unsigned char* sk);

// crypto_generichash (BLAKE2b, RFC 7693): outlen 1..64, key 0..64 bytes (null or 0: no
// key); -1 otherwise. The streaming form: Init, Update..., Final once (-1 after).
struct GenericHashState {
  uint64_t h[8];
  uint64_t t[2];           // bytes compressed so far (128-bit counter)
  unsigned char buf[128];  // the block held back: the last one is compressed by Final
  size_t buf_len;
  bool finalized;
};
int GenericHash(unsigned char* out, size_t outlen, const unsigned char* in, unsigned long long inlen,
                const unsigned char* key, size_t keylen);
int GenericHashInit(GenericHashState* state, const unsigned char* key, size_t keylen, size_t outlen);
int GenericHashUpdate(GenericHashState* state, const unsigned char* in, unsigned long long inlen);
int GenericHashFinal(GenericHashState* state, unsigned char* out, size_t outlen);

// zmq_z85_encode: `size` (a multiple of 4) bytes as size * 5 / 4 characters and a NUL;
// returns dest, or null (errno EINVAL) for another size.
char* Z85Encode(char* dest, const uint8_t* data, size_t size);
// zmq_z85_decode: a string of 5k characters (k >= 1) into 4k bytes; returns dest, or null
// (errno EINVAL, nothing written) for another length, a character outside Z85's alphabet
// or a group over 2^32 - 1.
uint8_t* Z85Decode(uint8_t* dest, const char* string);
// zmq_curve_public: the Z85 public key (40 characters and a NUL) of a Z85 secret key; 0,
// or -1 (errno EINVAL) when the secret is not 40 Z85 characters.
int CurvePublic(char* z85_public_key, const char* z85_secret_key);
// zmq_curve_keypair: a new key pair, both Z85 (41 bytes each with the NUL). Returns 0.
int CurveKeypair(char* z85_public_key, char* z85_secret_key);

}  // namespace daisy::crypt
