// Force-included into every file of the wasm build (tests/wasm/CMakeLists.txt): what the
// libc++ of Debian's Emscripten 3.1.6 lacks of C++20 and the engine uses. Each shim is
// compiled only where the library does not have the real one.
#pragma once

#ifdef __cplusplus
#include <version>

#if !defined(__cpp_lib_bit_cast)
#include <type_traits>
namespace std {
// The compiler's builtin is what libc++ 14 implements std::bit_cast with.
template <class To, class From>
requires(sizeof(To) == sizeof(From) && is_trivially_copyable_v<To> && is_trivially_copyable_v<From>) constexpr To
    bit_cast(const From& from) noexcept {
  return __builtin_bit_cast(To, from);
}
}  // namespace std
#endif
#endif
