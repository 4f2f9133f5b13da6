// crypto_box (X25519 + XSalsa20-Poly1305) in libsodium's "easy" layout, and the small
// helpers around it (init, memzero, memcmp).
#include <atomic>
#include <cstring>

#include "daisy/crypt.h"
#include "internal.h"

namespace daisy::crypt {

int Init() {
  static std::atomic<bool> done{false};
  return done.exchange(true) ? 1 : 0;
}

void MemZero(void* pnt, size_t size) {
  // Through a volatile pointer: the compiler may not drop stores to memory about to die.
  volatile unsigned char* p = static_cast<volatile unsigned char*>(pnt);
  for (size_t i = 0; i < size; ++i) p[i] = 0;
}

int MemCmp(const void* a, const void* b, size_t size) {
  const volatile unsigned char* x = static_cast<const volatile unsigned char*>(a);
  const volatile unsigned char* y = static_cast<const volatile unsigned char*>(b);
  unsigned d = 0;
  for (size_t i = 0; i < size; ++i) d |= x[i] ^ y[i];
  return static_cast<int>(1 & ((d - 1) >> 8)) - 1;  // d == 0: 0, else -1
}

int BoxKeypair(unsigned char* pk, unsigned char* sk) {
  RandomBytes(sk, kBoxSecretKeyBytes);
  return ScalarMultBase(pk, sk);
}

int BoxBeforeNm(unsigned char* k, const unsigned char* pk, const unsigned char* sk) {
  unsigned char shared[32];
  if (ScalarMult(shared, sk, pk) != 0) return -1;
  static constexpr unsigned char kZero[16] = {0};
  CoreHSalsa20(k, kZero, shared);
  MemZero(shared, sizeof shared);
  return 0;
}

// The XSalsa20 stream's first 32 bytes key Poly1305; the message is xored with the rest.
int BoxEasyAfterNm(unsigned char* c, const unsigned char* m, unsigned long long mlen, const unsigned char* n,
                   const unsigned char* k) {
  if (mlen > ~0ull - 32 - kBoxMacBytes) return -1;  // libsodium aborts (misuse)
  // m may overlap c: move it to where its ciphertext goes, then encrypt in place.
  std::memmove(c + kBoxMacBytes, m, static_cast<size_t>(mlen));
  unsigned char poly_key[32] = {0};
  StreamXSalsa20XorAt(poly_key, poly_key, sizeof poly_key, n, k, 0);
  StreamXSalsa20XorAt(c + kBoxMacBytes, c + kBoxMacBytes, mlen, n, k, sizeof poly_key);
  OneTimeAuth(c, c + kBoxMacBytes, mlen, poly_key);
  MemZero(poly_key, sizeof poly_key);
  return 0;
}

int BoxOpenEasyAfterNm(unsigned char* m, const unsigned char* c, unsigned long long clen, const unsigned char* n,
                       const unsigned char* k) {
  if (clen < kBoxMacBytes) return -1;
  const unsigned long long mlen = clen - kBoxMacBytes;
  unsigned char poly_key[32] = {0};
  StreamXSalsa20XorAt(poly_key, poly_key, sizeof poly_key, n, k, 0);
  const int verified = OneTimeAuthVerify(c, c + kBoxMacBytes, mlen, poly_key);
  MemZero(poly_key, sizeof poly_key);
  if (verified != 0) return -1;  // nothing written
  std::memmove(m, c + kBoxMacBytes, static_cast<size_t>(mlen));
  StreamXSalsa20XorAt(m, m, mlen, n, k, sizeof poly_key);
  return 0;
}

int BoxEasy(unsigned char* c, const unsigned char* m, unsigned long long mlen, const unsigned char* n,
            const unsigned char* pk, const unsigned char* sk) {
  unsigned char k[kBoxBeforeNmBytes];
  if (BoxBeforeNm(k, pk, sk) != 0) return -1;
  const int result = BoxEasyAfterNm(c, m, mlen, n, k);
  MemZero(k, sizeof k);
  return result;
}

int BoxOpenEasy(unsigned char* m, const unsigned char* c, unsigned long long clen, const unsigned char* n,
                const unsigned char* pk, const unsigned char* sk) {
  unsigned char k[kBoxBeforeNmBytes];
  if (BoxBeforeNm(k, pk, sk) != 0) return -1;
  const int result = BoxOpenEasyAfterNm(m, c, clen, n, k);
  MemZero(k, sizeof k);
  return result;
}

}  // namespace daisy::crypt
