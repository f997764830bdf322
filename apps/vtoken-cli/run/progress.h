// The progress of one run on stderr (`run`, `sweep`). On a terminal: one line redrawn at most 5
// times a second, with the requests done as a bar and the estimated wall time left. Elsewhere
// (files, CI logs): a plain line at most every 10 s and a last one when the run ends.
// Thread-compatible: one run's thread calls it. Torch-free.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "lib/engine/result_schema.h"

namespace vtoken::cli {

class Progress {
 public:
  // `label` names the run ("vtoken 2/3"), `time_unit` the step clock ("s", "virtual s").
  Progress(std::string label, std::string time_unit);

  // After a step: `finished` of `total` requests done.
  void Update(const engine::StepRecord& s, int64_t finished, int64_t total);
  // Ends the redrawn line on a terminal.
  void Finish();

 private:
  double Wall() const;

  std::string label_, unit_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  double printed_ = -1e9;
  bool shown_ = false;
};

}  // namespace vtoken::cli
