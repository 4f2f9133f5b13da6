// Range planning and tensor fetching: a stage's tensors cost about one request per file.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "daisy/safetensors.h"

namespace daisy {

std::vector<ByteRange> CoalesceRanges(std::vector<ByteRange> ranges, uint64_t max_gap) {
  std::sort(ranges.begin(), ranges.end(), [](const ByteRange& a, const ByteRange& b) {
    return a.file != b.file ? a.file < b.file : a.offset < b.offset;
  });
  std::vector<ByteRange> out;
  for (auto& r : ranges) {
    if (r.length == 0) continue;
    if (!out.empty() && out.back().file == r.file) {
      ByteRange& last = out.back();
      const uint64_t last_end = last.offset + last.length;
      if (r.offset <= last_end || r.offset - last_end <= max_gap) {
        last.length = std::max(last_end, r.offset + r.length) - last.offset;
        continue;
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

Status FetchTensors(ModelSource& source, const TensorIndex& index, const std::vector<std::string>& names,
                    const TensorSink& sink, const ProgressFn& progress, uint64_t max_gap) {
  // Resolve and validate every tensor before the first byte is requested.
  std::vector<const TensorInfo*> infos;
  for (const auto& n : names) {
    const TensorInfo* t = index.Find(n);
    if (!t) return NotFound("tensor '" + n + "' is not in " + source.Describe());
    if (!IsWeightDType(t->dtype))
      return Unimplemented("tensor '" + n + "' has dtype " + std::string(DTypeName(t->dtype)) +
                           ", which is not supported for weights (F32, F16, BF16 are)");
    infos.push_back(t);
  }
  std::sort(infos.begin(), infos.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->file != b->file ? a->file < b->file : a->offset < b->offset;
  });
  infos.erase(std::unique(infos.begin(), infos.end()), infos.end());
  // Coalesce per file. The gap allowed is also capped at 1% of the bytes wanted from that
  // file, so a file whose layers are interleaved (stories260K groups tensors by kind, not
  // by layer) never makes a stage download another stage's layers.
  std::map<std::string, std::vector<ByteRange>> per_file;
  std::map<std::string, uint64_t> wanted_bytes;
  for (const TensorInfo* t : infos) {
    per_file[t->file].push_back({t->file, t->offset, t->bytes});
    wanted_bytes[t->file] += t->bytes;
  }
  std::vector<ByteRange> plan;
  for (auto& [file, ranges] : per_file) {
    for (auto& r : CoalesceRanges(std::move(ranges), std::min(max_gap, wanted_bytes[file] / 100))) plan.push_back(std::move(r));
  }

  TransferProgress prog;
  for (const auto& r : plan) prog.bytes_total += r.length;
  const auto start = std::chrono::steady_clock::now();
  auto report = [&] {
    if (!progress) return;
    prog.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress(prog);
  };
  report();

  size_t next = 0;  // next tensor (in infos order) to complete
  std::map<std::string, std::unique_ptr<ByteSource>> open;
  for (const auto& r : plan) {
    auto& file = open[r.file];
    if (!file) {
      DAISY_ASSIGN_OR_RETURN(file, source.OpenFile(r.file));
    }
    uint64_t pos = r.offset;  // absolute file offset of the next byte to arrive
    std::vector<uint8_t> buf;  // bytes of the tensor being assembled
    std::vector<float> values;
    Status st = file->ReadStream(r.offset, r.length, [&](std::span<const uint8_t> chunk) -> Status {
      size_t used = 0;
      while (used < chunk.size()) {
        if (next >= infos.size() || infos[next]->file != r.file || infos[next]->offset >= r.offset + r.length) {
          used = chunk.size();  // trailing gap bytes
          break;
        }
        const TensorInfo& t = *infos[next];
        if (t.bytes == 0) {  // nothing to wait for
          values.clear();
          DAISY_RETURN_IF_ERROR(sink(t, values));
          ++next;
          continue;
        }
        const uint64_t here = pos + used;
        if (here < t.offset) {  // gap bytes before the tensor
          used += static_cast<size_t>(std::min<uint64_t>(t.offset - here, chunk.size() - used));
          continue;
        }
        const uint64_t have = here - t.offset;
        const size_t take = static_cast<size_t>(std::min<uint64_t>(t.bytes - have, chunk.size() - used));
        if (have == 0) buf.clear(), buf.reserve(static_cast<size_t>(t.bytes));
        buf.insert(buf.end(), chunk.begin() + static_cast<std::ptrdiff_t>(used),
                   chunk.begin() + static_cast<std::ptrdiff_t>(used + take));
        used += take;
        if (buf.size() == t.bytes) {
          values.assign(static_cast<size_t>(t.Elements()), 0.0f);
          DAISY_RETURN_IF_ERROR(WidenToF32(t.dtype, buf, values));
          DAISY_RETURN_IF_ERROR(sink(t, values));
          buf.clear();
          buf.shrink_to_fit();
          ++next;
        }
      }
      pos += chunk.size();
      prog.bytes_done += chunk.size();
      report();
      return Status::Ok();
    });
    if (!st.ok()) return st.WithContext("fetching " + r.file + " bytes " + std::to_string(r.offset) + ".." + std::to_string(r.offset + r.length));
  }
  // Zero-byte tensors not covered by any range.
  while (next < infos.size()) {
    if (infos[next]->bytes != 0) return Internal("Bug: tensor '" + infos[next]->name + "' was not delivered");
    DAISY_RETURN_IF_ERROR(sink(*infos[next], {}));
    ++next;
  }
  return Status::Ok();
}

}  // namespace daisy
