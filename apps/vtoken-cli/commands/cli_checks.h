// CLI11 validators whose errors say what a flag accepts ("--max-tokens: must be >= 1, got 0")
// instead of CLI11's "Value 0 not in range 0.000000 to 1797693134862315...". Numbers must
// parse completely and be finite.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
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

// A finite number in [lo, hi] (`lo_open`: in (lo, hi]).
inline CLI::Validator NumberIn(double lo, double hi, bool lo_open = false) {
  char range[96];
  std::snprintf(range, sizeof(range), "%s%g, %g]", lo_open ? "(" : "[", lo, hi);
  const std::string what = std::string("must be a number in ") + range;
  return CLI::Validator(
      [lo, hi, lo_open, what](std::string& text) -> std::string {
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          return what + ", got '" + text + "'";
        }
        const bool ok =
            used == text.size() && std::isfinite(v) && v <= hi && (lo_open ? v > lo : v >= lo);
        return ok ? "" : what + ", got " + text;
      },
      std::string("NUMBER in ") + range, "NumberIn");
}

}  // namespace vtoken::cli
