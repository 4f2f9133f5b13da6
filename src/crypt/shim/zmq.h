// <zmq.h> for the wasm build, which has no libzmq: ZeroMQ's Z85 and CURVE key helpers alone
// (daisy::crypt, include/daisy/crypt.h), under ZeroMQ's names. Sockets and everything else
// of ZeroMQ are not declared: code that needs them does not compile for wasm. The native
// build never puts this folder on an include path (it links real libzmq).
#pragma once

#include <cstddef>
#include <cstdint>

#include "daisy/crypt.h"

// NOLINTBEGIN(readability-identifier-naming)
inline char* zmq_z85_encode(char* dest, const uint8_t* data, size_t size) {
  return daisy::crypt::Z85Encode(dest, data, size);
}
inline uint8_t* zmq_z85_decode(uint8_t* dest, const char* string) {
  return daisy::crypt::Z85Decode(dest, string);
}
inline int zmq_curve_public(char* z85_public_key, const char* z85_secret_key) {
  return daisy::crypt::CurvePublic(z85_public_key, z85_secret_key);
}
inline int zmq_curve_keypair(char* z85_public_key, char* z85_secret_key) {
  return daisy::crypt::CurveKeypair(z85_public_key, z85_secret_key);
}
// NOLINTEND(readability-identifier-naming)
