// The fixed vectors of crypt's two tests, from the RFCs (and libsodium where an RFC gives
// none), with their hex helpers: crypt_test checks daisy::crypt and real libsodium/libzmq
// against them, crypt_shim_test the shims' C names (natively and under node.js). One table,
// so the two builds are held to the same values.
#pragma once

#include <string>
#include <vector>

namespace daisy::crypt_test {

using Bytes = std::vector<unsigned char>;

inline Bytes FromHex(const std::string& hex) {
  Bytes out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<unsigned char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

inline std::string Hex(const unsigned char* p, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kHex[p[i] >> 4];
    out += kHex[p[i] & 15];
  }
  return out;
}

// RFC 7748: X25519(scalar, u) = out. Section 5.2's two vectors, then section 6.1's shared
// secret (Alice's secret, Bob's public key).
struct X25519Vector {
  const char *scalar, *u, *out;
};
inline constexpr X25519Vector kX25519Vectors[] = {
    {"a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4",
     "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c",
     "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552"},
    {"4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d",
     "e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493",
     "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957"},
    {"77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
     "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f",
     "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"},
};
// Section 6.1's key pairs.
inline constexpr char kAliceSecret[] = "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a";
inline constexpr char kAlicePublic[] = "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a";
inline constexpr char kBobSecret[] = "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb";
inline constexpr char kBobPublic[] = "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f";
// Section 5.2's iteration, k = u = 9, then k, u = X25519(k, u), k: k after 1 and 1000 rounds.
inline constexpr char kX25519After1[] = "422c8e7a6227d7bca1350b3e2bb7279f7897b87bb6854b783c60e80311ae3079";
inline constexpr char kX25519After1000[] = "684cf59ba83309552800ef566f2f4d3c1c3887c49360e3875f2eb94d99532c51";

// RFC 8439, section 2.5.2: Poly1305 of kPolyText under kPolyKey.
inline constexpr char kPolyKey[] = "85d6be7857556d337f4452fe42d506a80103808afb0db2fd4abff6af4149f51b";
inline constexpr char kPolyText[] = "Cryptographic Forum Research Group";
inline constexpr char kPolyTag[] = "a8061dc1305136c6c22b8baf0c0127a9";
// Accumulators that land in [p, 2^130) before the final reduction, and a carry out of h + s
// (random inputs almost never do): RFC 8439 A.3's vectors 5, 6 and 8, and one like them
// whose tag is libsodium's.
struct PolyVector {
  const char *key, *msg, *tag;
};
inline constexpr PolyVector kPolyEdges[] = {
    {"0200000000000000000000000000000000000000000000000000000000000000", "ffffffffffffffffffffffffffffffff",
     "03000000000000000000000000000000"},
    {"02000000000000000000000000000000ffffffffffffffffffffffffffffffff", "02000000000000000000000000000000",
     "03000000000000000000000000000000"},
    {"0100000000000000000000000000000000000000000000000000000000000000",
     "fffffffffffffffffffffffffffffffffbfefefefefefefefefefefefefefefe01010101010101010101010101010101",
     "00000000000000000000000000000000"},
    {"0200000000000000000000000000000000000000000000000000000000000000", "fdffffffffffffffffffffffffffffff",
     "faffffffffffffffffffffffffffffff"},
};

// RFC 7693 (appendix A, and BLAKE2's reference for ""): BLAKE2b-512 of "" and of "abc".
inline constexpr char kBlake2bEmpty[] =
    "786a02f742015903c6c6fd852552d272912f4740e15847618a86e217f71f5419d25e1031afee585313896444934eb04b903a685b1448"
    "b755d56f701afe9be2ce";
inline constexpr char kBlake2bAbc[] =
    "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d17d87c5392aab792dc252d5de4533cc9518d38aa8dbf1"
    "925ab92386edd4009923";

// ZeroMQ RFC 32's example: these 8 bytes are "HelloWorld" in Z85.
inline constexpr unsigned char kZ85HelloBytes[8] = {0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B};
inline constexpr char kZ85Hello[] = "HelloWorld";

}  // namespace daisy::crypt_test
