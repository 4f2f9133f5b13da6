// The head: plan, assign, ready, laps, tokens, done, replay, verify.
#include "daisy/head.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <set>

#include "daisy/forward.h"
#include "daisy/log.h"
#include "daisy/model.h"
#include "daisy/net.h"
#include "daisy/node.h"
#include "daisy/plan.h"
#include "daisy/tokenizer.h"
#include "daisy/wire.h"

namespace daisy {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The head's view of the room, kept current while it waits.
class Room {
 public:
  Room(net::Endpoint& ep, std::string rendezvous, std::string id) : ep_(ep), rendezvous_(std::move(rendezvous)), id_(std::move(id)) {}

  void Beat() {
    if (Since(last_beat_) < 1.0) return;
    (void)ep_.Send(rendezvous_, wire::Message(wire::Heartbeat{0, id_}), 300);
    last_beat_ = Clock::now();
  }
  // Keeps the member list; other frames are returned to the caller.
  std::optional<wire::Message> Poll(int timeout_ms, int hidden) {
    Beat();
    auto f = ep_.Receive(timeout_ms);
    if (!f.ok() || !f->has_value()) return std::nullopt;
    auto m = wire::Decode(**f, hidden);
    if (!m.ok()) {
      LogWarning("head: refused a frame: " + m.status().message());
      last_refusal_ = m.status().message();
      return std::nullopt;
    }
    if (auto* p = std::get_if<wire::Peers>(&*m)) {
      peers_ = p->peers;
      seen_peers_ = true;
      return std::nullopt;
    }
    return std::move(*m);
  }
  bool Has(const std::string& device_id) const {
    for (const auto& p : peers_)
      if (p.hello.device_id == device_id) return true;
    return false;
  }
  const std::vector<wire::Peer>& peers() const { return peers_; }
  bool seen_peers() const { return seen_peers_; }
  std::string TakeRefusal() { return std::exchange(last_refusal_, ""); }

 private:
  net::Endpoint& ep_;
  std::string rendezvous_;
  std::string id_;
  Clock::time_point last_beat_ = Clock::now() - std::chrono::seconds(5);
  std::vector<wire::Peer> peers_;
  bool seen_peers_ = false;
  std::string last_refusal_;
};

// The rest of the ring as the head's forward pass sees it: one lap per call.
class NetLink final : public StageLink {
 public:
  NetLink(net::Endpoint& ep, Room& room, const std::vector<wire::StageEntry>& stages, int32_t seq, uint32_t model_hash,
          int hidden, double lap_timeout_s)
      : ep_(ep), room_(room), stages_(stages), seq_(seq), model_hash_(model_hash), hidden_(hidden), lap_timeout_s_(lap_timeout_s) {}

  Result<HiddenStates> Run(HiddenStates hidden) override {
    DAISY_RETURN_IF_ERROR(Submit(std::move(hidden)));
    return Collect();
  }

  // Sends one batch into the ring (stage 1) without waiting for it.
  daisy::Status Submit(HiddenStates hidden) override {
    wire::Activation a;
    a.seq = seq_;
    a.token_index = hidden.positions.front();
    a.next = 1;
    a.model_hash = model_hash_;
    a.values = std::move(hidden.values);
    a.act_hash = wire::ActHash(a.values);
    hidden.values.clear();
    daisy::Status sent = ep_.Send(stages_[1].address, wire::Message(a), 3000);
    if (!sent.ok()) {
      failed_device_ = stages_[1].device_id;
      return Unavailable("stage 1 (" + stages_[1].device_id.substr(0, 8) + ") is unreachable: " + sent.message());
    }
    hops_ += static_cast<int64_t>(stages_.size());
    ++laps_;
    if (pending_.empty()) busy_since_ = Clock::now();  // wall time with a batch in the ring
    pending_.push_back({std::move(hidden), Clock::now()});
    return daisy::Status::Ok();
  }

