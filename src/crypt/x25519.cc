// X25519 (RFC 7748): the Montgomery ladder over GF(2^255 - 19), constant-time.
//
// A field element is five 51-bit limbs, value = sum of limb[i] * 2^(51 i). Every operation
// leaves its limbs below 2^52 ("loosely reduced"); only ToBytes reduces fully. Products of
// limbs go through unsigned __int128 (also on wasm32, where clang lowers it to 64-bit ops).
#include <cstdint>
#include <cstring>

#include "daisy/crypt.h"

namespace daisy::crypt {
namespace {

using u128 = unsigned __int128;
constexpr uint64_t kMask51 = (uint64_t{1} << 51) - 1;

struct Fe {
  uint64_t v[5];
};

uint64_t Load64(const unsigned char* p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; --i) x = (x << 8) | p[i];
  return x;
}

// 2^255 = 19 (mod p): the carry out of the top limb comes back times 19 into the bottom one.
void Carry(Fe& h) {
  for (int i = 0; i < 4; ++i) {
    h.v[i + 1] += h.v[i] >> 51;
    h.v[i] &= kMask51;
  }
  const uint64_t c = h.v[4] >> 51;
  h.v[4] &= kMask51;
  h.v[0] += 19 * c;
}

// The low 255 bits of 32 little-endian bytes (RFC 7748 masks the top bit of u).
Fe FromBytes(const unsigned char s[32]) {
  const uint64_t w0 = Load64(s), w1 = Load64(s + 8), w2 = Load64(s + 16), w3 = Load64(s + 24);
  Fe h;
  h.v[0] = w0 & kMask51;
  h.v[1] = ((w0 >> 51) | (w1 << 13)) & kMask51;
  h.v[2] = ((w1 >> 38) | (w2 << 26)) & kMask51;
  h.v[3] = ((w2 >> 25) | (w3 << 39)) & kMask51;
  h.v[4] = (w3 >> 12) & kMask51;
  return h;
}

// The canonical encoding (value mod p, in [0, p)).
void ToBytes(unsigned char out[32], Fe h) {
  Carry(h);
  Carry(h);  // now limbs 1..4 are below 2^51 and limb 0 below 2^51 + 19: h < 2p
  // q = 1 exactly when h >= p, i.e. when h + 19 reaches 2^255.
  uint64_t q = (h.v[0] + 19) >> 51;
  for (int i = 1; i < 5; ++i) q = (h.v[i] + q) >> 51;
  // h - q p = h + 19 q - q 2^255: add 19 q, carry, drop bit 255.
  h.v[0] += 19 * q;
  for (int i = 0; i < 4; ++i) {
    h.v[i + 1] += h.v[i] >> 51;
    h.v[i] &= kMask51;
  }
  h.v[4] &= kMask51;
  const uint64_t w[4] = {h.v[0] | (h.v[1] << 51), (h.v[1] >> 13) | (h.v[2] << 38), (h.v[2] >> 26) | (h.v[3] << 25),
                         (h.v[3] >> 39) | (h.v[4] << 12)};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 8; ++j) out[8 * i + j] = static_cast<unsigned char>(w[i] >> (8 * j));
}

Fe Add(const Fe& a, const Fe& b) {
  Fe h;
  for (int i = 0; i < 5; ++i) h.v[i] = a.v[i] + b.v[i];
  Carry(h);
  return h;
}

// a - b as a + 4p - b: 4p's limbs exceed any loosely reduced limb, so nothing wraps.
Fe Sub(const Fe& a, const Fe& b) {
  constexpr uint64_t kFourP0 = (uint64_t{1} << 53) - 76, kFourPi = (uint64_t{1} << 53) - 4;
  Fe h;
  h.v[0] = a.v[0] + kFourP0 - b.v[0];
  for (int i = 1; i < 5; ++i) h.v[i] = a.v[i] + kFourPi - b.v[i];
  Carry(h);
  return h;
}

// Limb sums (each below 2^116) back to a loosely reduced element.
Fe Reduce(u128 t[5]) {
  for (int i = 0; i < 4; ++i) {
    t[i + 1] += t[i] >> 51;
    t[i] &= kMask51;
  }
  const u128 c = t[4] >> 51;
  t[4] &= kMask51;
  t[0] += c * 19;
  t[1] += t[0] >> 51;  // before narrowing: c * 19 alone may come near 2^64
  t[0] &= kMask51;
  Fe h;
  for (int i = 0; i < 5; ++i) h.v[i] = static_cast<uint64_t>(t[i]);
  return h;
}

