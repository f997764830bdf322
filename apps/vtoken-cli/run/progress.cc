#include "apps/vtoken-cli/run/progress.h"

#include <unistd.h>

#include <cstdio>

namespace vtoken::cli {

Progress::Progress(std::string label, std::string time_unit)
    : label_(std::move(label)),
      unit_(std::move(time_unit)),
      tty_(isatty(2) != 0),
      start_(std::chrono::steady_clock::now()) {}

void Progress::Update(const engine::StepRecord& s, int64_t finished, int64_t total) {
  const double wall = Wall();
  const bool last = finished == total;
  if (!last && wall - printed_ < (tty_ ? 0.2 : 10.0)) return;
  printed_ = wall;
  char bar[21];
  const int filled = total > 0 ? static_cast<int>(20 * finished / total) : 20;
  for (int i = 0; i < 20; ++i) bar[i] = i < filled ? '#' : '.';
  bar[20] = 0;
  char eta[32] = "";
  if (finished > 0 && !last) {
    std::snprintf(eta, sizeof(eta), " eta %.0fs",
                  wall * static_cast<double>(total - finished) / static_cast<double>(finished));
  }
  std::fprintf(stderr,
               "%s[%s] [%s] %lld/%lld done%s | step %lld, %.1f %s, running %d, waiting %d, "
               "blocks %lld, F %.2f%s",
               tty_ ? "\r" : "", label_.c_str(), bar, static_cast<long long>(finished),
               static_cast<long long>(total), eta, static_cast<long long>(s.step), s.time_s,
               unit_.c_str(), s.num_running, s.num_waiting,
               static_cast<long long>(s.allocated_blocks), s.waste_ratio, tty_ ? "   " : "\n");
  std::fflush(stderr);
  shown_ = true;
}

void Progress::Finish() {
  if (tty_ && shown_) std::fprintf(stderr, "\n");
}

double Progress::Wall() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

}  // namespace vtoken::cli
