// Range planning and tensor fetching: a stage's tensors cost about one request per file.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

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

namespace {

// Whether FetchTensorBlocks reads ahead on a thread of its own: not in a wasm build without
// pthreads (tests/wasm, the browser node), which cannot start one.
#if defined(__EMSCRIPTEN__) && !defined(__EMSCRIPTEN_PTHREADS__)
constexpr bool kReadOnAThread = false;
#else
constexpr bool kReadOnAThread = true;
#endif

// Collects the bytes of one tensor into blocks of whole rows and hands each block on,
// widened to f32. Its two buffers are reused from block to block and tensor to tensor, so
// they never grow past one block. Not thread-safe.
class BlockAssembler {
 public:
  explicit BlockAssembler(const TensorBlockSink& sink) : sink_(sink) {}

  void Begin(const TensorInfo& t) {
    info_ = &t;
    rows_ = t.shape.empty() ? 1 : t.shape[0];
    row_elements_ = 1;
    for (size_t i = 1; i < t.shape.size(); ++i) row_elements_ *= t.shape[i];
    row_bytes_ = static_cast<size_t>(row_elements_) * DTypeSize(t.dtype);
    const int64_t per_block =
        static_cast<int64_t>(kTensorBlockBytes / sizeof(float)) / std::max<int64_t>(row_elements_, 1);
    block_rows_ = std::max<int64_t>(1, std::min(per_block, rows_));
    row_begin_ = 0;
    filled_ = 0;
  }
  // Bytes still needed to complete the current block.
  size_t Room() const { return BlockRows() * row_bytes_ - filled_; }
  void Append(std::span<const uint8_t> bytes) {
    const size_t want = BlockRows() * row_bytes_;
    if (raw_.size() < want) raw_.resize(want);
    std::memcpy(raw_.data() + filled_, bytes.data(), bytes.size());
    filled_ += bytes.size();
  }
  // Hands the completed block on; true when it was the tensor's last.
  Result<bool> Deliver() {
    const size_t n_rows = BlockRows();
    values_.resize(n_rows * static_cast<size_t>(row_elements_));
    const std::span<const uint8_t> raw(raw_.data(), filled_);
    DAISY_RETURN_IF_ERROR(WidenToF32(info_->dtype, raw, values_));
    TensorBlock b;
    b.info = info_;
    b.rows = rows_;
    b.row_elements = row_elements_;
    b.row_begin = row_begin_;
    b.n_rows = static_cast<int64_t>(n_rows);
    b.raw = raw;
    b.values = values_;
    DAISY_RETURN_IF_ERROR(sink_(b));
    row_begin_ += static_cast<int64_t>(n_rows);
    filled_ = 0;
    return row_begin_ == rows_;
  }
  // A tensor without bytes: one empty block.
  Status DeliverEmpty(const TensorInfo& t) {
    Begin(t);
    TensorBlock b;
    b.info = &t;
    b.rows = rows_;
    b.row_elements = row_elements_;
    b.n_rows = rows_;  // no bytes: zero rows, or rows of zero elements
    return sink_(b);
  }

 private:
  size_t BlockRows() const { return static_cast<size_t>(std::min(block_rows_, rows_ - row_begin_)); }
  const TensorBlockSink& sink_;
  const TensorInfo* info_ = nullptr;
  int64_t rows_ = 0, row_elements_ = 0, block_rows_ = 1, row_begin_ = 0;
  size_t row_bytes_ = 0;
  size_t filled_ = 0;
  std::vector<uint8_t> raw_;   // (block rows, row_bytes) of the file's bytes
  std::vector<float> values_;  // (block rows, row_elements)
};

// Bytes read ahead of the conversion, bounded to `capacity` (a chunk larger than that
// still passes when the pipe is empty). One producer (the reader thread), one consumer.
class PrefetchPipe {
 public:
  struct Chunk {
    size_t range = 0;  // index into the plan
    std::vector<uint8_t> bytes;
  };
  explicit PrefetchPipe(size_t capacity) : capacity_(capacity) {}

