// One turn on the head, phase by phase: plan, assign, load the head's slice, await ready,
// run the laps, finish; replayed once without a stage that fails, verified when asked.
#include <xxhash.h>

#include <algorithm>
#include <cstdio>

#include "daisy/log.h"
#include "daisy/memory.h"
#include "session.h"

namespace daisy {

using head::Clock;
using head::Since;
using head::TurnState;

namespace {

// Prompt positions per prefill chunk on a ring: small enough that the stages overlap well,
// large enough that each chunk's products run as GEMMs (bench/ring_bench.sh measures it).
// The pipelined prefill's chunk: about eight chunks per stage in flight keeps the pipeline's
// fill and drain short, and a chunk of 16 to 64 rows still runs its products as GEMMs
// (bench/ring_bench.sh measures it: PREFILL_CHUNK). 512 tokens on 2 stages of 1 thread, AMD
// EPYC: chunks of 32 gave x1.66-1.77 of 1 stage on both shapes, of 64 x1.33-1.46 on
// Qwen2.5-0.5B's (x1.72-1.86 on SmolLM's), of 16 x1.47-1.50.
int RingPrefillChunk(int positions, int in_flight) {
  const int per = (positions + 8 * in_flight - 1) / (8 * in_flight);
  return std::clamp(per, 16, 64);
}

// XXH64, not BLAKE2b: the tag guards against accidents (a stage's cache from another
// conversation); it is not evidence, which Verify's BLAKE2b step digests are.
uint64_t IdsTag(std::span<const int32_t> ids) {
  return XXH64(ids.data(), ids.size() * sizeof(int32_t), 0x50524546u /* "PREF" */);
}

std::string PlanSignature(const Plan& plan, int ctx) {
  std::string sig = std::to_string(ctx);
  for (const auto& s : plan.stages)
    sig += "|" + s.device_id + ":" + s.address + ":" + std::to_string(s.first) + "-" + std::to_string(s.end);
  return sig;
}

std::string StageName(const Plan& p, size_t i) {
  return p.stages[i].device_name + ", " + p.stages[i].device_id.substr(0, 8);
}

}  // namespace

TurnRequest HeadSession::Impl::SharedWithTheRoom(const TurnRequest& request, std::string& tail, bool& begun) {
  TurnRequest r = request;
  if (!text_cast) return r;
  // Every device but the heads (which show their own turns): stages and members outside the
  // plan alike, approved members all (the room's list holds no other).
  auto begin = [this, &begun] {
    if (begun) return;
    std::vector<wire::Peer> devices;
    for (const auto& p : room->peers())
      if (p.hello.device_id != id() && !(p.hello.capabilities & wire::kCapHead)) devices.push_back(p);
    text_cast->Begin(std::move(devices), member->options().rendezvous, member->server_key());
    begun = true;
  };
  r.on_token = [this, &tail, begin, inner = request.on_token](int32_t tid, std::string_view text) {
    if (inner) inner(tid, text);
    if (tid < 0) {
      tail += text;
      return;
    }
    begin();
    text_cast->Piece(tid, text);
  };
  r.on_retract = [this, &begun, inner = request.on_retract](size_t kept) {
    if (inner) inner(kept);
    if (begun) text_cast->Retract(kept);
  };
  return r;
}

// `held`: the caller's turn; nullptr: one is taken here.
Result<HeadReport> HeadSession::Impl::Generate(const TurnRequest& request, const TurnQueue::Ticket* held) {
  std::string tail;
  bool begun = false;
  const TurnRequest r = SharedWithTheRoom(request, tail, begun);
  struct Failed {  // a turn that streamed and then failed says so to the room
    head::TextCast* cast;
    const bool& begun;
    bool done = false;
    ~Failed() {
      if (cast && begun && !done) cast->Fail();
    }
  } failed{text_cast.get(), begun};
  DAISY_RETURN_IF_ERROR(CheckHeld(held));
  TurnQueue::Ticket own;
  if (!held) own = TakeTurn();
  if (!info) return FailedPrecondition("no model is loaded");
  if (r.prompt_ids.empty()) return InvalidArgument("the prompt has no tokens");
  auto say = [&](const std::string& line) {
    if (r.on_status) r.on_status(line);
  };
  if (!joined) DAISY_RETURN_IF_ERROR(JoinRoom());
  if (const std::optional<int> want = r.stages ? r.stages : o.stages; want && *want > 1)
    DAISY_RETURN_IF_ERROR(WaitForDevices(*want, say));
  HeadReport report;
  report.prompt_ids = r.prompt_ids;
  GenerateOptions gen = r.generate;
  for (int eos : info->spec.eos_ids) gen.stop_ids.push_back(eos);
  gen.lookahead = o.lookahead;
  suspects.clear();
  excluded_by_verdict = false;
  head::HeadSlot& slot = SlotFor(r);
  std::vector<int32_t> emitted;
  std::string last_error;
  ring_steps.clear();
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt > 0) {
      // A member that died is dropped by the rendezvous once its heartbeats have been
      // silent for net::kDeadAfterSeconds: wait that long (reading the room, and dropping
      // the failed attempt's late frames) so the new plan holds only members alive now.
      // An audit's verdict names stages that answered (they lied, they did not die): the
      // plan leaves them out, and no one need be waited for.
      if (excluded_by_verdict) {
        say("no wait for the room: the audit's verdict names stages that answered, and none died");
      } else {
        say("waiting " + std::to_string(static_cast<int>(o.settle_s)) + " s for the room to drop members that died");
        const auto settle = Clock::now();
        while (Since(settle) < o.settle_s) (void)room->Poll(50, 0);
      }
      say("re-planning around the devices still in the room and replaying the turn from the start");
      ++report.replays;
    }
    GenerateOptions g = gen;
    if (r.fresh_hooks) r.fresh_hooks(g);
    TurnState t{r, report, slot, emitted};
    t.attempt = attempt;
    Status turn_status = Turn(t, g);
    if (turn_status.ok()) break;
    // Whatever the caches hold now is not a finished turn's: start this slot afresh.
    slot.ids.clear();
    slot.plan_sig.clear();
    if (turn_status.code() != ErrorCode::kUnavailable || attempt == 1) {
      if (attempt == 1)
        return Unavailable("the replay failed too: " + turn_status.message() + " (first failure: " + last_error + ")");
      return turn_status;
    }
    last_error = turn_status.message();
    say("the turn failed: " + last_error);
  }
  if (begun) {  // the room's stream ends with the text, before a Verify
    failed.done = true;
    text_cast->End(tail);
  }
  if (!report.plan.empty()) report.plan[0].peak_rss_bytes = PeakRssBytes();
  if (r.verify) {
    GenerateOptions g = gen;
    if (r.fresh_hooks) r.fresh_hooks(g);
    // Verify's own peak: the high-water mark starts over from what the head holds now.
    const bool reset = ResetPeakRss();
    const auto started = Clock::now();
    DAISY_RETURN_IF_ERROR(Verify(report, g, say));
    report.verify_seconds = Since(started);
    if (reset) report.verify_peak_rss_bytes = PeakRssBytes();
    if (!report.plan.empty()) report.plan[0].peak_rss_bytes = std::max(report.plan[0].peak_rss_bytes, PeakRssBytes());
  }
  return report;
}

