// Turns an EngineResult into what the result store keeps: per-request records and
// the run's summary figures under stable names (docs/METRICS.md). Every figure is derived from the
// raw records, so a summary can always be recomputed from the database.
//
// Summary names (all double; seconds for times):
//   requests, output_tokens, wall_s, throughput_tok_s, throughput_req_s,
//   ttft_{p50,p95,p99}, tpot_{p50,p95,p99}, e2e_{p50,p95,p99},
//   preemptions, peak_running, evictions, forks (requests that shared their group's prefix),
//   blocks_mean (mean over requests of blocks held, time-averaged while running),
//   blocks_final_mean, live_final_mean, ideal_final_mean (ceil(live / block_size) at finish),
//   waste_ratio_mean (mean F over steps with allocated blocks), peak_allocated_blocks,
//   util_hist_{0,1,2,3} (fraction of allocated block-steps with utilization in [0,25), [25,50),
//   [50,75), [75,100] %),
//   plans, moves, bytes_moved, blocks_reclaimed, planner_s, fence_waits, fence_s, forward_s,
//   policy_s, schedule_s, violations,
//   rouge_l_vs_native, rouge_l_vs_reference (mean ROUGE-L F1; NaN when not computed).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "lib/engine/engine.h"
#include "lib/engine/result_store.h"

namespace vtoken::engine {

std::vector<RequestRecord> ToRequestRecords(const EngineResult& result);

// Whether a summary key is a figure that times requests (throughput_*, ttft_*, tpot_*, e2e_*).
bool IsRequestTime(const std::string& key);

// Removes the figures that time requests (IsRequestTime) from a summary: a run that restored its
// prompts' prefill (lib/engine/prefill_memo.h) did not time the model.
void DropRequestTimes(std::map<std::string, double>& summary);

// `rouge_vs_native` / `rouge_vs_reference`: per-request F1 scores, or empty when not computed.
std::map<std::string, double> SummarizeRun(const EngineResult& result,
                                           const std::vector<double>& rouge_vs_native,
                                           const std::vector<double>& rouge_vs_reference);

}  // namespace vtoken::engine
