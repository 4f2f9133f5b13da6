// The long-lived head: its room, its model, plan previews and the prefix cache's slots
// (session.h); a turn itself is in turn.cc.
#include "session.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>

#include "daisy/head.h"
#include "daisy/log.h"
#include "daisy/memory.h"

namespace daisy {

using head::Clock;
using head::Since;

namespace {}  // namespace

HeadSession::Impl::~Impl() {
  stopping = true;
  if (idle.joinable()) idle.join();
  if (member) member->Leave();  // no join after the bye: the room drops this head now
}

void HeadSession::Impl::IdleLoop() {
  while (!stopping.load()) {
    // Stale replies of a finished turn are dropped here; a turn waits for the poll to end.
    if (turns.RunIfIdle([this] { (void)room->Poll(50, 0); }, std::chrono::milliseconds(100)))
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

Status HeadSession::Impl::CheckHeld(const TurnQueue::Ticket* held) const {
  if (held && !turns.Holds(*held))
    return FailedPrecondition("Bug: a turn was passed that does not hold this head's ring");
  return Status::Ok();
}

// The host approves this head's key (over HTTP, or in this process) before the rendezvous
// admits its ZeroMQ connection; then the head waits to see itself in the room's list.
Status HeadSession::Impl::JoinRoom() {
  DAISY_RETURN_IF_ERROR(member->Admit());
  const auto start = Clock::now();
  auto last_join = start;  // the heartbeat thread sent the first join
  while (Since(start) < 10) {
    if (Since(last_join) > 1.0) {  // sooner than the heartbeat thread's every 5 s, while joining
      member->SendJoin(500);
      last_join = Clock::now();
    }
    room->Poll(100, 0);
    if (room->Has(id())) break;
  }
  if (!room->Has(id()))
    return Unavailable("no answer from the rendezvous at " + o.rendezvous +
                       " within 10 s (is `daisychain serve` running, and has the host approved this device?)");
  // Let the list settle: devices already in the room are all in the first answer.
  const auto settle = Clock::now();
  while (Since(settle) < 0.3) room->Poll(50, 0);
  joined = true;
  return Status::Ok();
}

// A split over `want` devices waits (o.wait_s at most) until that many are in the room.
Status HeadSession::Impl::WaitForDevices(int want, const std::function<void(const std::string&)>& say) {
  const auto start = Clock::now();
  auto count = [&] {
    int n = 0;
    for (const auto& p : room->peers()) {
      const bool excluded =
          std::find(o.exclude_devices.begin(), o.exclude_devices.end(), p.hello.device_id) != o.exclude_devices.end();
      if (p.hello.device_id == id() || ((p.hello.capabilities & wire::kCapCompute) && !excluded)) ++n;
    }
    return n;
  };
  if (count() < want) say("waiting for " + std::to_string(want) + " devices in room '" + o.room + "'");
  while (count() < want && Since(start) < o.wait_s) room->Poll(100, 0);
  if (count() < want)
    return Unavailable("a split over " + std::to_string(want) + " devices: only " + std::to_string(count()) +
                       " device(s) in room '" + o.room + "' after " + std::to_string(static_cast<int>(o.wait_s)) +
                       " s");
  return Status::Ok();
}

Result<ModelView> HeadSession::Impl::Load(const std::string& src, int want_ctx, const TurnQueue::Ticket* held) {
  DAISY_RETURN_IF_ERROR(CheckHeld(held));
  DAISY_ASSIGN_OR_RETURN(std::unique_ptr<ModelSource> s, OpenModelSource(src, o.hub));
  DAISY_ASSIGN_OR_RETURN(ModelInfo mi, LoadModelInfo(*s));
  if (!mi.index.AllHeadersLoaded()) DAISY_RETURN_IF_ERROR(mi.index.LoadAllHeaders(*s));
  DAISY_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::Load(*s));
  const int c = want_ctx > 0 ? want_ctx : DefaultContext(mi.spec);
  DAISY_RETURN_IF_ERROR(CheckContext(mi.spec, c));
  ModelView v;
  v.source = src;
  v.model_id = s->ModelId();
  v.revision = s->Revision();
  v.spec = mi.spec;
  v.parameters = mi.index.ParameterCount();
  for (const auto& t : mi.index.tensors()) v.weight_bytes += t.bytes;
  v.ctx = c;
  TurnQueue::Ticket own;
  if (!held) own = TakeTurn();
  std::lock_guard<std::mutex> state(state_mu);
  model_hash = ModelHashOf(*s, mi.index);
  spec_hash = SpecHash(mi.spec);
  ctx = c;
  source = std::move(s);
  info = std::make_shared<const ModelInfo>(std::move(mi));
  tokenizer = std::make_shared<const Tokenizer>(std::move(tok));
  view = v;
  slots.clear();
  head_weights.reset();
  verify_pipeline.reset();
  audit_weights.clear();
  return v;
}

// The lap timeout: kLapSlack times what the plan predicts for the most positions in flight
// at once (one prefill chunk per stage), never below the floor o.lap_timeout_s.
double HeadSession::Impl::LapTimeout(double est_seconds_per_token, int positions_in_flight) const {
  constexpr double kLapSlack = 20;
  const double predicted = std::isfinite(est_seconds_per_token) ? est_seconds_per_token * positions_in_flight : 0;
  return std::max(o.lap_timeout_s, kLapSlack * predicted);
}

Result<Plan> HeadSession::Impl::PlanNow(int attempt, std::optional<int> stages_wanted, bool verify) const {
  std::shared_ptr<const ModelInfo> mi;
  int c = 0;
  {
    std::lock_guard<std::mutex> state(state_mu);
    mi = info;
    c = ctx;
  }
  if (!mi) return FailedPrecondition("no model is loaded");
  const ModelSpec& spec = mi->spec;
  const wire::Hello& h = hello();
  std::vector<DeviceReport> devices = {{id(), h.name, h.gemms_per_s, h.free_memory, h.probe_hash, h.backend,
                                        member->address(), wire::IsRelayAddress(member->address())}};
  std::vector<std::string> notes;
  for (const auto& p : room->peers()) {
    if (p.hello.device_id == id() || !(p.hello.capabilities & wire::kCapCompute)) continue;
    if (std::find(o.exclude_devices.begin(), o.exclude_devices.end(), p.hello.device_id) != o.exclude_devices.end())
      continue;
    if (suspects.count(p.hello.device_id)) {
      notes.push_back("left out " + p.hello.name + ": it failed during the last attempt");
      continue;
    }
    devices.push_back({p.hello.device_id, p.hello.name, p.hello.gemms_per_s, p.hello.free_memory, p.hello.probe_hash,
                       p.hello.backend, p.address, wire::IsRelayAddress(p.address)});
  }
  PlanOptions po;
  std::optional<int> want = stages_wanted ? stages_wanted : o.stages;
  if (want && *want <= 0) want.reset();  // 0: automatic
  if (attempt == 0) {
    po.stages = want;
    if (!stages_wanted) po.layer_counts = o.plan;
  } else if (want || o.plan) {
    // Fewer stages if devices are gone.
    const int wanted = o.plan && !stages_wanted ? static_cast<int>(o.plan->size()) : *want;
    po.stages = std::min<int>(wanted, static_cast<int>(devices.size()));
  }
  const PlanModel pm = PlanModelOf(*mi, c);
  if (verify) {
    po.head_reserve_bytes =
        pm.layer_bytes + 2ull * static_cast<uint64_t>(c) * static_cast<uint64_t>(spec.hidden) * sizeof(float);
    po.head_reserve_per_layer = pm.layer_bytes - PlanModelOf(*mi, 0).layer_bytes;
  }
  DAISY_ASSIGN_OR_RETURN(Plan plan, MakePlan(pm, devices, po));
  plan.notes.insert(plan.notes.begin(), notes.begin(), notes.end());
  for (auto& s : plan.stages)
    s.download_bytes = TensorBytes(mi->index, StageTensorNames(spec, s.first, s.end, s.device_id == id()));
  return plan;
}

Result<Plan> HeadSession::Impl::PreviewPlan(std::optional<int> stages_wanted) const {
  auto p = PlanNow(0, stages_wanted);
  if (p.ok() || p.status().code() == ErrorCode::kFailedPrecondition) return p;
  Plan v;  // a plan that cannot be made: say why, so the user sees it before any download
  v.fits = false;
  v.warning = p.status().message();
  return v;
}

head::HeadSlot& HeadSession::Impl::SlotFor(const TurnRequest& r) {
  head::HeadSlot* best = nullptr;
  if (!r.conversation.empty()) {
    const uint64_t key = XXH64(r.conversation.data(), r.conversation.size(), 0x434f4e56u /* "CONV" */);
    for (auto& s : slots)
      if (s.key == key) best = &s;
    if (!best) best = &NewSlot(key);
  } else {
    // No conversation named: the slot whose ids share the longest prefix with the prompt.
    size_t best_len = 0;
    for (auto& s : slots) {
      const size_t l = head::CommonPrefix(s.ids, r.prompt_ids);
      if (l > best_len || (l == best_len && best && l > 0 && s.last_used > best->last_used)) {
        best = &s;
        best_len = l;
      }
    }
    if (!best || best_len == 0)
      best = &NewSlot(
          XXH64(r.prompt_ids.data(), std::min<size_t>(r.prompt_ids.size(), 16) * sizeof(int32_t), use_clock + 1));
  }
  best->last_used = ++use_clock;
  return *best;
}

head::HeadSlot& HeadSession::Impl::NewSlot(uint64_t key) {
  if (static_cast<int>(slots.size()) >= std::max(1, o.cache_slots)) {
    auto lru = std::min_element(slots.begin(), slots.end(), [](const head::HeadSlot& a, const head::HeadSlot& b) {
      return a.last_used < b.last_used;
    });
    slots.erase(lru);
  }
  slots.push_back(head::HeadSlot{key, nullptr, {}, "", 0});
  return slots.back();
}

// Bytes the head holds now beside any verify: its slice and the KV caches of its slots.
uint64_t HeadSession::Impl::HeldNow() const {
  uint64_t held = head_weights ? head_weights->Bytes() : 0;
  for (const auto& s : slots)
    if (s.stage) held += s.stage->CacheBytes();
  return held;
}

HeadSession::HeadSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HeadSession::~HeadSession() = default;

Result<std::unique_ptr<HeadSession>> HeadSession::Start(const SessionOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  RoomMember::Options mo;
  mo.role = options.role;
  mo.name = options.name;
  mo.log_name = "head";
  mo.rendezvous = options.rendezvous;
  mo.room = options.room;
  mo.server_key = options.server_key;
  mo.admission = options.admission;
  mo.bind_host = options.bind_host;
  // The head serves no other head's hops, so it does not offer itself as compute.
  mo.capabilities = wire::kCapHead;
  mo.budget = MemoryBudget(options.max_memory);
  mo.unreachable_timeout_s = 10;
  DAISY_ASSIGN_OR_RETURN(impl->member, RoomMember::Create(mo));
  impl->room = std::make_unique<head::HeadRoom>(*impl->member);
  if (options.share_tokens) {
    DAISY_ASSIGN_OR_RETURN(impl->text_cast, head::TextCast::Start(impl->member->keys(), impl->member->boxes()));
  }
  if (options.join_at_start) {
    auto lock = impl->TakeTurn();
    DAISY_RETURN_IF_ERROR(impl->JoinRoom());
  }
  impl->audit_rng.seed(options.audit_seed != 0
                           ? options.audit_seed
                           : (static_cast<uint64_t>(std::random_device{}()) << 32 | std::random_device{}()));
  Impl* raw = impl.get();
  impl->idle = std::thread([raw] { raw->IdleLoop(); });
  return std::unique_ptr<HeadSession>(new HeadSession(std::move(impl)));
}

const std::string& HeadSession::device_id() const {
  return impl_->id();
}
std::vector<wire::Peer> HeadSession::Peers() const {
  return impl_->room->peers();
}
TurnQueue& HeadSession::turns() {
  return impl_->turns;
}
Result<ModelView> HeadSession::Load(const std::string& source, int ctx) {
  return impl_->Load(source, ctx, nullptr);
}
Result<ModelView> HeadSession::Load(const TurnQueue::Ticket& turn, const std::string& source, int ctx) {
  return impl_->Load(source, ctx, &turn);
}
std::optional<ModelView> HeadSession::model() const {
  std::lock_guard<std::mutex> state(impl_->state_mu);
  return impl_->view;
}
std::shared_ptr<const Tokenizer> HeadSession::tokenizer() const {
  std::lock_guard<std::mutex> state(impl_->state_mu);
  return impl_->tokenizer;
}
Result<Plan> HeadSession::PreviewPlan(std::optional<int> stages) const {
  return impl_->PreviewPlan(stages);
}
Result<HeadReport> HeadSession::Generate(const TurnRequest& request) {
  return impl_->Generate(request, nullptr);
}
Result<HeadReport> HeadSession::Generate(const TurnQueue::Ticket& turn, const TurnRequest& request) {
  return impl_->Generate(request, &turn);
}
void HeadSession::ClearCache() {
  auto lock = impl_->TakeTurn();
  impl_->slots.clear();
}

Result<HeadReport> RunHead(const HeadOptions& options) {
  SessionOptions so = options.session;
  so.cache_slots = 1;
  so.join_at_start = false;  // the model first: a bad SRC is refused before the room is joined
  DAISY_ASSIGN_OR_RETURN(std::unique_ptr<HeadSession> session, HeadSession::Start(so));
  DAISY_RETURN_IF_ERROR(session->Load(options.model, options.ctx).status());
  TurnRequest r;
  DAISY_ASSIGN_OR_RETURN(r.prompt_ids, session->tokenizer()->Encode(options.prompt, true));
  r.generate = options.generate;
  r.verify = options.verify;
  if (options.on_text) r.on_token = [&](int32_t, std::string_view text) { options.on_text(text); };
  r.on_status = options.on_status;
  r.on_retract = [&](size_t kept) {
    if (options.on_status)
      options.on_status("audit: the text above after generated token " + std::to_string(kept) +
                        " came from a corrupted hop; the replay continues from there");
  };
  return session->Generate(r);
}

}  // namespace daisy
