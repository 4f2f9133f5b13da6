// Writes one valid frame of every wire message kind into DIR (the wire fuzzer's seeds),
// each prefixed with the fuzzer's row-width byte.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "daisy/wire.h"

using namespace daisy::wire;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_wire_seeds DIR\n");
    return 2;
  }
  Hello h{kProtocolVersion, kCapCompute | kCapHead, 123.5, 0x1234, 8ull << 30, "avx2", "device-1", "laptop"};
  Assignment a;
  a.turn = 3;
  a.model_id = "owner/model";
  a.revision = "0123456789abcdef0123456789abcdef01234567";
  a.spec_hash = 42;
  a.model_hash = 7;
  a.ctx = 64;
  a.stages = {{"head", "tcp://127.0.0.1:5000", 0, 2}, {"n1", "tcp://127.0.0.1:5001", 2, 5}};
  a.your_stage = 1;
  a.cache_key = 9;
  a.keep = 3;
  a.keep_tag = 11;
  a.audit = true;
  Activation act;
  act.seq = 3;
  act.token_index = 4;
  act.next = 1;
  act.model_hash = 7;
  act.values = {0.5f, -1.25f, 3.0f, 0.0f};
  act.act_hash = ActHash(act.values);
  const Message all[] = {
      h,
      a,
      Ready{1, 100, 3},
      act,
      Token{3, 5, 42},
      Done{3, FinishReason::kStop, 9, 11},
      Heartbeat{1000, "device-1"},
      ErrorMsg{ErrorKind::kBusy, "busy"},
      Bye{"device-1"},
      Join{"room", "tcp://127.0.0.1:5001", h},
      Peers{"room", {Peer{"tcp://127.0.0.1:5001", h, "rq:^%7Gl8#i&GJdRjdR?VTnxbD*3A0g/VQxcqKx5"}}},
      Progress{3, 1, 10, 20},
      StageStats{3, 1, 4, 0.25},
      HopDigest{3, 2, 4, 1, {}, {}, true, HopReceipt{3, 1, 4, 1, {}, {}}},
      HopReceipt{3, 1, 4, 1, {}, {}},
      AuditRequest{3, 0, 5},
      AuditData{3, 1, 0, {1.0f, 2.0f, 3.0f, 4.0f}},
      Text{3, TextKind::kPiece, 0, 42, " once"},
      Relay{"0123456789abcdef", "fedcba9876543210", 0x1122334455667788ull, std::vector<uint8_t>(20, 7)}};
  int i = 0;
  for (const auto& m : all) {
    auto bytes = Encode(m);
    std::ofstream f(std::string(argv[1]) + "/" + std::string(TagName(static_cast<int32_t>(bytes[0]) | ~0xff)) + ".bin",
                    std::ios::binary);
    const char width = 4;
    f.write(&width, 1);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!f) {
      std::fprintf(stderr, "make_wire_seeds: cannot write into %s\n", argv[1]);
      return 1;
    }
    ++i;
  }
  std::printf("%d seeds written\n", i);
  return 0;
}