Status HeadSession::Impl::Turn(TurnState& t, GenerateOptions gen) {
  t.started = Clock::now();
  DAISY_RETURN_IF_ERROR(PlanTurn(t));
  DAISY_RETURN_IF_ERROR(Assign(t));
  DAISY_RETURN_IF_ERROR(LoadHeadSlice(t));
  DAISY_RETURN_IF_ERROR(AwaitReady(t));
  return RunLaps(t, std::move(gen));
}

// Plan: over the devices in the room now; says the plan, and how much of this
// conversation's caches it can keep (only under the same plan).
Status HeadSession::Impl::PlanTurn(TurnState& t) {
  DAISY_ASSIGN_OR_RETURN(t.plan, PlanNow(t.attempt, t.request.stages, t.request.verify));
  for (const auto& n : t.plan.notes) t.Say("plan: " + n);
  t.report.plan = t.plan.stages;
  for (size_t i = 0; i < t.plan.stages.size(); ++i) {
    const auto& s = t.plan.stages[i];
    char line[256];
    std::snprintf(line, sizeof line, "stage %zu: %-24s layers [%2d, %2d)  %8.2f MB%s", i, s.device_name.c_str(),
                  s.first, s.end, static_cast<double>(s.download_bytes) / 1e6,
                  i == 0 ? "  (head: embedding and LM head too)" : "");
    t.Say(line);
  }
  if (t.plan.est_seconds_per_token > 0) {
    char line[96];
    std::snprintf(line, sizeof line, "estimated compute per token: %.2f ms", 1e3 * t.plan.est_seconds_per_token);
    t.Say(line);
  }
  t.sig = PlanSignature(t.plan, ctx);
  // An audited turn starts from position 0: the auditor rebuilds each audited stage's cache.
  t.audit = o.audit_rate > 0 && t.plan.stages.size() > 1;
  const auto& prompt = t.request.prompt_ids;
  if (t.attempt == 0 && !t.audit && t.slot.plan_sig == t.sig && t.slot.stage) {
    size_t common = head::CommonPrefix(t.slot.ids, prompt);
    if (o.test_keep_extra > 0)  // tests only
      common = std::min(common + static_cast<size_t>(o.test_keep_extra), t.slot.ids.size());
    t.keep = static_cast<int>(std::min(common, prompt.size() - 1));
  }
  t.keep_tag = IdsTag(t.slot.ids);
  return Status::Ok();
}

