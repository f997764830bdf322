#include <cstdio>
#include <filesystem>
#include <string>

#include "apps/vtoken-cli/commands/memo_flags.h"

namespace vtoken::cli {

void AddMemoFlags(CLI::App& cmd, MemoArgs& args) {
  cmd.add_flag("--prefill-memo", args.on,
               "Restore prompt prefills computed by an earlier run of this invocation for every "
               "workload kind, not only tasks (results are the same; restoring runs report no "
               "times)");
  cmd.add_flag("--no-prefill-memo", args.off,
               "Compute every prompt's prefill in every run, also for tasks");
  cmd.add_option("--prefill-memo-dir", args.dir,
                 "Directory of the prefill memo's (unlinked) file (default: $TMPDIR or /tmp)");
  cmd.add_option("--prefill-memo-cache", args.cache,
                 "Keep the prefill memo in this directory across invocations: a later run or "
                 "sweep restores the prefills it holds (same binary, model file and host)");
  cmd.add_option("--prefill-memo-gib", args.gib,
                 "KV the prefill memo keeps at most, in GiB (never the disk's last GiB)")
      ->capture_default_str();
}

StatusOr<std::unique_ptr<engine::PrefillMemo>> MakeMemo(const MemoArgs& args) {
  if (args.on && args.off) {
    return InvalidArgumentError("--prefill-memo and --no-prefill-memo contradict each other");
  }
  if (args.off && !args.cache.empty()) {
    return InvalidArgumentError("--prefill-memo-cache and --no-prefill-memo contradict each other");
  }
  if (args.off) return std::unique_ptr<engine::PrefillMemo>();
  if (!(args.gib > 0)) {
    return InvalidArgumentError("--prefill-memo-gib must be > 0, got " + std::to_string(args.gib));
  }
  if (!args.cache.empty() && !args.dir.empty()) {
    return InvalidArgumentError(
        "--prefill-memo-cache and --prefill-memo-dir contradict each "
        "other (the cache keeps its files in its own directory)");
  }
  // The memo's folder (the system's temporary folder by default) and its bound: --prefill-memo-gib,
  // never the disk's last GiB (a cache's KV stored earlier counts as free).
  std::error_code ec;
  std::string dir = !args.cache.empty() ? args.cache
                    : args.dir.empty()  ? std::filesystem::temp_directory_path(ec).string()
                                        : args.dir;
  if (dir.empty()) dir = "/tmp";
  const double gib = double(int64_t{1} << 30);
  double max_bytes = args.gib * gib;
  std::filesystem::create_directories(dir, ec);
  const std::filesystem::space_info space = std::filesystem::space(dir, ec);
  if (!ec) {
    double held = 0;
    if (!args.cache.empty()) {
      const auto size = std::filesystem::file_size(std::filesystem::path(dir) / "kv", ec);
      held = ec ? 0 : static_cast<double>(size);
    }
    max_bytes = std::min(max_bytes, held + static_cast<double>(space.available) - gib);
  }
  const int64_t bound = static_cast<int64_t>(std::max(0.0, max_bytes));
  if (args.cache.empty()) return engine::PrefillMemo::Create(dir, bound);
  StatusOr<std::unique_ptr<engine::PrefillMemo>> memo =
      engine::PrefillMemo::OpenPersistent(args.cache, bound);
  if (memo.ok()) {
    const engine::PrefillMemoStats& s = (*memo)->stats();
    std::fprintf(stderr, "prefill memo %s: %lld chunks (%.2f GiB of KV) from earlier invocations\n",
                 args.cache.c_str(), static_cast<long long>(s.chunks_loaded),
                 static_cast<double>(s.bytes_loaded) / gib);
    return memo;
  }
  if (memo.status().code() != StatusCode::kFailedPrecondition) return memo.status();
  std::fprintf(stderr, "vtoken: %s; this invocation keeps a memo of its own\n",
               memo.status().message().c_str());
  std::string tmp = std::filesystem::temp_directory_path(ec).string();
  return engine::PrefillMemo::Create(tmp.empty() ? "/tmp" : tmp, bound);
}

bool MemoServes(const MemoArgs& args, const std::string& kind) {
  return !args.off && (args.on || kind == "task");
}

}  // namespace vtoken::cli