  // Waits for the oldest batch to come back on the RETURN leg.
  Result<HiddenStates> Collect() override {
    if (pending_.empty()) return Internal("Bug: Collect without a Submit");
    const auto start = pending_.front().sent;
    const int32_t want = pending_.front().hidden.positions.front();
    while (Since(start) < lap_timeout_s_) {
      auto m = room_.Poll(50, hidden_);
      for (size_t i = 1; i < stages_.size(); ++i)
        if (room_.seen_peers() && !room_.Has(stages_[i].device_id)) {
          failed_device_ = stages_[i].device_id;
          return Unavailable("stage " + std::to_string(i) + " (" + stages_[i].device_id.substr(0, 8) + ") left the ring");
        }
      if (std::string r = room_.TakeRefusal(); !r.empty()) return Unavailable("a returning activation was refused: " + r);
      if (!m) continue;
      if (auto* e = std::get_if<wire::ErrorMsg>(&*m)) return Unavailable("a stage failed: " + e->message);
      auto* back = std::get_if<wire::Activation>(&*m);
      if (!back || back->seq != seq_ || back->next != wire::kNextReturn) continue;  // stale or not ours
      if (back->token_index != want) continue;
      HiddenStates out = std::move(pending_.front().hidden);
      pending_.pop_front();
      if (back->model_hash != model_hash_) return Unavailable("the returning activation carries another model's hash");
      if (back->values.size() != static_cast<size_t>(out.n_tokens()) * static_cast<size_t>(hidden_))
        return Unavailable("the returning activation has the wrong size");
      out.values = std::move(back->values);
      if (pending_.empty()) lap_seconds_ += Since(busy_since_);  // overlapping laps count once
      return out;
    }
    return Unavailable("a lap stalled: no activation came back within " + std::to_string(static_cast<int>(lap_timeout_s_)) + " s");
  }

  int64_t hops() const { return hops_; }
  // The device that made the last lap fail, when it is known.
  const std::string& failed_device() const { return failed_device_; }
  int64_t laps() const { return laps_; }
  double lap_seconds() const { return lap_seconds_; }

 private:
  net::Endpoint& ep_;
  Room& room_;
  const std::vector<wire::StageEntry>& stages_;
  int32_t seq_;
  uint32_t model_hash_;
  int hidden_;
  double lap_timeout_s_;
  int64_t hops_ = 0;
  int64_t laps_ = 0;
  double lap_seconds_ = 0;
  std::string failed_device_;
  struct Pending {
    HiddenStates hidden;  // positions of the batch (values travel in the activation)
    Clock::time_point sent;
  };
  std::deque<Pending> pending_;
  Clock::time_point busy_since_;
};

class Head {
 public:
  explicit Head(const HeadOptions& o) : o_(o) {}

  Result<HeadReport> Run() {
    DAISY_ASSIGN_OR_RETURN(id_, DeviceId(DeviceHome(), "head"));
    DAISY_ASSIGN_OR_RETURN(ep_, net::Endpoint::Bind(o_.bind_host, 0));
    room_ = std::make_unique<Room>(*ep_, o_.rendezvous, id_);
    // A one-shot head serves no other head's hops, so it does not offer itself as compute.
    hello_ = MeasureHello(id_, o_.name, wire::kCapHead);

    // The model: config, tokenizer and headers only, before any device is asked for anything.
    DAISY_ASSIGN_OR_RETURN(source_, OpenModelSource(o_.model, o_.hub));
    DAISY_ASSIGN_OR_RETURN(ModelInfo info, LoadModelInfo(*source_));
    info_ = std::make_unique<ModelInfo>(std::move(info));
    const ModelSpec& spec = info_->spec;
    DAISY_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::Load(*source_));
    tokenizer_.emplace(std::move(tok));
    HeadReport report;
    DAISY_ASSIGN_OR_RETURN(report.prompt_ids, tokenizer_->Encode(o_.prompt, true));
    ctx_ = o_.ctx > 0 ? o_.ctx : DefaultContext(spec);
    DAISY_RETURN_IF_ERROR(CheckContext(spec, ctx_));
    model_hash_ = ModelHashOf(*source_, info_->index);
    spec_hash_ = SpecHash(spec);
    GenerateOptions gen = o_.generate;
    for (int id : spec.eos_ids) gen.stop_ids.push_back(id);

