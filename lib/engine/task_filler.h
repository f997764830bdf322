// Task fillers: the haystack of a task instance (tasks.h) between its needles, an endless
// sequence of units, each starting with a space: the passkey test's repeated filler sentences
// ("repeat"), or the words of a text file ("corpus").
//
// Thread-safe once built: Unit is const.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/status.h"
#include "lib/engine/rng.h"

namespace vtoken::engine {

// The haystack's filler: an endless sequence of units, each starting with a space.
class Filler {
 public:
  virtual ~Filler() = default;
  // Unit `i` (>= 0) of the sequence.
  virtual std::string Unit(int64_t i) const = 0;
};

// Filler sentences that carry no information, repeated (as in the Landmark Attention and RULER
// passkey tests): " The grass is green. The sky is blue. ...".
class RepeatFiller final : public Filler {
 public:
  std::string Unit(int64_t i) const override;
};

// Words of a text file from a random line on, wrapping around. Leading verse numbers and lines
// of fewer than 3 words (chapter headings) are dropped, so the only numbers are the needles'.
class CorpusFiller final : public Filler {
 public:
  // The filler of `path`, starting at a line drawn from `rng`. Errors: NotFound for an
  // unreadable file; DataLoss for one without a line of 3 or more words.
  static StatusOr<std::unique_ptr<CorpusFiller>> Read(const std::string& path, Rng& rng);
  std::string Unit(int64_t i) const override;

 private:
  std::vector<std::string> words_;
};

}  // namespace vtoken::engine