// Schoolbook product; a limb product landing at 2^(51 k), k >= 5, comes back times 19.
Fe Mul(const Fe& a, const Fe& b) {
  const uint64_t* x = a.v;
  const uint64_t* y = b.v;
  const uint64_t y1 = 19 * y[1], y2 = 19 * y[2], y3 = 19 * y[3], y4 = 19 * y[4];
  u128 t[5];
  t[0] = u128{x[0]} * y[0] + u128{x[1]} * y4 + u128{x[2]} * y3 + u128{x[3]} * y2 + u128{x[4]} * y1;
  t[1] = u128{x[0]} * y[1] + u128{x[1]} * y[0] + u128{x[2]} * y4 + u128{x[3]} * y3 + u128{x[4]} * y2;
  t[2] = u128{x[0]} * y[2] + u128{x[1]} * y[1] + u128{x[2]} * y[0] + u128{x[3]} * y4 + u128{x[4]} * y3;
  t[3] = u128{x[0]} * y[3] + u128{x[1]} * y[2] + u128{x[2]} * y[1] + u128{x[3]} * y[0] + u128{x[4]} * y4;
  t[4] = u128{x[0]} * y[4] + u128{x[1]} * y[3] + u128{x[2]} * y[2] + u128{x[3]} * y[1] + u128{x[4]} * y[0];
  return Reduce(t);
}

// Mul(a, a) with each cross product once, doubled.
Fe Square(const Fe& a) {
  const uint64_t* x = a.v;
  const uint64_t d0 = 2 * x[0], d1 = 2 * x[1], d3_19 = 2 * 19 * x[3];
  const uint64_t x3_19 = 19 * x[3], x4_19 = 19 * x[4], d4_19 = 2 * 19 * x[4];
  u128 t[5];
  t[0] = u128{x[0]} * x[0] + u128{d1} * x4_19 + u128{x[2]} * d3_19;
  t[1] = u128{d0} * x[1] + u128{x[3]} * x3_19 + u128{x[2]} * d4_19;
  t[2] = u128{d0} * x[2] + u128{x[1]} * x[1] + u128{x[3]} * d4_19;
  t[3] = u128{d0} * x[3] + u128{d1} * x[2] + u128{x[4]} * x4_19;
  t[4] = u128{d0} * x[4] + u128{d1} * x[3] + u128{x[2]} * x[2];
  return Reduce(t);
}

// a * 121665 (RFC 7748's a24), limb by limb.
Fe MulA24(const Fe& a) {
  u128 t[5];
  for (int i = 0; i < 5; ++i) t[i] = u128{a.v[i]} * 121665;
  return Reduce(t);
}

// a^(p - 2) = 1/a (0 for 0): square-and-multiply over the public exponent's bits.
Fe Invert(const Fe& a) {
  // p - 2 = 2^255 - 21, little-endian.
  unsigned char e[32];
  std::memset(e, 0xff, sizeof e);
  e[0] = 0xeb;
  e[31] = 0x7f;
  Fe r{{1, 0, 0, 0, 0}};
  for (int bit = 254; bit >= 0; --bit) {
    r = Square(r);
    if ((e[bit >> 3] >> (bit & 7)) & 1) r = Mul(r, a);
  }
  return r;
}

// Swaps a and b when swap is 1, by masks: no branch, no address depends on the secret bit.
void CSwap(Fe& a, Fe& b, uint64_t swap) {
  const uint64_t mask = 0 - swap;
  for (int i = 0; i < 5; ++i) {
    const uint64_t t = mask & (a.v[i] ^ b.v[i]);
    a.v[i] ^= t;
    b.v[i] ^= t;
  }
}

// RFC 7748, section 5: the ladder on the clamped scalar, then x2 / z2.
void Ladder(unsigned char out[32], const unsigned char scalar[32], const unsigned char u[32]) {
  unsigned char k[32];
  std::memcpy(k, scalar, sizeof k);
  k[0] &= 248;
  k[31] &= 127;
  k[31] |= 64;
  const Fe x1 = FromBytes(u);
  Fe x2{{1, 0, 0, 0, 0}}, z2{{0, 0, 0, 0, 0}}, x3 = x1, z3{{1, 0, 0, 0, 0}};
  uint64_t swap = 0;
  for (int t = 254; t >= 0; --t) {
    const uint64_t bit = (k[t >> 3] >> (t & 7)) & 1;
    swap ^= bit;
    CSwap(x2, x3, swap);
    CSwap(z2, z3, swap);
    swap = bit;
    const Fe a = Add(x2, z2), aa = Square(a), b = Sub(x2, z2), bb = Square(b), e = Sub(aa, bb);
    const Fe c = Add(x3, z3), d = Sub(x3, z3), da = Mul(d, a), cb = Mul(c, b);
    x3 = Square(Add(da, cb));
    z3 = Mul(x1, Square(Sub(da, cb)));
    x2 = Mul(aa, bb);
    z2 = Mul(e, Add(aa, MulA24(e)));
  }
  CSwap(x2, x3, swap);
  CSwap(z2, z3, swap);
  ToBytes(out, Mul(x2, Invert(z2)));
  MemZero(k, sizeof k);
}

}  // namespace

int ScalarMult(unsigned char* q, const unsigned char* n, const unsigned char* p) {
  Ladder(q, n, p);
  // All zeros: p had small order (libsodium refuses it the same way).
  unsigned char d = 0;
  for (int i = 0; i < 32; ++i) d |= q[i];
  return -static_cast<int>(1 & ((static_cast<unsigned>(d) - 1) >> 8));
}

int ScalarMultBase(unsigned char* q, const unsigned char* n) {
  static constexpr unsigned char kBase[32] = {9};
  Ladder(q, n, kBase);
  return 0;
}

}  // namespace daisy::crypt
