// JSONL workloads (kind jsonl): requests read from a file of JSON objects, one a line or one JSON
// array of them, in the simple, ShareGPT or LongBench format (WorkloadOptions::jsonl_path says
// which fields each has), each cut to max_total_tokens as WorkloadOptions::truncate says.
//
// Thread-safe: pure functions.
#pragma once

#include <vector>

#include "lib/core/status.h"
#include "lib/engine/workload.h"
#include "lib/model/io/tokenizer.h"

namespace vtoken::engine {

// Reads up to o.num_requests requests (0: all) of o.jsonl_path, ids 0, 1, ... in file order,
// without arrivals or the chat template. REQUIRES: ValidateWorkloadOptions(o).ok(), kind jsonl.
// Errors: NotFound for an unreadable file; DataLoss for a malformed line or element (naming the
// file and the 1-based line or 0-based element) or a file without requests.
StatusOr<std::vector<Request>> ReadJsonl(const WorkloadOptions& o,
                                         const model::Tokenizer& tokenizer);

}  // namespace vtoken::engine
