// BLAKE2b (RFC 7693): sequential mode, digest 1..64 bytes, optional key of up to 64 bytes.
#include <cstdint>
#include <cstring>

#include "daisy/crypt.h"

namespace daisy::crypt {
namespace {

// SHA-512's initial hash values.
constexpr uint64_t kIv[8] = {0x6a09e667f3bcc908, 0xbb67ae8584caa73b, 0x3c6ef372fe94f82b, 0xa54ff53a5f1d36f1,
                             0x510e527fade682d1, 0x9b05688c2b3e6c1f, 0x1f83d9abfb41bd6b, 0x5be0cd19137e2179};

// The message word schedule of each round (rounds 10 and 11 reuse rows 0 and 1).
constexpr uint8_t kSigma[10][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
};

constexpr size_t kBlock = 128;

uint64_t Rotr(uint64_t v, int c) {
  return (v >> c) | (v << (64 - c));
}

uint64_t Load64(const unsigned char* p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; --i) x = (x << 8) | p[i];
  return x;
}

void G(uint64_t v[16], int a, int b, int c, int d, uint64_t x, uint64_t y) {
  v[a] = v[a] + v[b] + x;
  v[d] = Rotr(v[d] ^ v[a], 32);
  v[c] = v[c] + v[d];
  v[b] = Rotr(v[b] ^ v[c], 24);
  v[a] = v[a] + v[b] + y;
  v[d] = Rotr(v[d] ^ v[a], 16);
  v[c] = v[c] + v[d];
  v[b] = Rotr(v[b] ^ v[c], 63);
}

// F: one 128-byte block into h, t bytes counted so far (this block included).
void Compress(GenericHashState* s, const unsigned char block[kBlock], bool last) {
  uint64_t m[16], v[16];
  for (int i = 0; i < 16; ++i) m[i] = Load64(block + 8 * i);
  for (int i = 0; i < 8; ++i) {
    v[i] = s->h[i];
    v[i + 8] = kIv[i];
  }
  v[12] ^= s->t[0];
  v[13] ^= s->t[1];
  if (last) v[14] = ~v[14];
  for (int r = 0; r < 12; ++r) {
    const uint8_t* z = kSigma[r % 10];
    G(v, 0, 4, 8, 12, m[z[0]], m[z[1]]);
    G(v, 1, 5, 9, 13, m[z[2]], m[z[3]]);
    G(v, 2, 6, 10, 14, m[z[4]], m[z[5]]);
    G(v, 3, 7, 11, 15, m[z[6]], m[z[7]]);
    G(v, 0, 5, 10, 15, m[z[8]], m[z[9]]);
    G(v, 1, 6, 11, 12, m[z[10]], m[z[11]]);
    G(v, 2, 7, 8, 13, m[z[12]], m[z[13]]);
    G(v, 3, 4, 9, 14, m[z[14]], m[z[15]]);
  }
  for (int i = 0; i < 8; ++i) s->h[i] ^= v[i] ^ v[i + 8];
}

void Count(GenericHashState* s, uint64_t n) {
  s->t[0] += n;
  if (s->t[0] < n) ++s->t[1];
}

}  // namespace

int GenericHashInit(GenericHashState* state, const unsigned char* key, size_t keylen, size_t outlen) {
  if (outlen == 0 || outlen > kGenericHashBytesMax || keylen > kGenericHashKeyBytesMax) return -1;
  if (key == nullptr) keylen = 0;  // as libsodium's init: no key
  std::memset(state, 0, sizeof *state);
  for (int i = 0; i < 8; ++i) state->h[i] = kIv[i];
  // The parameter block's first word: digest length, key length, fanout 1, depth 1.
  state->h[0] ^= 0x01010000 ^ (uint64_t{keylen} << 8) ^ uint64_t { outlen };
  if (keylen > 0) {
    // The key, zero-padded, is the first block.
    std::memcpy(state->buf, key, keylen);
    state->buf_len = kBlock;
  }
  return 0;
}

int GenericHashUpdate(GenericHashState* state, const unsigned char* in, unsigned long long inlen) {
  if (in == nullptr && inlen > 0) return -1;
  while (inlen > 0) {  // bounded: each pass consumes bytes or empties the full buffer
    if (state->buf_len == kBlock) {
      // Full, and more follows: it is not the last block.
      Count(state, kBlock);
      Compress(state, state->buf, false);
      state->buf_len = 0;
    }
    const size_t room = kBlock - state->buf_len;
    const size_t take = inlen < room ? static_cast<size_t>(inlen) : room;
    std::memcpy(state->buf + state->buf_len, in, take);
    state->buf_len += take;
    in += take;
    inlen -= take;
  }
  return 0;
}

int GenericHashFinal(GenericHashState* state, unsigned char* out, size_t outlen) {
  if (outlen == 0 || outlen > kGenericHashBytesMax || state->finalized) return -1;
  Count(state, state->buf_len);
  std::memset(state->buf + state->buf_len, 0, kBlock - state->buf_len);
  Compress(state, state->buf, true);
  state->finalized = true;
  unsigned char digest[64];
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) digest[8 * i + j] = static_cast<unsigned char>(state->h[i] >> (8 * j));
  std::memcpy(out, digest, outlen);
  MemZero(digest, sizeof digest);
  MemZero(state->buf, sizeof state->buf);
  return 0;
}

int GenericHash(unsigned char* out, size_t outlen, const unsigned char* in, unsigned long long inlen,
                const unsigned char* key, size_t keylen) {
  if (key == nullptr && keylen > 0) return -1;  // libsodium aborts (misuse)
  GenericHashState state;
  if (GenericHashInit(&state, key, keylen, outlen) != 0 || GenericHashUpdate(&state, in, inlen) != 0) return -1;
  const int result = GenericHashFinal(&state, out, outlen);
  MemZero(&state, sizeof state);
  return result;
}

}  // namespace daisy::crypt
