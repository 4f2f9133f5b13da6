// Tests only: a ring in this process — a rendezvous (auto-approve) and nodes, each node a
// thread, all on 127.0.0.1 sockets with CURVE like any other ring. Used by session_test
// and audit_test.
#pragma once

#include <stdlib.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daisy/head.h"
#include "daisy/net.h"
#include "daisy/node.h"
#include "daisy/ring.h"
#include "node_faults.h"

namespace daisy::test_ring {

inline std::string StoriesModel() {
  return std::string(std::getenv("DAISY_MODELS")) + "/stories260K";
}

class InProcessRing {
 public:
  struct NodeSpec {
    std::string role;    // also its name
    int flip_every = 0;  // a TestNodeFaults flipping a bit of every Nth hop (0: honest)
    test::TestNodeFaults::Lie lie = test::TestNodeFaults::Lie::kInOutput;  // where the flip goes
    std::optional<uint64_t> max_memory;  // the node's --max-memory (default: what the OS has)
  };

  // Makes a DAISY_HOME under /tmp, starts the rendezvous and the nodes. Returns "" or why not.
  // `in_order`: the nodes' keys are made so that their ids sort as listed, so the plan
  // (head first, then by id) puts them in that order.
  std::string Start(const std::vector<NodeSpec>& nodes, bool in_order = false) {
    char tmpl[] = "/tmp/daisy_ring_inproc_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return "mkdtemp failed";
    home_ = tmpl;
    ::setenv("DAISY_HOME", home_.c_str(), 1);
    if (in_order) {
      // Node i of n takes a key whose id starts with a hex digit in the i-th of n equal
      // ranges, so the ids sort as listed whatever came first. (Asking only for an id above
      // the previous one failed now and then: after a first id near the top, no later key
      // could pass in 200 tries.) Each try succeeds with probability >= 1/16.
      if (nodes.size() > 16) return "in_order supports at most 16 nodes";
      std::string last;
      for (size_t i = 0; i < nodes.size(); ++i) {
        const int lo = static_cast<int>(i * 16 / nodes.size()), hi = static_cast<int>((i + 1) * 16 / nodes.size());
        for (int tries = 0;; ++tries) {
          auto id = DeviceId(home_.string(), nodes[i].role);
          if (!id.ok()) return id.status().message();
          const int digit = id->empty() ? -1 : std::stoi(id->substr(0, 1), nullptr, 16);
          if (digit >= lo && digit<hi&& * id> last) {
            last = *id;
            break;
          }
          if (tries > 2000) return "could not make ordered keys";
          std::filesystem::remove(DeviceKeyPath(home_.string(), nodes[i].role));
        }
      }
    }
    net::RendezvousOptions ro;
    ro.port = 0;
    ro.auto_approve = true;
    auto rv = net::Rendezvous::Start(ro);
    if (!rv.ok()) return rv.status().message();
    rendezvous_ = std::move(*rv);
    for (const auto& n : nodes) {
      // Made here, not on the thread: it must outlive the node, and Stop joins first.
      test::TestNodeFaults* faults = nullptr;
      if (n.flip_every > 0)
        faults = faults_.emplace_back(std::make_unique<test::TestNodeFaults>(n.flip_every, 0, n.lie)).get();
      threads_.emplace_back([this, n, faults] {
        NodeOptions o;
        o.role = n.role;
        o.name = n.role;
        o.rendezvous = rendezvous_->address();
        o.admission = rendezvous_->LocalAdmission(/*trusted=*/false);  // auto_approve: approved at once
        o.print_tokens = false;
        o.stop = &stop_;
        o.faults = faults;
        o.max_memory = n.max_memory;
        o.models_dirs = {std::getenv("DAISY_MODELS")};
        o.hub.cache_dir = (home_ / n.role).string();
        Status st = RunNode(o);
        if (!st.ok()) std::fprintf(stderr, "node %s: %s\n", n.role.c_str(), st.message().c_str());
      });
    }
    return "";
  }
  ~InProcessRing() { Stop(); }
  void Stop() {
    stop_ = true;
    for (auto& t : threads_) t.join();
    threads_.clear();
    faults_.clear();
    rendezvous_.reset();
    if (!home_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(home_, ec);
      home_.clear();
    }
  }

  // A head's options for this room: split over every node.
  SessionOptions HeadOptions(const std::string& name) const {
    SessionOptions so;
    so.rendezvous = rendezvous_->address();
    so.admission = rendezvous_->LocalAdmission(/*trusted=*/false);
    so.name = name;
    so.stages = static_cast<int>(threads_.size()) + 1;
    so.wait_s = 20;
    return so;
  }
  net::Rendezvous& rendezvous() { return *rendezvous_; }

 private:
  std::filesystem::path home_;
  std::unique_ptr<net::Rendezvous> rendezvous_;
  std::vector<std::unique_ptr<test::TestNodeFaults>> faults_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
};

}  // namespace daisy::test_ring