wire::Assignment HeadSession::Impl::AssignmentFor(const TurnState& t, size_t stage) const {
  wire::Assignment a;
  a.turn = turn;
  a.model_id = source->ModelId();
  a.revision = source->Revision();
  a.spec_hash = spec_hash;
  a.model_hash = model_hash;
  a.ctx = ctx;
  a.stages = WireStages(t.plan);
  a.your_stage = static_cast<int32_t>(stage);
  a.cache_key = t.slot.key;
  a.keep = t.keep;
  a.keep_tag = t.keep_tag;
  a.audit = t.audit;
  return a;
}

// Assign: every other stage gets its layers (never weights) and fetches them itself; from
// now on only this turn's stages may answer the head.
Status HeadSession::Impl::Assign(TurnState& t) {
  std::vector<std::string> ids;
  for (size_t i = 1; i < t.plan.stages.size(); ++i) ids.push_back(t.plan.stages[i].device_id);
  room->SetStageDevices(ids);
  ++turn;
  for (size_t i = 1; i < t.plan.stages.size(); ++i) {
    const auto& s = t.plan.stages[i];
    Status sent = member->Send(s.address, wire::Message(AssignmentFor(t, i)), 3000);
    if (!sent.ok()) {
      suspects.insert(s.device_id);
      return Unavailable("could not reach " + s.device_id.substr(0, 8) + ": " + sent.message());
    }
  }
  return Status::Ok();
}

// The head's own slice, while the stages fetch theirs.
Status HeadSession::Impl::LoadHeadSlice(TurnState& t) {
  const auto& mine = t.plan.stages[0];
  if (!head_weights || head_weights->first() != mine.first || head_weights->end() != mine.end) {
    // Every slot's HeadStage points at the old weights: the caches go with them.
    for (auto& s : slots) {
      s.stage.reset();
      s.ids.clear();
      s.plan_sig.clear();
    }
    head_weights.reset();
    auto last = Clock::now() - std::chrono::seconds(1);
    const auto& on_progress = t.request.on_progress;
    DAISY_ASSIGN_OR_RETURN(
        StageWeights w, StageWeights::Load(*source, *info, mine.first, mine.end, true, [&](const TransferProgress& p) {
          if (on_progress && (Since(last) > 0.25 || p.bytes_done >= p.bytes_total)) {
            last = Clock::now();
            on_progress({0, id(), hello().name, std::min(p.bytes_done, p.bytes_total), p.bytes_total});
          }
        }));
    head_weights = std::make_unique<StageWeights>(std::move(w));
  }
  if (!t.slot.stage || t.slot.stage->ctx() != ctx) {
    t.slot.stage = std::make_unique<HeadStage>(*head_weights, ctx, nullptr);
    t.keep = 0;
  }
  return Status::Ok();
}

