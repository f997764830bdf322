#include "lib/engine/run_summary.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "lib/engine/stats.h"

namespace vtoken::engine {
namespace {

double MeanOf(const std::vector<double>& v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

}  // namespace

std::vector<RequestRecord> ToRequestRecords(const EngineResult& result) {
  std::vector<RequestRecord> out;
  out.reserve(result.requests.size());
  for (const RequestResult& q : result.requests) {
    RequestRecord r;
    static_cast<RequestMetrics&>(r) = q;
    r.output_tokens = static_cast<int64_t>(q.output_tokens.size());
    if (!q.live_per_group.empty()) {  // [n per layer], or [[n per KV head] per layer]
      nlohmann::json rows = nlohmann::json::array();
      for (const std::vector<int64_t>& row : q.live_per_group) {
        rows.push_back(row.size() == 1 ? nlohmann::json(row[0]) : nlohmann::json(row));
      }
      r.live_per_group = rows.dump();
    }
    out.push_back(r);
  }
  return out;
}

std::map<std::string, double> SummarizeRun(const EngineResult& r,
                                           const std::vector<double>& rouge_vs_native,
                                           const std::vector<double>& rouge_vs_reference) {
  std::map<std::string, double> s;
  std::vector<double> ttft, tpot, e2e, blocks, blocks_final, live_final, ideal_final;
  double output_tokens = 0;
  for (const RequestResult& q : r.requests) {
    ttft.push_back(q.ttft_s);
    if (q.output_tokens.size() > 1) tpot.push_back(q.tpot_s);
    e2e.push_back(q.e2e_s);
    blocks.push_back(q.blocks_mean);
    blocks_final.push_back(q.blocks_final);
    live_final.push_back(static_cast<double>(q.live_final));
    ideal_final.push_back(static_cast<double>(q.ideal_blocks_final));
    output_tokens += static_cast<double>(q.output_tokens.size());
  }
  s["requests"] = static_cast<double>(r.requests.size());
  s["output_tokens"] = output_tokens;
  s["wall_s"] = r.wall_s;
  s["throughput_tok_s"] = r.wall_s > 0 ? output_tokens / r.wall_s : 0;
  s["throughput_req_s"] = r.wall_s > 0 ? static_cast<double>(r.requests.size()) / r.wall_s : 0;
  for (const auto& [name, values] :
       {std::pair<const char*, const std::vector<double>*>{"ttft", &ttft},
        {"tpot", &tpot},
        {"e2e", &e2e}}) {
    const LatencySummary l = Summarize(*values);
    s[std::string(name) + "_p50"] = l.p50;
    s[std::string(name) + "_p95"] = l.p95;
    s[std::string(name) + "_p99"] = l.p99;
  }
  s["preemptions"] = static_cast<double>(r.preemptions);
  s["peak_running"] = r.peak_running;
  s["evictions"] = static_cast<double>(r.evictions);
  s["forks"] = static_cast<double>(r.forks);
  s["blocks_mean"] = MeanOf(blocks);
  s["blocks_final_mean"] = MeanOf(blocks_final);
  s["live_final_mean"] = MeanOf(live_final);
  s["ideal_final_mean"] = MeanOf(ideal_final);
  double waste = 0, waste_steps = 0, peak_allocated = 0;
  std::array<double, 4> hist{};
  double hist_total = 0;
  for (const StepRecord& st : r.steps) {
    peak_allocated = std::max(peak_allocated, static_cast<double>(st.allocated_blocks));
    if (st.allocated_blocks == 0) continue;
    waste += st.waste_ratio;
    ++waste_steps;
    for (int i = 0; i < 4; ++i) {
      hist[i] += static_cast<double>(st.hist[i]);
      hist_total += static_cast<double>(st.hist[i]);
    }
  }
  s["waste_ratio_mean"] = waste_steps > 0 ? waste / waste_steps : 0;
  s["peak_allocated_blocks"] = peak_allocated;
  // Per-layer / per-head runs count blocks of one KV group; these put every granularity on the
  // same scale (the bytes of a token-granularity block).
  const double groups = static_cast<double>(std::max(1, r.kv_groups));
  s["kv_groups"] = groups;
  s["peak_allocated_token_blocks"] = peak_allocated / groups;
  s["blocks_mean_token_blocks"] = MeanOf(blocks) / groups;
  s["ideal_final_mean_token_blocks"] = MeanOf(ideal_final) / groups;
  for (int i = 0; i < 4; ++i) {
    s["util_hist_" + std::to_string(i)] = hist_total > 0 ? hist[i] / hist_total : 0;
  }
  s["plans"] = static_cast<double>(r.plans);
  s["moves"] = static_cast<double>(r.moves);
  s["bytes_moved"] = static_cast<double>(r.bytes_moved);
  s["blocks_reclaimed"] = static_cast<double>(r.blocks_reclaimed);
  s["planner_s"] = r.planner_s;
  s["fence_waits"] = static_cast<double>(r.fence_waits);
  s["fence_s"] = r.fence_s;
  s["forward_s"] = r.forward_s;
  s["policy_s"] = r.policy_s;
  s["schedule_s"] = r.schedule_s;
  s["violations"] = static_cast<double>(r.violations);
  s["rouge_l_vs_native"] = MeanOf(rouge_vs_native);
  s["rouge_l_vs_reference"] = MeanOf(rouge_vs_reference);
  return s;
}

bool IsRequestTime(const std::string& key) {
  for (const char* prefix : {"throughput_", "ttft_", "tpot_", "e2e_"}) {
    if (key.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

void DropRequestTimes(std::map<std::string, double>& summary) {
  std::erase_if(summary, [](const auto& kv) { return IsRequestTime(kv.first); });
}

}  // namespace vtoken::engine
