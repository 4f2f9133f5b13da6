// Poly1305 (RFC 8439, section 2.5): the accumulator modulo 2^130 - 5 in five 26-bit limbs,
// so every product fits 64 bits (fast on wasm32 too). Constant-time: no branch or address
// depends on the key, the message bytes or the tag.
#include <cstdint>

#include "daisy/crypt.h"

namespace daisy::crypt {
namespace {

constexpr uint32_t kMask26 = (1u << 26) - 1;

uint32_t Load32(const unsigned char* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

}  // namespace

void OneTimeAuth(unsigned char* tag, const unsigned char* m, unsigned long long mlen, const unsigned char* k) {
  // r with the bits RFC 8439 clears (r &= 0x0ffffffc0ffffffc0ffffffc0fffffff), as limbs.
  const uint32_t t0 = Load32(k), t1 = Load32(k + 4), t2 = Load32(k + 8), t3 = Load32(k + 12);
  const uint64_t r0 = t0 & 0x3ffffff;
  const uint64_t r1 = ((t0 >> 26) | (t1 << 6)) & 0x3ffff03;
  const uint64_t r2 = ((t1 >> 20) | (t2 << 12)) & 0x3ffc0ff;
  const uint64_t r3 = ((t2 >> 14) | (t3 << 18)) & 0x3f03fff;
  const uint64_t r4 = (t3 >> 8) & 0x00fffff;
  // 2^130 = 5 (mod p): a product landing at limb 5 + i comes back times 5 at limb i.
  const uint64_t s1 = r1 * 5, s2 = r2 * 5, s3 = r3 * 5, s4 = r4 * 5;
  uint64_t h0 = 0, h1 = 0, h2 = 0, h3 = 0, h4 = 0;
  while (mlen > 0) {  // bounded: mlen falls by at least one each time
    // The block as a number, with a 1 just above its last byte (2^128 for a full block).
    unsigned char b[17] = {0};
    const size_t n = mlen < 16 ? static_cast<size_t>(mlen) : 16;
    for (size_t i = 0; i < n; ++i) b[i] = m[i];
    b[n] = 1;
    m += n;
    mlen -= n;
    const uint32_t m0 = Load32(b), m1 = Load32(b + 4), m2 = Load32(b + 8), m3 = Load32(b + 12);
    h0 += m0 & kMask26;
    h1 += ((m0 >> 26) | (m1 << 6)) & kMask26;
    h2 += ((m1 >> 20) | (m2 << 12)) & kMask26;
    h3 += ((m2 >> 14) | (m3 << 18)) & kMask26;
    h4 += (m3 >> 8) | (uint32_t{b[16]} << 24);
    // h *= r (mod p)
    const uint64_t d0 = h0 * r0 + h1 * s4 + h2 * s3 + h3 * s2 + h4 * s1;
    uint64_t d1 = h0 * r1 + h1 * r0 + h2 * s4 + h3 * s3 + h4 * s2;
    uint64_t d2 = h0 * r2 + h1 * r1 + h2 * r0 + h3 * s4 + h4 * s3;
    uint64_t d3 = h0 * r3 + h1 * r2 + h2 * r1 + h3 * r0 + h4 * s4;
    uint64_t d4 = h0 * r4 + h1 * r3 + h2 * r2 + h3 * r1 + h4 * r0;
    d1 += d0 >> 26;
    h0 = d0 & kMask26;
    d2 += d1 >> 26;
    h1 = d1 & kMask26;
    d3 += d2 >> 26;
    h2 = d2 & kMask26;
    d4 += d3 >> 26;
    h3 = d3 & kMask26;
    h0 += (d4 >> 26) * 5;
    h4 = d4 & kMask26;
    h1 += h0 >> 26;
    h0 &= kMask26;
  }
  // Full carry, then h mod p: h - p = h + 5 - 2^130 when that does not borrow.
  h2 += h1 >> 26;
  h1 &= kMask26;
  h3 += h2 >> 26;
  h2 &= kMask26;
  h4 += h3 >> 26;
  h3 &= kMask26;
  h0 += (h4 >> 26) * 5;
  h4 &= kMask26;
  h1 += h0 >> 26;
  h0 &= kMask26;
  uint64_t g0 = h0 + 5;
  uint64_t g1 = h1 + (g0 >> 26);
  g0 &= kMask26;
  uint64_t g2 = h2 + (g1 >> 26);
  g1 &= kMask26;
  uint64_t g3 = h3 + (g2 >> 26);
  g2 &= kMask26;
  const uint64_t g4 = h4 + (g3 >> 26) - (uint64_t{1} << 26);
  g3 &= kMask26;
  const uint64_t use_g = (g4 >> 63) - 1;  // all ones when g4 did not borrow
  h0 = (h0 & ~use_g) | (g0 & use_g);
  h1 = (h1 & ~use_g) | (g1 & use_g);
  h2 = (h2 & ~use_g) | (g2 & use_g);
  h3 = (h3 & ~use_g) | (g3 & use_g);
  h4 = (h4 & ~use_g) | (g4 & use_g & kMask26);
  // tag = (h + s) mod 2^128, s the key's second half; sums, not ORs, so a limb that reached
  // 2^26 in the last carry still counts right.
  uint64_t acc = h0 + (h1 << 26);
  uint32_t w[4];
  w[0] = static_cast<uint32_t>(acc);
  acc = (acc >> 32) + (h2 << 20);
  w[1] = static_cast<uint32_t>(acc);
  acc = (acc >> 32) + (h3 << 14);
  w[2] = static_cast<uint32_t>(acc);
  acc = (acc >> 32) + (h4 << 8);
  w[3] = static_cast<uint32_t>(acc);
  uint64_t f = 0;
  for (int i = 0; i < 4; ++i) {
    f = uint64_t{w[i]} + Load32(k + 16 + 4 * i) + (f >> 32);
    for (int j = 0; j < 4; ++j) tag[4 * i + j] = static_cast<unsigned char>(f >> (8 * j));
  }
}

int OneTimeAuthVerify(const unsigned char* tag, const unsigned char* m, unsigned long long mlen,
                      const unsigned char* k) {
  unsigned char correct[16];
  OneTimeAuth(correct, m, mlen, k);
  const int result = MemCmp(tag, correct, sizeof correct);
  MemZero(correct, sizeof correct);
  return result;
}

}  // namespace daisy::crypt
