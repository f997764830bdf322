#include "lib/sim/signal_trace.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

namespace vtoken::sim {
namespace {

constexpr char kMagic[8] = {'V', 'T', 'S', 'I', 'G', 'T', 'R', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint8_t kRecordTag = 1;

class Writer {
 public:
  template <typename T>
  void Put(const T& v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    buf.insert(buf.end(), p, p + sizeof(T));
  }
  void PutString(const std::string& s) {
    Put(static_cast<uint32_t>(s.size()));
    buf.insert(buf.end(), s.begin(), s.end());
  }
  template <typename T>
  void PutArray(const std::vector<T>& v) {
    const auto* p = reinterpret_cast<const char*>(v.data());
    buf.insert(buf.end(), p, p + v.size() * sizeof(T));
  }
  std::vector<char> buf;
};

class Reader {
 public:
  Reader(const std::vector<char>& data, const std::string& path) : data_(data), path_(path) {}
  template <typename T>
  Status Get(T& v) {
    if (data_.size() - pos_ < sizeof(T)) return Truncated();
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status GetString(std::string& s) {
    uint32_t n = 0;
    VTOKEN_RETURN_IF_ERROR(Get(n));
    if (data_.size() - pos_ < n) return Truncated();
    s.assign(data_.data() + pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  template <typename T>
  Status GetArray(std::vector<T>& v, uint32_t n) {
    if ((data_.size() - pos_) / sizeof(T) < n) return Truncated();
    v.resize(n);
    std::memcpy(v.data(), data_.data() + pos_, size_t{n} * sizeof(T));
    pos_ += size_t{n} * sizeof(T);
    return Status::Ok();
  }
  bool done() const { return pos_ == data_.size(); }
  Status Truncated() const {
    return DataLossError(path_ + ": signal trace truncated at byte " + std::to_string(pos_));
  }

 private:
  const std::vector<char>& data_;
  const std::string& path_;
  size_t pos_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<SignalTraceWriter>> SignalTraceWriter::Create(const std::string& path,
                                                                       const std::string& model) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return InvalidArgumentError("cannot write signal trace " + path + ": " + std::strerror(errno));
  }
  std::unique_ptr<SignalTraceWriter> w(new SignalTraceWriter(f, path));
  Writer header;
  header.buf.insert(header.buf.end(), kMagic, kMagic + sizeof(kMagic));
  header.Put(kVersion);
  header.PutString(model);
  if (std::fwrite(header.buf.data(), 1, header.buf.size(), f) != header.buf.size()) {
    return InvalidArgumentError("cannot write signal trace " + path + ": " + std::strerror(errno));
  }
  return w;
}

SignalTraceWriter::~SignalTraceWriter() { Close().IgnoreError(); }

Status SignalTraceWriter::Append(const SignalRecord& r) {
  if (f_ == nullptr) return FailedPreconditionError("signal trace " + path_ + " is closed");
  Writer w;
  w.Put(kRecordTag);
  w.PutString(r.mode);
  w.Put(r.request);
  w.Put(r.num_new);
  w.Put(r.next_token);
  w.Put(static_cast<uint32_t>(r.positions.size()));
  w.PutArray(r.positions);
  w.PutArray(r.attn);
  w.PutArray(r.key_norm);
  if (std::fwrite(w.buf.data(), 1, w.buf.size(), f_) != w.buf.size()) {
    return InvalidArgumentError("cannot write signal trace " + path_ + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

Status SignalTraceWriter::Close() {
  if (f_ == nullptr) return Status::Ok();
  const bool ok = std::fflush(f_) == 0;
  const int err = errno;
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok || !closed) {
    return InvalidArgumentError("cannot write signal trace " + path_ + ": " + std::strerror(err));
  }
  return Status::Ok();
}

StatusOr<SignalTrace> ReadSignalTrace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("signal trace " + path + " not found");
  const std::vector<char> data((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
  if (data.size() < sizeof(kMagic) || std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
    return DataLossError(path + ": not a vtoken signal trace (bad magic)");
  }
  Reader r(data, path);
  char magic[sizeof(kMagic)];
  for (char& c : magic) VTOKEN_RETURN_IF_ERROR(r.Get(c));
  uint32_t version = 0;
  VTOKEN_RETURN_IF_ERROR(r.Get(version));
  if (version != kVersion) {
    return DataLossError(path + ": signal trace version " + std::to_string(version) +
                         ", this build reads " + std::to_string(kVersion));
  }
  SignalTrace trace;
  VTOKEN_RETURN_IF_ERROR(r.GetString(trace.model));
  while (!r.done()) {
    const std::string where = path + ": record " + std::to_string(trace.records.size());
    uint8_t tag = 0;
    VTOKEN_RETURN_IF_ERROR(r.Get(tag));
    if (tag != kRecordTag) return DataLossError(where + " has an unknown tag");
    SignalRecord rec;
    uint32_t n = 0;
    VTOKEN_RETURN_IF_ERROR(r.GetString(rec.mode));
    VTOKEN_RETURN_IF_ERROR(r.Get(rec.request));
    VTOKEN_RETURN_IF_ERROR(r.Get(rec.num_new));
    VTOKEN_RETURN_IF_ERROR(r.Get(rec.next_token));
    VTOKEN_RETURN_IF_ERROR(r.Get(n));
    VTOKEN_RETURN_IF_ERROR(r.GetArray(rec.positions, n));
    VTOKEN_RETURN_IF_ERROR(r.GetArray(rec.attn, n));
    VTOKEN_RETURN_IF_ERROR(r.GetArray(rec.key_norm, n));
    if (rec.num_new < 1 || static_cast<uint32_t>(rec.num_new) > n) {
      return DataLossError(where + " has num_new " + std::to_string(rec.num_new) + " of " +
                           std::to_string(n) + " tokens");
    }
    for (uint32_t i = 0; i < n; ++i) {
      if (!std::isfinite(rec.attn[i]) || !std::isfinite(rec.key_norm[i]) ||
          (i > 0 && rec.positions[i] <= rec.positions[i - 1])) {
        return DataLossError(where + " has a non-finite signal or unordered positions");
      }
    }
    trace.records.push_back(std::move(rec));
  }
  return trace;
}

TraceSignals::TraceSignals(SignalTrace trace, std::string path)
    : trace_(std::move(trace)), path_(std::move(path)) {
  for (size_t i = 0; i < trace_.records.size(); ++i) {
    index_[trace_.records[i].mode][trace_.records[i].request].push_back(i);
  }
  BeginRun("naive");
}

void TraceSignals::BeginRun(const std::string& mode) {
  next_.clear();
  replay_ = nullptr;
  own_mode_ = false;
  for (const std::string& m : {mode, std::string("naive"), std::string("vtoken")}) {
    auto it = index_.find(m);
    if (it != index_.end()) {
      replay_ = &it->second;
      own_mode_ = m == mode;
      return;
    }
  }
}

StatusOr<const SignalRecord*> TraceSignals::NextRecord(int64_t request) {
  if (replay_ == nullptr) return FailedPreconditionError("trace " + path_ + " has no records");
  auto it = replay_->find(request);
  size_t& k = next_[request];
  if (it == replay_->end() || k >= it->second.size()) {
    return FailedPreconditionError("trace " + path_ + ": request " + std::to_string(request) +
                                   " has no record for its step " + std::to_string(k) +
                                   " (the trace was recorded with another workload or engine)");
  }
  return &trace_.records[it->second[k++]];
}

StatusOr<int32_t> TraceSignals::Token(int64_t request, int64_t position) {
  if (replay_ == nullptr || !own_mode_) return -1;
  const std::string who = "trace " + path_ + ": request " + std::to_string(request);
  const size_t k = next_[request];
  VTOKEN_ASSIGN_OR_RETURN(const SignalRecord* record, NextRecord(request));
  const SignalRecord& rec = *record;
  if (rec.positions.back() != position) {
    return FailedPreconditionError(
        who + ", step " + std::to_string(k) + ": the trace's step ends at position " +
        std::to_string(rec.positions.back()) + ", this one at " + std::to_string(position) +
        " (recorded with another workload or engine)");
  }
  return rec.next_token;
}

StatusOr<int32_t> TraceSignals::Fill(const SignalQuery& q, std::span<float> attn,
                                     std::span<float> key_norm) {
  const std::string who = "trace " + path_ + ": request " + std::to_string(q.request);
  const size_t k = next_[q.request] + 1;  // One past this step's record, as below.
  VTOKEN_ASSIGN_OR_RETURN(const SignalRecord* record, NextRecord(q.request));
  const SignalRecord& rec = *record;
  // Both position lists increase: merge.
  size_t j = 0;
  for (size_t i = 0; i < q.positions.size(); ++i) {
    while (j < rec.positions.size() && rec.positions[j] < q.positions[i]) ++j;
    if (j == rec.positions.size() || rec.positions[j] != q.positions[i]) {
      return FailedPreconditionError(who + ", step " + std::to_string(k - 1) + ": position " +
                                     std::to_string(q.positions[i]) +
                                     " is live here but not in the trace (recorded with another "
                                     "policy or budget)");
    }
    attn[i] = rec.attn[j];
    key_norm[i] = rec.key_norm[j];
  }
  return rec.next_token;
}

StatusOr<std::vector<model::RunnerOutput>> RecordingRunner::Forward(
    const std::vector<model::RunnerInput>& inputs) {
  // Every sampled step's signals, both of them, whether or not the caller wants them (a trace
  // serves any policy, and fit-signals fits the key norms too): a copy of the inputs only when
  // one of them must ask for more.
  constexpr uint8_t kBoth = kAttnSignal | kKeyNormSignal;
  const auto unwanted = [](const model::RunnerInput& in) {
    return in.sample && (!in.want_signals || (in.signals & kBoth) != kBoth);
  };
  std::vector<model::RunnerInput> all;
  if (std::any_of(inputs.begin(), inputs.end(), unwanted)) {
    all = inputs;
    for (model::RunnerInput& in : all) {
      if (!in.sample) continue;
      in.want_signals = true;
      in.signals = kBoth;
    }
  }
  VTOKEN_ASSIGN_OR_RETURN(std::vector<model::RunnerOutput> outputs,
                          inner_.Forward(all.empty() ? inputs : all));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const model::RunnerInput& in = inputs[i];
    if (!in.sample) continue;
    SignalRecord rec;
    rec.mode = mode_;
    rec.request = in.request;
    rec.num_new = static_cast<int32_t>(in.tokens.size());
    rec.next_token = outputs[i].next_token;
    for (int64_t p : in.context_positions) rec.positions.push_back(static_cast<int32_t>(p));
    for (int64_t p : in.positions) rec.positions.push_back(static_cast<int32_t>(p));
    rec.attn = outputs[i].attn;
    rec.key_norm = outputs[i].key_norm;
    if (rec.attn.size() != rec.positions.size() || rec.key_norm.size() != rec.positions.size()) {
      return InternalError("the runner returned " + std::to_string(rec.attn.size()) +
                           " signals for " + std::to_string(rec.positions.size()) + " tokens");
    }
    VTOKEN_RETURN_IF_ERROR(writer_.Append(rec));
    if (!in.want_signals) {  // What the caller asked for: no signals.
      outputs[i].attn.clear();
      outputs[i].key_norm.clear();
    }
  }
  return outputs;
}

}  // namespace vtoken::sim
