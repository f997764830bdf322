// What an error about a sweep a result database lacks adds: the sweeps it has. Shared by
// `export --sweep` and `report`.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "lib/core/status.h"
#include "lib/engine/result_store.h"

namespace vtoken::cli {

// " (sweeps: a, b)", or " (it has no sweeps)".
inline StatusOr<std::string> KnownSweepsText(const engine::ResultStore& store) {
  VTOKEN_ASSIGN_OR_RETURN(std::vector<engine::RunRecord> all, store.ListRuns({}));
  std::set<std::string> sweeps;
  for (const engine::RunRecord& r : all) {
    if (!r.sweep.empty()) sweeps.insert(r.sweep);
  }
  std::string known;
  for (const std::string& s : sweeps) known += (known.empty() ? "" : ", ") + s;
  return known.empty() ? std::string(" (it has no sweeps)") : " (sweeps: " + known + ")";
}

}  // namespace vtoken::cli
