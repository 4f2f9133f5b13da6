// randombytes_buf: the operating system's generator. Natively getrandom(2); in wasm (a page,
// a Web Worker or node.js) crypto.getRandomValues, which, unlike crypto.subtle, a page
// served over plain HTTP on a LAN address has too.
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "daisy/crypt.h"

#ifdef __EMSCRIPTEN__
#include <emscripten.h>

// Fills [buf, buf + size) of the module's memory; 0, or -1 without crypto.getRandomValues.
// At most 65536 bytes a call: the limit getRandomValues sets.
// NOLINTNEXTLINE: EM_JS defines a JavaScript function and its C declaration.
EM_JS(int, daisy_crypt_random_js, (unsigned char* buf, size_t size), {
  const c = globalThis.crypto;
  if (!c || typeof c.getRandomValues != 'function') return -1;
  for (let done = 0; done < size; done += 65536) {
    c.getRandomValues(HEAPU8.subarray(buf + done, buf + Math.min(size, done + 65536)));
  }
  return 0;
});
#else
#include <sys/random.h>
#endif

namespace daisy::crypt {

void RandomBytes(void* buf, size_t size) {
#ifdef __EMSCRIPTEN__
  if (daisy_crypt_random_js(static_cast<unsigned char*>(buf), size) == 0) return;
  std::fprintf(stderr, "randombytes: this JavaScript engine has no crypto.getRandomValues; no key can be made\n");
  std::abort();
#else
  auto* p = static_cast<unsigned char*>(buf);
  while (size > 0) {  // bounded: each pass reads at least one byte or fails
    const ssize_t n = getrandom(p, size, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::perror("randombytes: getrandom");
      std::abort();
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
#endif
}

}  // namespace daisy::crypt
