// <sodium.h> for the wasm build, which has no libsodium: the subset daisy::crypt implements
// (include/daisy/crypt.h), under libsodium's names, so that code written against libsodium
// compiles unchanged. Nothing else of libsodium is declared: a call to it fails to compile.
// The native build never puts this folder on an include path (it links real libsodium);
// crypt_shim_test includes it by path.
#pragma once

#include <cstddef>

#include "daisy/crypt.h"

#define crypto_scalarmult_BYTES 32U
#define crypto_scalarmult_SCALARBYTES 32U
#define crypto_box_PUBLICKEYBYTES 32U
#define crypto_box_SECRETKEYBYTES 32U
#define crypto_box_BEFORENMBYTES 32U
#define crypto_box_NONCEBYTES 24U
#define crypto_box_MACBYTES 16U
#define crypto_generichash_BYTES 32U
#define crypto_generichash_BYTES_MIN 16U
#define crypto_generichash_BYTES_MAX 64U
#define crypto_generichash_KEYBYTES 32U
#define crypto_generichash_KEYBYTES_MIN 16U
#define crypto_generichash_KEYBYTES_MAX 64U
#define crypto_onetimeauth_poly1305_BYTES 16U
#define crypto_onetimeauth_poly1305_KEYBYTES 32U
#define crypto_core_hsalsa20_OUTPUTBYTES 32U
#define crypto_core_hsalsa20_INPUTBYTES 16U
#define crypto_core_hsalsa20_KEYBYTES 32U
#define crypto_stream_xsalsa20_NONCEBYTES 24U
#define crypto_stream_xsalsa20_KEYBYTES 32U

static_assert(crypto_scalarmult_BYTES == daisy::crypt::kScalarMultBytes &&
                  crypto_scalarmult_SCALARBYTES == daisy::crypt::kScalarBytes &&
                  crypto_box_PUBLICKEYBYTES == daisy::crypt::kBoxPublicKeyBytes &&
                  crypto_box_SECRETKEYBYTES == daisy::crypt::kBoxSecretKeyBytes &&
                  crypto_box_BEFORENMBYTES == daisy::crypt::kBoxBeforeNmBytes &&
                  crypto_box_NONCEBYTES == daisy::crypt::kBoxNonceBytes &&
                  crypto_box_MACBYTES == daisy::crypt::kBoxMacBytes &&
                  crypto_generichash_BYTES == daisy::crypt::kGenericHashBytes &&
                  crypto_generichash_BYTES_MIN == daisy::crypt::kGenericHashBytesMin &&
                  crypto_generichash_BYTES_MAX == daisy::crypt::kGenericHashBytesMax &&
                  crypto_generichash_KEYBYTES == daisy::crypt::kGenericHashKeyBytes &&
                  crypto_generichash_KEYBYTES_MIN == daisy::crypt::kGenericHashKeyBytesMin &&
                  crypto_generichash_KEYBYTES_MAX == daisy::crypt::kGenericHashKeyBytesMax &&
                  crypto_onetimeauth_poly1305_BYTES == daisy::crypt::kOneTimeAuthBytes &&
                  crypto_onetimeauth_poly1305_KEYBYTES == daisy::crypt::kOneTimeAuthKeyBytes &&
                  crypto_core_hsalsa20_OUTPUTBYTES == daisy::crypt::kHSalsa20OutputBytes &&
                  crypto_core_hsalsa20_INPUTBYTES == daisy::crypt::kHSalsa20InputBytes &&
                  crypto_core_hsalsa20_KEYBYTES == daisy::crypt::kHSalsa20KeyBytes &&
                  crypto_stream_xsalsa20_NONCEBYTES == daisy::crypt::kXSalsa20NonceBytes &&
                  crypto_stream_xsalsa20_KEYBYTES == daisy::crypt::kXSalsa20KeyBytes,
              "the shim's constants are daisy::crypt's");

// libsodium's names, as C++ inline functions (C++ linkage: never a libsodium symbol).
// NOLINTBEGIN(readability-identifier-naming)
using crypto_generichash_state = daisy::crypt::GenericHashState;

