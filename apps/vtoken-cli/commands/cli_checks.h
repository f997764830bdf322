// A CLI11 validator whose errors say what a flag accepts ("--max-tokens: must be an integer >= 1,
// got 0") instead of CLI11's "Value 0 not in range ...", for flags that mirror no config key
// (those take their check from the key table: key_flags.h). Numbers must parse completely.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace vtoken::cli {

// An integer in [lo, hi].
inline CLI::Validator IntIn(int64_t lo, int64_t hi = INT64_MAX) {
  const std::string what = hi == INT64_MAX ? "must be an integer >= " + std::to_string(lo)
                                           : "must be an integer in [" + std::to_string(lo) + ", " +
                                                 std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, what](std::string& text) -> std::string {
        size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(text, &used);
        } catch (const std::exception&) {
          return what + ", got '" + text + "'";
        }
        if (used != text.size() || v < lo || v > hi) return what + ", got " + text;
        return "";
      },
      hi == INT64_MAX ? "INT>=" + std::to_string(lo)
                      : "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
      "IntIn");
}

}  // namespace vtoken::cli
