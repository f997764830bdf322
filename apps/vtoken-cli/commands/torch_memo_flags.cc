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
  cmd.add_option("--prefill-memo-gib", args.gib,
                 "KV the prefill memo keeps at most, in GiB (never the disk's last GiB)")
      ->capture_default_str();
}

StatusOr<std::unique_ptr<engine::PrefillMemo>> MakeMemo(const MemoArgs& args) {
  if (args.on && args.off) {
    return InvalidArgumentError("--prefill-memo and --no-prefill-memo contradict each other");
  }
  if (args.off) return std::unique_ptr<engine::PrefillMemo>();
  if (!(args.gib > 0)) {
    return InvalidArgumentError("--prefill-memo-gib must be > 0, got " + std::to_string(args.gib));
  }
  // The memo's folder (the system's temporary folder by default) and its bound: --prefill-memo-gib,
  // never the disk's last GiB.
  std::error_code ec;
  std::string dir = args.dir.empty() ? std::filesystem::temp_directory_path(ec).string() : args.dir;
  if (dir.empty()) dir = "/tmp";
  const double gib = double(int64_t{1} << 30);
  double max_bytes = args.gib * gib;
  const std::filesystem::space_info space = std::filesystem::space(dir, ec);
  if (!ec) max_bytes = std::min(max_bytes, static_cast<double>(space.available) - gib);
  return engine::PrefillMemo::Create(dir, static_cast<int64_t>(std::max(0.0, max_bytes)));
}

bool MemoServes(const MemoArgs& args, const std::string& kind) {
  return !args.off && (args.on || kind == "task");
}

}  // namespace vtoken::cli
