// SignalSource: where a simulated runner's policy signals come from. For one sequence's step it
// fills, per live token (context tokens in logical order, then the step's new tokens), the
// attention mass the token received and its key norm, aggregated as the real runner aggregates
// them (averaged over layers, heads and the last obs_window queries; the masses of one step sum
// to 1). Implementations: ParametricSignals (a generative model of attention) and TraceSignals
// (replay of signals recorded from a real model run).
//
// Not thread-safe: one source belongs to one runner.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "lib/core/status.h"

namespace vtoken::sim {

struct SignalQuery {
  int64_t request = 0;
  // Logical ids (RoPE positions) of the step's tokens: context then new, increasing.
  std::span<const int64_t> positions;
  int64_t num_new = 0;
  int32_t obs_window = 32;
  // KV groups (lib/core/types.h): signals of group `group` of `num_groups` (1: token granularity,
  // aggregated over every layer and head).
  int32_t group = 0;
  int32_t num_groups = 1;
};

class SignalSource {
 public:
  virtual ~SignalSource() = default;
  // Fills attn and key_norm (each positions.size() long) and returns the token a real run
  // sampled at this step when the source knows it (a trace), else -1. A trace that cannot answer
  // the query (no record left for the request, a position it never saw) is FailedPrecondition
  // naming the request.
  virtual StatusOr<int32_t> Fill(const SignalQuery& query, std::span<float> attn,
                                 std::span<float> key_norm) = 0;
  // The token a real run sampled at the request's step whose last new token is at `position`,
  // for a sampled step whose signals no policy reads: -1 when the source does not know it (the
  // default). A trace takes the step's record, as Fill would.
  virtual StatusOr<int32_t> Token(int64_t request, int64_t position) {
    (void)request;
    (void)position;
    return -1;
  }
  // A new run starts (of `mode`, "native" | "naive" | "vtoken"): per-request progress restarts.
  virtual void BeginRun(const std::string& mode) = 0;
  // What the source is, for run headers and labels ("parametric (fitted on vt-tiny)", ...).
  virtual std::string Describe() const = 0;
};

}  // namespace vtoken::sim
