// What the files of src/crypt share beyond include/daisy/crypt.h.
#pragma once

#include <cstdint>

namespace daisy::crypt {

// StreamXSalsa20Xor with the key stream started `offset` bytes in (crypto_box skips the
// first 32 bytes, the Poly1305 key).
void StreamXSalsa20XorAt(unsigned char* c, const unsigned char* m, unsigned long long mlen, const unsigned char* n,
                         const unsigned char* k, uint64_t offset);

}  // namespace daisy::crypt
