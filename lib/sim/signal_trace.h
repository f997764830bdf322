// Signal traces: the policy signals of a real model run, recorded so a simulated run can replay
// them exactly (`vtoken-cli run --record-signals FILE`, then `[sim] attention = "trace:FILE"`).
//
// File format (little-endian, written by SignalTraceWriter):
//   header   "VTSIGTR1", u32 version (1), u32 length + model spec bytes
//   records  u8 1, u32 length + mode bytes, i64 request, i32 num_new, i32 next_token,
//            u32 n, then n x i32 positions, n x f32 attn, n x f32 key_norm
// One record per (run mode, request, sampled step), in the order they were produced: every step
// that samples a token, whether or not a policy read its signals (the recording computes them
// for every such step; traces written before 2026-12-03 hold only the steps a policy read, and
// none for native runs). Positions are the logical token ids of the step's live tokens (context,
// then new).
//
// Replay (TraceSignals) keeps, per mode and request, the records in order; a sampled step takes
// that request's next record: Fill when a policy reads its signals, looked up by position (the
// query may hold fewer tokens than the record, as it evicted more, but not a position the record
// lacks); Token otherwise (its sampled token only). A trace of run X replayed with X's
// configuration therefore gives X's signals and tokens at every step, and X's eviction decisions
// and block figures exactly. Not thread-safe.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/runner/model_runner.h"
#include "lib/sim/signal_source.h"

namespace vtoken::sim {

struct SignalRecord {
  std::string mode;
  int64_t request = 0;
  int32_t num_new = 0;
  int32_t next_token = -1;
  std::vector<int32_t> positions;
  std::vector<float> attn;
  std::vector<float> key_norm;
};

class SignalTraceWriter {
 public:
  // Creates (truncates) `path`. InvalidArgument naming the path when it cannot be written.
  static StatusOr<std::unique_ptr<SignalTraceWriter>> Create(const std::string& path,
                                                             const std::string& model);
  ~SignalTraceWriter();
  Status Append(const SignalRecord& record);
  // Flushes and closes; errors (disk full) name the path.
  Status Close();

 private:
  SignalTraceWriter(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  std::FILE* f_;
  std::string path_;
};

struct SignalTrace {
  std::string model;
  std::vector<SignalRecord> records;
};
// Reads a whole trace. NotFound for a missing file; DataLoss naming the path and record for a
// truncated or malformed one (bad magic, lengths past the end, non-finite signals).
StatusOr<SignalTrace> ReadSignalTrace(const std::string& path);

class TraceSignals final : public SignalSource {
 public:
  TraceSignals(SignalTrace trace, std::string path);

  StatusOr<int32_t> Fill(const SignalQuery& query, std::span<float> attn,
                         std::span<float> key_norm) override;
  // The sampled token of the request's next record, which must end at `position`; -1 when the
  // run replays another mode's records (their tokens are not this mode's).
  StatusOr<int32_t> Token(int64_t request, int64_t position) override;
  // Replays the records of `mode`; a mode the trace lacks replays naive's or vtoken's (they
  // evict the same tokens) for its signals, but not their tokens.
  void BeginRun(const std::string& mode) override;
  std::string Describe() const override { return "trace " + path_; }

 private:
  SignalTrace trace_;
  std::string path_;
  // Mode -> request -> indices into trace_.records, in order.
  std::map<std::string, std::map<int64_t, std::vector<size_t>>> index_;
  const std::map<int64_t, std::vector<size_t>>* replay_ = nullptr;
  bool own_mode_ = false;  // replay_ holds the run's own mode's records.
  // The request's next record in replay_, consumed; FailedPrecondition when there is none.
  StatusOr<const SignalRecord*> NextRecord(int64_t request);
  std::map<int64_t, size_t> next_;  // Request -> records consumed this run.
};

// A ModelRunner decorator that records every sampled step (RunnerInput::sample) to a trace: its
// signals, computed whether or not the caller wants them (RunnerInput::want_signals), and its
// token. The caller gets the outputs it asked for.
class RecordingRunner final : public model::ForwardingRunner {
 public:
  RecordingRunner(model::ModelRunner& inner, SignalTraceWriter& writer, std::string mode)
      : ForwardingRunner(inner), writer_(writer), mode_(std::move(mode)) {}

  StatusOr<std::vector<model::RunnerOutput>> Forward(
      const std::vector<model::RunnerInput>& inputs) override;

 private:
  SignalTraceWriter& writer_;
  std::string mode_;
};

}  // namespace vtoken::sim