  // Copies a chunk in, waiting for room; Cancelled once the consumer has given up.
  Status Push(size_t range, std::span<const uint8_t> chunk) {
    std::unique_lock lock(mu_);
    room_.wait(lock, [&] { return cancelled_ || queued_ == 0 || queued_ + chunk.size() <= capacity_; });
    if (cancelled_) return Aborted("the conversion stopped");
    Chunk c;
    if (!spare_.empty()) c.bytes = std::move(spare_.back()), spare_.pop_back();
    c.range = range;
    c.bytes.assign(chunk.begin(), chunk.end());
    queued_ += chunk.size();
    chunks_.push_back(std::move(c));
    ready_.notify_one();
    return Status::Ok();
  }
  // The reader's last word: OK after the last range, or why it stopped.
  void Finish(Status status) {
    std::lock_guard lock(mu_);
    finished_ = true;
    status_ = std::move(status);
    ready_.notify_one();
  }
  void Cancel() {
    std::lock_guard lock(mu_);
    cancelled_ = true;
    room_.notify_one();
  }
  // The next chunk; false after the last one; the reader's error once everything before
  // it has been consumed (so blocks that arrived are still converted, in order).
  Result<bool> Pop(Chunk& out) {
    std::unique_lock lock(mu_);
    ready_.wait(lock, [&] { return finished_ || !chunks_.empty(); });
    if (chunks_.empty()) {
      if (!status_.ok()) return status_;
      return false;
    }
    out = std::move(chunks_.front());
    chunks_.pop_front();
    queued_ -= out.bytes.size();
    room_.notify_one();
    return true;
  }
  // Hands a consumed chunk's buffer back for reuse: no allocation per chunk.
  void Recycle(Chunk&& c) {
    std::lock_guard lock(mu_);
    if (spare_.size() < 4) spare_.push_back(std::move(c.bytes));
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable ready_, room_;
  std::deque<Chunk> chunks_;
  std::vector<std::vector<uint8_t>> spare_;
  size_t queued_ = 0;
  bool finished_ = false, cancelled_ = false;
  Status status_;
};

}  // namespace

Status FetchTensorBlocks(ModelSource& source, const TensorIndex& index, const std::vector<std::string>& names,
                         const TensorBlockSink& sink, const ProgressFn& progress, uint64_t max_gap) {
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
    for (auto& r : CoalesceRanges(std::move(ranges), std::min(max_gap, wanted_bytes[file] / 100)))
      plan.push_back(std::move(r));
  }

  TransferProgress prog;
  for (const auto& r : plan) prog.bytes_total += r.length;
  const auto start = std::chrono::steady_clock::now();
  bool reported = false;
  // Reports bytes consumed so far; the same count twice in a row is said once.
  auto report = [&](uint64_t done) {
    if (!progress || (reported && done == prog.bytes_done)) return;
    reported = true;
    prog.bytes_done = done;
    prog.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress(prog);
  };
  report(0);