// Await ready. Every wait ends: a stage that leaves the room (its heartbeats stopped) ends it
// at once; one that is alive but reports no progress for load_stall_s, or stays busy with
// another head's turn for busy_wait_s, ends it with its name.
Status HeadSession::Impl::AwaitReady(TurnState& t) {
  const size_t n = t.plan.stages.size();
  if (n > 1) t.Say("waiting for " + std::to_string(n - 1) + " stage(s) to fetch their layers");
  head::ReadyWait w;
  w.start = Clock::now();
  w.last_busy = w.start - std::chrono::seconds(10);
  for (size_t i = 1; i < n; ++i) w.last_sign[static_cast<int>(i)] = w.resent[static_cast<int>(i)] = w.start;
  while (t.ready.size() + 1 < n) {
    ResendAssignments(t, w);
    auto m = room->Poll(100, 0);
    DAISY_RETURN_IF_ERROR(GiveUpIfStuck(t, w));
    if (m) DAISY_RETURN_IF_ERROR(OnWhileWaiting(t, w, *m));
  }
  if (n > 1) t.Say("all stages ready");
  t.report.ready_seconds = Since(t.started);
  // Links that broke before the laps are not the laps' fault: a handshake refused while a
  // stage had not yet heard of this head was retried by Send, and the assignment got there.
  (void)member->endpoint().TakeDropped();
  // Every stage must hold the prefix: start where the shortest kept cache ends.
  for (const auto& [stage, kept] : t.ready) t.keep = std::min<int>(t.keep, kept);
  t.slot.stage->Truncate(t.keep);
  if (t.keep > 0)
    t.Say("prefix cache: reusing " + std::to_string(t.keep) + " of " + std::to_string(t.request.prompt_ids.size()) +
          " prompt positions");
  return Status::Ok();
}

void HeadSession::Impl::ResendAssignments(const TurnState& t, head::ReadyWait& w) {
  const auto& stages = t.plan.stages;
  auto send = [&](size_t i) { (void)member->Send(stages[i].address, wire::Message(AssignmentFor(t, i)), 1000); };
  if (w.busy_since && Since(w.last_busy) > 3.0) w.busy_since.reset();  // the other turn ended
  // A stage busy with another head's turn said so: ask again every second.
  if (w.busy_since && Since(w.last_busy) > 1.0) {
    w.last_busy = Clock::now();
    for (size_t i = 1; i < stages.size(); ++i)
      if (!t.ready.count(static_cast<int>(i))) send(i);
  }
  // A stage not heard from at all may have dropped the assignment as from a stranger (its
  // list of the room was older than this head's join): send it again every 5 s.
  for (auto& [stage, at] : w.resent)
    if (w.last_sign.at(stage) == w.start && Since(at) > 5.0) {  // never heard from
      at = Clock::now();
      send(static_cast<size_t>(stage));
    }
}

Status HeadSession::Impl::GiveUpIfStuck(const TurnState& t, const head::ReadyWait& w) {
  const auto& stages = t.plan.stages;
  for (size_t i = 1; i < stages.size(); ++i)
    if (!room->Has(stages[i].device_id)) {
      suspects.insert(stages[i].device_id);
      return Unavailable("stage " + std::to_string(i) + " (" + StageName(t.plan, i) +
                         ") left before it was ready: its heartbeats stopped");
    }
  if (w.busy_since && Since(*w.busy_since) > o.busy_wait_s)
    return Unavailable("the ring stayed busy with another head's turn for " +
                       std::to_string(static_cast<int>(o.busy_wait_s)) + " s; try again later");
  for (const auto& [stage, at] : w.last_sign)
    if (!t.ready.count(stage) && Since(at) > o.load_stall_s) {
      suspects.insert(stages[static_cast<size_t>(stage)].device_id);
      return Unavailable("stage " + std::to_string(stage) + " (" + StageName(t.plan, static_cast<size_t>(stage)) +
                         ") reported no progress for " + std::to_string(static_cast<int>(o.load_stall_s)) +
                         " s while fetching its layers; giving up on it");
    }
  return Status::Ok();
}

// A stage's ready, progress or error while the head waits for every ready.
Status HeadSession::Impl::OnWhileWaiting(TurnState& t, head::ReadyWait& w, const wire::Message& m) {
  const auto& stages = t.plan.stages;
  const int from = room->StageOfSender(t.plan);
  if (from >= 1) w.last_sign[from] = Clock::now();
  if (const auto* rd = std::get_if<wire::Ready>(&m)) {
    if (rd->stage >= 1 && static_cast<size_t>(rd->stage) < stages.size() && rd->stage == from) {
      t.ready[rd->stage] = rd->kept;
      t.report.plan[static_cast<size_t>(rd->stage)].peak_rss_bytes = rd->peak_rss;
    }
  } else if (const auto* pg = std::get_if<wire::Progress>(&m)) {
    if (pg->turn == turn && pg->stage >= 1 && static_cast<size_t>(pg->stage) < stages.size() && t.request.on_progress) {
      const auto& s = stages[static_cast<size_t>(pg->stage)];
      t.request.on_progress({pg->stage, s.device_id, s.device_name, pg->bytes_done, pg->bytes_total});
    }
  } else if (const auto* e = std::get_if<wire::ErrorMsg>(&m)) {
    if (e->code == wire::ErrorKind::kBusy) {
      // Another head's turn holds the ring: wait for it, asking again every second.
      if (!w.busy_since) {
        t.Say("waiting for the turn in progress (" + e->message + ")");
        w.busy_since = Clock::now();
      }
      w.last_busy = Clock::now();  // asked again a second after this answer
    } else if (e->code == wire::ErrorKind::kAssignment) {
      return InvalidArgument("a stage refused its assignment: " + e->message);
    } else {
      // A late word about an earlier attempt's hop: not about this assignment.
      LogInfo("head: while waiting for ready, a stage said: " + e->message);
    }
  }
  return Status::Ok();
}

