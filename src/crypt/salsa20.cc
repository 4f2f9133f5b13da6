// Salsa20/20, HSalsa20 and XSalsa20 (Bernstein's "Extending the Salsa20 nonce"), with the
// "expand 32-byte k" constants. No table lookups and no data-dependent branches.
#include <cstdint>
#include <cstring>

#include "daisy/crypt.h"
#include "internal.h"

namespace daisy::crypt {
namespace {

// "expa", "nd 3", "2-by", "te k" as little-endian words: the diagonal of the state.
constexpr uint32_t kSigma[4] = {0x61707865, 0x3320646e, 0x79622d32, 0x6b206574};

uint32_t Load32(const unsigned char* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

void Store32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint32_t Rotl(uint32_t v, int c) {
  return (v << c) | (v >> (32 - c));
}

void QuarterRound(uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d) {
  b ^= Rotl(a + d, 7);
  c ^= Rotl(b + a, 9);
  d ^= Rotl(c + b, 13);
  a ^= Rotl(d + c, 18);
}

// The 20 rounds (10 column rounds, each followed by a row round) on x, in place.
void Rounds(uint32_t x[16]) {
  for (int i = 0; i < 10; ++i) {
    // columns
    QuarterRound(x[0], x[4], x[8], x[12]);
    QuarterRound(x[5], x[9], x[13], x[1]);
    QuarterRound(x[10], x[14], x[2], x[6]);
    QuarterRound(x[15], x[3], x[7], x[11]);
    // rows
    QuarterRound(x[0], x[1], x[2], x[3]);
    QuarterRound(x[5], x[6], x[7], x[4]);
    QuarterRound(x[10], x[11], x[8], x[9]);
    QuarterRound(x[15], x[12], x[13], x[14]);
  }
}

// The state for key k and 16 bytes `in` (nonce and counter, or HSalsa20's input).
void InitState(uint32_t s[16], const unsigned char* k, const unsigned char* in) {
  s[0] = kSigma[0];
  s[5] = kSigma[1];
  s[10] = kSigma[2];
  s[15] = kSigma[3];
  for (int i = 0; i < 4; ++i) {
    s[1 + i] = Load32(k + 4 * i);
    s[11 + i] = Load32(k + 16 + 4 * i);
    s[6 + i] = Load32(in + 4 * i);
  }
}

// m xor Salsa20(k, nonce8) into c, the stream started `offset` bytes in. c may equal m.
void Salsa20Xor(unsigned char* c, const unsigned char* m, uint64_t mlen, const unsigned char* n8,
                const unsigned char* k, uint64_t offset) {
  unsigned char in[16];
  std::memcpy(in, n8, 8);
  uint64_t counter = offset / 64;
  size_t skip = static_cast<size_t>(offset % 64);
  uint32_t s[16], x[16];
  unsigned char block[64];
  while (mlen > 0) {  // bounded: mlen falls by at least one each time
    for (int i = 0; i < 8; ++i) in[8 + i] = static_cast<unsigned char>(counter >> (8 * i));
    InitState(s, k, in);
    std::memcpy(x, s, sizeof x);
    Rounds(x);
    for (int i = 0; i < 16; ++i) Store32(block + 4 * i, x[i] + s[i]);
    const size_t avail = 64 - skip;
    const size_t take = mlen < avail ? static_cast<size_t>(mlen) : avail;
    for (size_t i = 0; i < take; ++i) c[i] = static_cast<unsigned char>(m[i] ^ block[skip + i]);
    c += take;
    m += take;
    mlen -= take;
    skip = 0;
    ++counter;
  }
  MemZero(block, sizeof block);
  MemZero(x, sizeof x);
  MemZero(s, sizeof s);
}

}  // namespace

void CoreHSalsa20(unsigned char* out, const unsigned char* in, const unsigned char* k) {
  uint32_t x[16];
  InitState(x, k, in);
  Rounds(x);
  // No feed-forward: the diagonal and the input positions are the output.
  static constexpr int kOut[8] = {0, 5, 10, 15, 6, 7, 8, 9};
  for (int i = 0; i < 8; ++i) Store32(out + 4 * i, x[kOut[i]]);
  MemZero(x, sizeof x);
}

void StreamXSalsa20XorAt(unsigned char* c, const unsigned char* m, unsigned long long mlen, const unsigned char* n,
                         const unsigned char* k, uint64_t offset) {
  // XSalsa20: HSalsa20 of the nonce's first 16 bytes is the key of Salsa20 with its last 8.
  unsigned char subkey[32];
  CoreHSalsa20(subkey, n, k);
  Salsa20Xor(c, m, mlen, n + 16, subkey, offset);
  MemZero(subkey, sizeof subkey);
}

void StreamXSalsa20Xor(unsigned char* c, const unsigned char* m, unsigned long long mlen, const unsigned char* n,
                       const unsigned char* k) {
  StreamXSalsa20XorAt(c, m, mlen, n, k, 0);
}

}  // namespace daisy::crypt