    DAISY_RETURN_IF_ERROR(JoinRoom());
    std::string last_error;
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (attempt > 0) {
        Say("re-planning around the devices still in the room and replaying the turn from the start");
        ++report.replays;
      }
      daisy::Status turn = Turn(report, gen, attempt);
      if (turn.ok()) break;
      if (turn.code() != ErrorCode::kUnavailable || attempt == 1) {
        if (attempt == 1) return Unavailable("the replay failed too: " + turn.message() + " (first failure: " + last_error + ")");
        return turn;
      }
      last_error = turn.message();
      Say("the turn failed: " + last_error);
    }
    (void)ep_->Send(o_.rendezvous, wire::Message(wire::Bye{id_}), 300);  // leave the room now
    if (o_.verify) DAISY_RETURN_IF_ERROR(Verify(report, gen));
    return report;
  }

 private:
  void Say(const std::string& line) {
    if (o_.on_status) o_.on_status(line);
  }

  daisy::Status JoinRoom() {
    const auto start = Clock::now();
    auto last_join = start - std::chrono::seconds(5);
    while (Since(start) < 10) {
      if (Since(last_join) > 1.0) {
        (void)ep_->Send(o_.rendezvous, wire::Message(wire::Join{o_.room, ep_->address(), hello_}), 500);
        last_join = Clock::now();
      }
      room_->Poll(100, 0);
      if (room_->Has(id_)) break;
    }
    if (!room_->Has(id_))
      return Unavailable("no answer from the rendezvous at " + o_.rendezvous + " within 10 s (is `daisychain serve` running, and has the host approved this device?)");
    if (o_.stages && *o_.stages > 1) {
      while (static_cast<int>(room_->peers().size()) < *o_.stages && Since(start) < o_.wait_s) room_->Poll(100, 0);
      if (static_cast<int>(room_->peers().size()) < *o_.stages)
        return Unavailable("--stages " + std::to_string(*o_.stages) + ": only " + std::to_string(room_->peers().size()) +
                           " device(s) in room '" + o_.room + "' after " + std::to_string(static_cast<int>(o_.wait_s)) + " s");
    } else {
      // Let the list settle: devices already in the room are all in the first answer.
      const auto settle = Clock::now();
      while (Since(settle) < 0.3) room_->Poll(50, 0);
    }
    return daisy::Status::Ok();
  }

  daisy::Status Turn(HeadReport& report, const GenerateOptions& gen, int attempt) {
    const ModelSpec& spec = info_->spec;
    // Plan over the devices in the room now; the head first.
    std::vector<DeviceReport> devices = {{id_, hello_.name, hello_.gemms_per_s, hello_.free_memory, hello_.probe_hash, hello_.backend}};
    std::map<std::string, std::string> address_of;
    for (const auto& p : room_->peers()) {
      address_of[p.hello.device_id] = p.address;
      if (p.hello.device_id == id_ || !(p.hello.capabilities & wire::kCapCompute)) continue;
      if (suspects_.count(p.hello.device_id)) {
        Say("plan: left out " + p.hello.name + ": it failed during the last attempt");
        continue;
      }
      devices.push_back({p.hello.device_id, p.hello.name, p.hello.gemms_per_s, p.hello.free_memory, p.hello.probe_hash, p.hello.backend});
    }
    PlanOptions po;
    if (attempt == 0) {
      po.stages = o_.stages;
      po.layer_counts = o_.plan;
    } else if (o_.stages || o_.plan) {
      // Fewer stages if devices are gone.
      const int wanted = o_.plan ? static_cast<int>(o_.plan->size()) : *o_.stages;
      po.stages = std::min<int>(wanted, static_cast<int>(devices.size()));
    }
    DAISY_ASSIGN_OR_RETURN(Plan plan, MakePlan(PlanModelFromSpec(spec, ctx_), devices, po));
    for (const auto& n : plan.notes) Say("plan: " + n);
    report.plan.clear();
    std::vector<wire::StageEntry> stages;
    for (const auto& s : plan.stages) {
      const bool is_head = s.device_id == id_;
      const uint64_t bytes = TensorBytes(info_->index, StageTensorNames(spec, s.first, s.end, is_head));
      report.plan.push_back({s.device_id, s.device_name, s.first, s.end, bytes});
      stages.push_back({s.device_id, is_head ? ep_->address() : address_of[s.device_id], s.first, s.end});
      char line[256];
      std::snprintf(line, sizeof line, "stage %zu: %-24s layers [%2d, %2d)  %8.2f MB%s", stages.size() - 1, s.device_name.c_str(),
                    s.first, s.end, static_cast<double>(bytes) / 1e6, is_head ? "  (head: embedding and LM head too)" : "");
      Say(line);
    }
    if (plan.est_seconds_per_token > 0) {
      char line[96];
      std::snprintf(line, sizeof line, "estimated compute per token: %.2f ms", 1e3 * plan.est_seconds_per_token);
      Say(line);
    }

    // Assign every other stage; each fetches its own layers itself.
    ++turn_;
    std::map<int, bool> ready;
    auto assignment_for = [&](size_t i) {
      wire::Assignment a;
      a.turn = turn_;
      a.model_id = source_->ModelId();
      a.revision = source_->Revision();
      a.spec_hash = spec_hash_;
      a.model_hash = model_hash_;
      a.ctx = ctx_;
      a.stages = stages;
      a.your_stage = static_cast<int32_t>(i);
      return a;
    };
    for (size_t i = 1; i < stages.size(); ++i) {
      daisy::Status sent = ep_->Send(stages[i].address, wire::Message(assignment_for(i)), 3000);
      if (!sent.ok()) {
        suspects_.insert(stages[i].device_id);
        return Unavailable("could not reach " + stages[i].device_id.substr(0, 8) + ": " + sent.message());
      }
    }
    // The head's own slice meanwhile.
    const auto& mine = plan.stages[0];
    if (!head_weights_ || head_weights_->first() != mine.first || head_weights_->end() != mine.end) {
      head_weights_.reset();
      DAISY_ASSIGN_OR_RETURN(StageWeights w, StageWeights::Load(*source_, *info_, mine.first, mine.end, true,
                                                                [&](const TransferProgress&) { room_->Beat(); }));
      head_weights_ = std::make_unique<StageWeights>(std::move(w));
    }
    if (stages.size() > 1) Say("waiting for " + std::to_string(stages.size() - 1) + " stage(s) to fetch their layers");
    const auto wait_start = Clock::now();
    auto last_busy = Clock::now() - std::chrono::seconds(10);
    bool said_busy = false;
    while (static_cast<size_t>(ready.size()) + 1 < stages.size()) {
      // A stage busy with another head's turn said so: ask again every second.
      if (said_busy && Since(last_busy) > 1.0) {
        last_busy = Clock::now();
        for (size_t i = 1; i < stages.size(); ++i)
          if (!ready.count(static_cast<int>(i))) (void)ep_->Send(stages[i].address, wire::Message(assignment_for(i)), 1000);
      }
      auto m = room_->Poll(100, 0);
      for (size_t i = 1; i < stages.size(); ++i)
        if (!room_->Has(stages[i].device_id)) {
          suspects_.insert(stages[i].device_id);
          return Unavailable("stage " + std::to_string(i) + " (" + stages[i].device_id.substr(0, 8) + ") left before it was ready");
        }
      if (Since(wait_start) > 1800) return Unavailable("stages were not ready after 30 minutes");
      if (!m) continue;
      if (auto* r = std::get_if<wire::Ready>(&*m)) ready[r->stage] = true;
      if (auto* e = std::get_if<wire::ErrorMsg>(&*m)) {
        if (e->code != wire::kErrBusy) return InvalidArgument("a stage refused its assignment: " + e->message);
        // Another head's turn holds the ring: wait for it, asking again every second.
        if (!said_busy) Say("waiting for the turn in progress (" + e->message + ")");
        said_busy = true;
        last_busy = Clock::now();
      }
    }
    if (stages.size() > 1) Say("all stages ready");

    NetLink link(*ep_, *room_, stages, static_cast<int32_t>(turn_), model_hash_, spec.hidden, o_.lap_timeout_s);
    HeadStage head(*head_weights_, ctx_, stages.size() > 1 ? &link : nullptr);
    Generator generator(head);
    TextStream stream(*tokenizer_, report.prompt_ids);
    std::vector<int32_t> ids;
    auto show = [&](const std::string& piece) {
      if (o_.on_text && !piece.empty()) o_.on_text(piece);
    };
    auto on_token = [&](int32_t id, std::span<const float>) {
      ids.push_back(id);
      show(stream.Add(id));
      const int32_t pos = static_cast<int32_t>(report.prompt_ids.size() + ids.size() - 1);
      for (size_t i = 1; i < stages.size(); ++i)
        (void)ep_->Send(stages[i].address, wire::Message(wire::Token{static_cast<int32_t>(turn_), pos, id}), 500);
    };
    GenerateOptions g = gen;
    if (stages.size() > 1) {
      // Chunks of 16 positions, two in the ring at once: a long prompt keeps every stage busy.
      if (g.prefill_chunk == 0) g.prefill_chunk = 16;
      g.prefill_in_flight = 2;
    }
    auto result = generator.Generate(report.prompt_ids, g, on_token);
    if (!result.ok()) {  // Unavailable: a ring fault, replayed once by Run() without that device
      if (!link.failed_device().empty()) suspects_.insert(link.failed_device());
      return result.status();
    }
    show(stream.Finish());
    for (size_t i = 1; i < stages.size(); ++i)
      (void)ep_->Send(stages[i].address, wire::Message(wire::Done{static_cast<int32_t>(turn_), result->finish_reason == FinishReason::kStop ? wire::FinishReason::kStop : wire::FinishReason::kLength}), 500);
    report.ids = result->ids;
    report.text = stream.Completion();
    report.finish_reason = std::string(FinishReasonName(result->finish_reason));
    report.prefill_seconds = result->prefill_seconds;
    report.decode_seconds = result->decode_seconds;
    report.tokens_per_s = result->decode_seconds > 0 ? result->decode_steps / result->decode_seconds : 0;
    report.ring_hops = link.hops();
    report.laps = link.laps();
    report.lap_seconds = link.lap_seconds();
    return daisy::Status::Ok();
  }

  daisy::Status Verify(HeadReport& report, const GenerateOptions& gen) {
    Say("verifying: running the whole model on this device");
    const int all[] = {info_->spec.n_layers};
    DAISY_ASSIGN_OR_RETURN(LocalPipeline local, LocalPipeline::Load(*source_, *info_, all, ctx_));
    Generator g(local.head());
    DAISY_ASSIGN_OR_RETURN(GenerateResult single, g.Generate(report.prompt_ids, gen));
    const auto& a = report.ids;
    const auto& b = single.ids;
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    if (i == a.size() && i == b.size()) {
      report.verified = true;
      report.verify_message = "VERIFIED: the distributed run and the single-device run produced identical token ids.";
    } else {
      report.verified = false;
      report.verify_message = "MISMATCH at generated position " + std::to_string(i) + ": distributed " +
                              (i < a.size() ? std::to_string(a[i]) : std::string("(end)")) + ", single-device " +
                              (i < b.size() ? std::to_string(b[i]) : std::string("(end)"));
    }
    return daisy::Status::Ok();
  }

  const HeadOptions& o_;
  std::string id_;
  std::unique_ptr<net::Endpoint> ep_;
  std::unique_ptr<Room> room_;
  wire::Hello hello_;
  std::unique_ptr<ModelSource> source_;
  std::unique_ptr<ModelInfo> info_;
  std::optional<Tokenizer> tokenizer_;
  std::unique_ptr<StageWeights> head_weights_;
  int ctx_ = 0;
  uint32_t model_hash_ = 0;
  uint64_t spec_hash_ = 0;
  uint32_t turn_ = 0;
  std::set<std::string> suspects_;  // devices that failed an attempt: not planned again
};

}  // namespace

Result<HeadReport> RunHead(const HeadOptions& options) {
  Head head(options);
  return head.Run();
}

}  // namespace daisy