// Run the laps: prefill and decode through the ring, streaming each token as it is chosen
// and telling every stage.
Status HeadSession::Impl::RunLaps(TurnState& t, GenerateOptions gen) {
  const auto& stages = t.plan.stages;
  const TurnRequest& r = t.request;
  HeadReport& report = t.report;
  // Pipelined prefill: chunks (RingPrefillChunk), one per stage in the rest of the ring plus
  // one on its way, so every stage works on its own chunk while the head embeds and runs
  // the next; each stage still sees the chunks in position order.
  if (stages.size() > 1) {
    gen.prefill_in_flight = static_cast<int>(stages.size());
    if (gen.prefill_chunk == 0)
      gen.prefill_chunk = RingPrefillChunk(static_cast<int>(report.prompt_ids.size()) - t.keep, gen.prefill_in_flight);
  }
  // A lap is given up only when it takes far longer than the plan predicts for the
  // positions in flight, and never sooner than the floor.
  const double lap_timeout =
      LapTimeout(t.plan.est_seconds_per_token, std::max(gen.prefill_chunk, 1) * std::max(gen.prefill_in_flight, 2));
  head::NetLink link(*room, t.plan, static_cast<int32_t>(turn), model_hash, info->spec.hidden, lap_timeout);
  if (t.audit)
    link.EnableAudit({o.audit_rate, &audit_rng, source.get(), info.get(), ctx, &audit_weights, &member->keys()});
  t.slot.stage->set_link(stages.size() > 1 ? &link : nullptr);
  struct Unlink {
    HeadStage* s;
    ~Unlink() { s->set_link(nullptr); }
  } unlink{t.slot.stage.get()};
  Generator generator(*t.slot.stage);
  TextStream stream(*tokenizer, report.prompt_ids);
  std::vector<int32_t> ids;
  bool diverged = false;
  auto on_token = [&](int32_t tid, std::span<const float>) {
    ids.push_back(tid);
    const std::string piece = stream.Add(tid);
    if (ids.size() > t.emitted.size()) {
      t.emitted.push_back(tid);
      if (r.on_token) r.on_token(tid, piece);
    } else if (t.emitted[ids.size() - 1] != tid) {
      diverged = true;  // a replay must give the same ids; refuse to stream a different text
    }
  };
  gen.first_position = t.keep;
  // An audited turn re-runs hops from each stage's kept inputs in position order, which a
  // rewind over rejected drafts would break: it decodes one position per lap.
  if (t.audit) gen.lookahead = 0;
  // Only a verified turn digests its steps: two BLAKE2b passes over the logits per token
  // would otherwise sit in every token loop for nothing.
  std::vector<head::StepDigest> step_digests;
  if (r.verify) head::DigestSteps(gen, step_digests);
  const auto started = Clock::now();
  auto result = generator.Generate(report.prompt_ids, gen, on_token);
  const double wall = Since(started);
  report.audited_hops += link.audited();
  report.recomputed_hops += link.recomputed();
  if (!result.ok()) return LapsFailed(t, link, result.status());
  if (diverged) return DataLoss("the replay produced different token ids than the first attempt");
  ring_steps = std::move(step_digests);
  const std::string tail = stream.Finish();
  if (r.on_token && !tail.empty()) r.on_token(-1, tail);
  report.text = stream.Completion();
  Finish(t, *result, link, wall);
  return Status::Ok();
}

