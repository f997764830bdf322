// The prefill memo's flags, shared by `run` and `sweep` (lib/engine/prefill_memo.h): every mode
// and every point of one invocation restores the prompt prefills an earlier run computed.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "lib/core/status.h"
#include "lib/engine/prefill_memo.h"

namespace vtoken::cli {

// The memo serves task workloads by default (their figure is accuracy); --prefill-memo serves
// every kind (then the runs that restore report no times), --no-prefill-memo none.
struct MemoArgs {
  bool on = false;
  bool off = false;
  std::string dir;  // empty: the system's temporary directory ($TMPDIR)
  // A persistent memo's directory (PrefillMemo::OpenPersistent): kept across invocations.
  std::string cache;
  double gib = 32;  // at most this much KV, and never the last GiB the directory's disk has free
};

void AddMemoFlags(CLI::App& cmd, MemoArgs& args);

// The memo the flags ask for; nullptr with --no-prefill-memo. A one-line error when its file
// cannot be made or read, --prefill-memo-gib is not positive or flags contradict each other. A
// --prefill-memo-cache that another process holds gives this invocation a memo of its own (a
// note on stderr).
StatusOr<std::unique_ptr<engine::PrefillMemo>> MakeMemo(const MemoArgs& args);

// Whether a run of workload kind `kind` uses the memo (when there is one).
bool MemoServes(const MemoArgs& args, const std::string& kind);

}  // namespace vtoken::cli