  BlockAssembler blocks(sink);
  size_t next = 0;                                   // next tensor (in infos order) to complete
  bool started = false;                              // whether infos[next]'s first byte has been taken
  uint64_t range_base = 0;                           // bytes of the plan before the current range
  size_t ri = 0;                                     // the range the next chunk belongs to
  uint64_t pos = plan.empty() ? 0 : plan[0].offset;  // absolute file offset of the next byte to arrive
  // Turns the next chunk of the plan (bytes of range `range`, in order) into blocks.
  auto consume = [&](size_t range, std::span<const uint8_t> chunk) -> Status {
    while (ri < range) {  // the reader moved on: ranges are delivered whole and in order
      range_base += plan[ri].length;
      ++ri;
      pos = plan[ri].offset;
    }
    const ByteRange& r = plan[ri];
    size_t used = 0;
    while (used < chunk.size()) {
      if (next >= infos.size() || infos[next]->file != r.file || infos[next]->offset >= r.offset + r.length) {
        used = chunk.size();  // trailing gap bytes
        break;
      }
      const TensorInfo& t = *infos[next];
      if (t.bytes == 0) {  // nothing to wait for
        DAISY_RETURN_IF_ERROR(blocks.DeliverEmpty(t));
        ++next;
        continue;
      }
      const uint64_t here = pos + used;
      if (here < t.offset) {  // gap bytes before the tensor
        used += static_cast<size_t>(std::min<uint64_t>(t.offset - here, chunk.size() - used));
        continue;
      }
      if (!started) blocks.Begin(t), started = true;
      const size_t take = std::min(blocks.Room(), chunk.size() - used);
      blocks.Append(chunk.subspan(used, take));
      used += take;
      if (blocks.Room() == 0) {
        DAISY_ASSIGN_OR_RETURN(const bool done, blocks.Deliver());
        if (done) ++next, started = false;
        report(range_base + (pos + used - r.offset));
      }
    }
    pos += chunk.size();
    report(range_base + (pos - r.offset));
    return Status::Ok();
  };
  // Reads the plan's ranges in order, handing every chunk to `deliver`; a failed read is
  // named by its file and bytes, a failed `deliver` is returned as it is.
  auto read_plan = [&](const std::function<Status(size_t, std::span<const uint8_t>)>& deliver) -> Status {
    std::map<std::string, std::unique_ptr<ByteSource>> open;
    for (size_t rj = 0; rj < plan.size(); ++rj) {
      const ByteRange& r = plan[rj];
      auto& file = open[r.file];
      if (!file) {
        auto opened = source.OpenFile(r.file);
        if (!opened.ok()) return opened.status();
        file = std::move(*opened);
      }
      Status delivered;
      Status st = file->ReadStream(r.offset, r.length, [&](std::span<const uint8_t> chunk) {
        delivered = deliver(rj, chunk);
        return delivered;
      });
      if (!delivered.ok()) return delivered;
      if (!st.ok()) {
        return st.WithContext("fetching " + r.file + " bytes " + std::to_string(r.offset) + ".." +
                              std::to_string(r.offset + r.length));
      }
    }
    return Status::Ok();
  };

  if (!kReadOnAThread) {
    // No threads (a wasm build without pthreads): each chunk is converted as it is read.
    DAISY_RETURN_IF_ERROR(read_plan(consume));
  } else {
    // The download runs one range ahead of the conversion: a thread reads the plan's ranges
    // into a bounded pipe while this thread turns blocks into their resident form, so a load
    // takes about max(download, conversion) instead of their sum. The sink and progress are
    // called on this thread only.
    PrefetchPipe pipe(kPrefetchBytes);
    std::thread reader([&] { pipe.Finish(read_plan([&](size_t rj, auto chunk) { return pipe.Push(rj, chunk); })); });
    // Whatever happens below, the reader is stopped and joined before returning.
    struct JoinReader {
      PrefetchPipe& pipe;
      std::thread& reader;
      ~JoinReader() {
        pipe.Cancel();
        reader.join();
      }
    } join_reader{pipe, reader};
    PrefetchPipe::Chunk piece;
    while (true) {
      DAISY_ASSIGN_OR_RETURN(const bool more, pipe.Pop(piece));
      if (!more) break;
      DAISY_RETURN_IF_ERROR(consume(piece.range, piece.bytes));
      pipe.Recycle(std::move(piece));
    }
  }
  // Zero-byte tensors not covered by any range.
  while (next < infos.size()) {
    if (infos[next]->bytes != 0) return Internal("Bug: tensor '" + infos[next]->name + "' was not delivered");
    DAISY_RETURN_IF_ERROR(blocks.DeliverEmpty(*infos[next]));
    ++next;
  }
  return Status::Ok();
}

Status FetchTensors(ModelSource& source, const TensorIndex& index, const std::vector<std::string>& names,
                    const TensorSink& sink, const ProgressFn& progress, uint64_t max_gap) {
  std::vector<float> values;
  return FetchTensorBlocks(
      source, index, names,
      [&](const TensorBlock& b) -> Status {
        if (b.first()) values.assign(static_cast<size_t>(b.info->Elements()), 0.0f);
        std::copy(b.values.begin(), b.values.end(),
                  values.begin() + static_cast<std::ptrdiff_t>(b.row_begin * b.row_elements));
        if (!b.last()) return Status::Ok();
        DAISY_RETURN_IF_ERROR(sink(*b.info, values));
        values.clear();
        values.shrink_to_fit();
        return Status::Ok();
      },
      progress, max_gap);
}

}  // namespace daisy
