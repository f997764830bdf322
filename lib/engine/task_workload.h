// Task workloads (kind task): one request per instance of a long-context task (tasks.h), instance
// i at depth depths[i % size], wrapped in the chat template when asked, its question in the
// prompt or, under the query-agnostic protocol, in Request::question_tokens.
//
// Thread-safe: pure functions.
#pragma once

#include <vector>

#include "lib/core/status.h"
#include "lib/engine/workload.h"
#include "lib/model/io/tokenizer.h"

namespace vtoken::engine {

// The requests of kind task, with their arrivals. REQUIRES: ValidateWorkloadOptions(o).ok(),
// kind task. Errors: those of MakeTaskInstance, and InvalidArgument naming context_tokens when a
// request with the chat template and its answer exceeds max_total_tokens (> 0).
StatusOr<std::vector<Request>> TaskRequests(const WorkloadOptions& o,
                                            const model::Tokenizer& tokenizer);

}  // namespace vtoken::engine