inline int sodium_init() {
  return daisy::crypt::Init();
}
inline void randombytes_buf(void* buf, size_t size) {
  daisy::crypt::RandomBytes(buf, size);
}
inline void sodium_memzero(void* pnt, size_t len) {
  daisy::crypt::MemZero(pnt, len);
}
inline int sodium_memcmp(const void* b1, const void* b2, size_t len) {
  return daisy::crypt::MemCmp(b1, b2, len);
}
inline int crypto_scalarmult_base(unsigned char* q, const unsigned char* n) {
  return daisy::crypt::ScalarMultBase(q, n);
}
inline int crypto_scalarmult(unsigned char* q, const unsigned char* n, const unsigned char* p) {
  return daisy::crypt::ScalarMult(q, n, p);
}
inline int crypto_core_hsalsa20(unsigned char* out, const unsigned char* in, const unsigned char* k,
                                const unsigned char* c) {
  if (c != nullptr) return -1;  // only the standard constants (c == NULL) are implemented
  daisy::crypt::CoreHSalsa20(out, in, k);
  return 0;
}
inline int crypto_stream_xsalsa20_xor(unsigned char* c, const unsigned char* m, unsigned long long mlen,
                                      const unsigned char* n, const unsigned char* k) {
  daisy::crypt::StreamXSalsa20Xor(c, m, mlen, n, k);
  return 0;
}
inline int crypto_onetimeauth_poly1305(unsigned char* out, const unsigned char* in, unsigned long long inlen,
                                       const unsigned char* k) {
  daisy::crypt::OneTimeAuth(out, in, inlen, k);
  return 0;
}
inline int crypto_onetimeauth_poly1305_verify(const unsigned char* h, const unsigned char* in, unsigned long long inlen,
                                              const unsigned char* k) {
  return daisy::crypt::OneTimeAuthVerify(h, in, inlen, k);
}
inline int crypto_box_keypair(unsigned char* pk, unsigned char* sk) {
  return daisy::crypt::BoxKeypair(pk, sk);
}
inline int crypto_box_beforenm(unsigned char* k, const unsigned char* pk, const unsigned char* sk) {
  return daisy::crypt::BoxBeforeNm(k, pk, sk);
}
inline int crypto_box_easy_afternm(unsigned char* c, const unsigned char* m, unsigned long long mlen,
                                   const unsigned char* n, const unsigned char* k) {
  return daisy::crypt::BoxEasyAfterNm(c, m, mlen, n, k);
}
inline int crypto_box_open_easy_afternm(unsigned char* m, const unsigned char* c, unsigned long long clen,
                                        const unsigned char* n, const unsigned char* k) {
  return daisy::crypt::BoxOpenEasyAfterNm(m, c, clen, n, k);
}
inline int crypto_box_easy(unsigned char* c, const unsigned char* m, unsigned long long mlen, const unsigned char* n,
                           const unsigned char* pk, const unsigned char* sk) {
  return daisy::crypt::BoxEasy(c, m, mlen, n, pk, sk);
}
inline int crypto_box_open_easy(unsigned char* m, const unsigned char* c, unsigned long long clen,
                                const unsigned char* n, const unsigned char* pk, const unsigned char* sk) {
  return daisy::crypt::BoxOpenEasy(m, c, clen, n, pk, sk);
}
inline int crypto_generichash(unsigned char* out, size_t outlen, const unsigned char* in, unsigned long long inlen,
                              const unsigned char* key, size_t keylen) {
  return daisy::crypt::GenericHash(out, outlen, in, inlen, key, keylen);
}
inline int crypto_generichash_init(crypto_generichash_state* state, const unsigned char* key, const size_t keylen,
                                   const size_t outlen) {
  return daisy::crypt::GenericHashInit(state, key, keylen, outlen);
}
inline int crypto_generichash_update(crypto_generichash_state* state, const unsigned char* in,
                                     unsigned long long inlen) {
  return daisy::crypt::GenericHashUpdate(state, in, inlen);
}
inline int crypto_generichash_final(crypto_generichash_state* state, unsigned char* out, const size_t outlen) {
  return daisy::crypt::GenericHashFinal(state, out, outlen);
}
// NOLINTEND(readability-identifier-naming)