// Laps that failed (Unavailable: a ring fault): the devices to leave out of the replay, and
// the tokens already shown that came after a corrupted hop, withdrawn.
Status HeadSession::Impl::LapsFailed(TurnState& t, const head::NetLink& link, Status failure) {
  if (!link.failed_device().empty()) suspects.insert(link.failed_device());
  if (!link.also_failed().empty()) suspects.insert(link.also_failed());
  excluded_by_verdict = link.bad_position().has_value();
  if (!link.bad_position()) return failure;
  // Tokens sampled from a corrupted position on are not trusted: the replay gives them anew.
  t.report.audit_failures.push_back(failure.message());
  const int64_t trusted =
      std::max<int64_t>(0, *link.bad_position() - static_cast<int64_t>(t.report.prompt_ids.size()) + 1);
  if (static_cast<int64_t>(t.emitted.size()) > trusted) {
    t.Say("audit: " + std::to_string(t.emitted.size() - static_cast<size_t>(trusted)) +
          " token(s) already shown came after the corrupted hop; the replay replaces them");
    t.emitted.resize(static_cast<size_t>(trusted));
    if (t.request.on_retract) t.request.on_retract(t.emitted.size());
  }
  return failure;
}

// Finish: done to every stage (with what its cache now holds), the slot's new prefix, the
// report's figures, and each stage's own share of the turn.
void HeadSession::Impl::Finish(TurnState& t, const GenerateResult& result, const head::NetLink& link, double wall) {
  const auto& stages = t.plan.stages;
  HeadReport& report = t.report;
  // What every stage's cache holds now: the prompt and the generated ids that were fed.
  std::vector<int32_t> fed = report.prompt_ids;
  fed.insert(fed.end(), result.ids.begin(),
             result.ids.begin() + static_cast<std::ptrdiff_t>(
                                      std::min<size_t>(result.ids.size(), static_cast<size_t>(result.decode_steps))));
  const uint64_t tag = IdsTag(fed);
  const auto reason =
      result.finish_reason == FinishReason::kStop ? wire::FinishReason::kStop : wire::FinishReason::kLength;
  for (size_t i = 1; i < stages.size(); ++i)
    (void)member->Send(
        stages[i].address,
        wire::Message(wire::Done{static_cast<int32_t>(turn), reason, static_cast<int32_t>(fed.size()), tag}), 500);
  if (t.slot.stage->length() == static_cast<int>(fed.size())) {
    t.slot.ids = std::move(fed);
    t.slot.plan_sig = t.sig;
  } else {
    t.slot.ids.clear();
    t.slot.plan_sig.clear();
  }
  report.ids = result.ids;
  report.finish_reason = std::string(FinishReasonName(result.finish_reason));
  report.prefill_seconds = result.prefill_seconds;
  report.decode_seconds = result.decode_seconds;
  report.tokens_per_s = result.decode_seconds > 0 ? result.decode_steps / result.decode_seconds : 0;
  report.ring_hops = link.hops();
  report.ring_positions = link.positions();
  report.reused_positions = t.keep;
  report.laps = link.laps();
  report.drafted = result.drafted;
  report.accepted = result.accepted;
  report.lap_seconds = link.lap_seconds();
  // Each stage's share: the others say after done; the head's is what the laps did not take.
  report.stage_latency.clear();
  const int64_t steps = static_cast<int64_t>(result.decode_laps) + 1;
  report.stage_latency.push_back({0, id(), hello().name, steps, std::max(0.0, wall - link.lap_seconds())});
  for (size_t i = 1; i < stages.size(); ++i)
    report.stage_latency.push_back({static_cast<int>(i), stages[i].device_id, stages[i].device_name, 0, 0});
  size_t got = 0;
  const auto stats_start = Clock::now();
  while (got + 1 < stages.size() && Since(stats_start) < 0.5) {
    auto m = room->Poll(20, 0);
    if (!m) continue;
    auto* st = std::get_if<wire::StageStats>(&*m);
    if (!st || st->seq != static_cast<int32_t>(turn) || st->stage < 1 ||
        static_cast<size_t>(st->stage) >= stages.size())
      continue;
    auto& l = report.stage_latency[static_cast<size_t>(st->stage)];
    if (l.hops == 0) ++got;
    l.hops = st->hops;
    l.compute_seconds = st->compute_seconds;
    auto& peak = report.plan[static_cast<size_t>(st->stage)].peak_rss_bytes;
    peak = std::max(peak, st->peak_rss);
  }
}

}  // namespace daisy
