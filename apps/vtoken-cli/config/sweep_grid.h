// Sweep grids: the points of `vtoken-cli sweep` (the cartesian product of a config's
// [sweep.grid], less [[sweep.exclude]], plus [[sweep.add]]), shard selection and the progress
// line. Torch- and TOML-free, header-only so
// the unit test can include it without a library target of its own.
//
// A point is a list of `--set` overrides ("section.key=value", value as TOML text), applied to
// the config after the command line's own overrides. Point order is deterministic: axes sorted
// by key, values in file order, the last axis varying fastest; the point index is the position
// in that order, so shards and resumes of the same grid agree on it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "lib/core/status.h"

namespace vtoken::cli {

// One key of [sweep.grid]: the dotted config key and its values as TOML text ("4", "'h2o'",
// "[ 'naive' ]").
struct SweepAxis {
  std::string key;
  std::vector<std::string> values;
  // Further keys set to the same value at every point ([sweep] seeds: `seed` and
  // `workload.seed`).
  std::vector<std::string> also;
};

struct SweepPoint {
  int64_t index = 0;
  std::vector<std::string> overrides;  // "key=value", one per axis, axes in key order
};

// Returns the cartesian product of `axes`: keys sorted, values in their given order, the last
// key varying fastest. No axes -> one point without overrides. An axis without values -> none.
inline std::vector<SweepPoint> ExpandGrid(std::vector<SweepAxis> axes) {
  std::sort(axes.begin(), axes.end(),
            [](const SweepAxis& a, const SweepAxis& b) { return a.key < b.key; });
  std::vector<SweepPoint> points = {SweepPoint{}};
  for (const SweepAxis& axis : axes) {
    std::vector<SweepPoint> next;
    next.reserve(points.size() * axis.values.size());
    for (const SweepPoint& p : points) {
      for (const std::string& v : axis.values) {
        SweepPoint q = p;
        q.overrides.push_back(axis.key + "=" + v);
        for (const std::string& k : axis.also) q.overrides.push_back(k + "=" + v);
        next.push_back(std::move(q));
      }
    }
    points = std::move(next);
  }
  for (size_t i = 0; i < points.size(); ++i) points[i].index = static_cast<int64_t>(i);
  return points;
}

// One point's overrides ("key=value", value as TOML text, one per key): an entry of
// [[sweep.exclude]] or [[sweep.add]].
using SweepOverrides = std::vector<std::string>;

// Whether `point` sets every key of `entry` to the entry's value.
inline bool MatchesOverrides(const SweepPoint& point, const SweepOverrides& entry) {
  return std::all_of(entry.begin(), entry.end(), [&](const std::string& kv) {
    return std::find(point.overrides.begin(), point.overrides.end(), kv) != point.overrides.end();
  });
}

// The points of a sweep: the product of `axes` (ExpandGrid) less every point that matches an
// entry of `exclude`, then each entry of `add` as a point of its own, in file order, repeated
// over the repetition axes (those that set further keys: [sweep] seeds) as a product point is.
// Indexes follow that order.
inline std::vector<SweepPoint> ExpandSweep(const std::vector<SweepAxis>& axes,
                                           const std::vector<SweepOverrides>& exclude,
                                           const std::vector<SweepOverrides>& add) {
  std::vector<SweepPoint> points;
  for (SweepPoint& p : ExpandGrid(axes)) {
    if (std::none_of(exclude.begin(), exclude.end(),
                     [&](const SweepOverrides& e) { return MatchesOverrides(p, e); })) {
      points.push_back(std::move(p));
    }
  }
  std::vector<SweepAxis> repeat;
  for (const SweepAxis& axis : axes) {
    if (!axis.also.empty()) repeat.push_back(axis);
  }
  for (const SweepOverrides& extra : add) {
    for (const SweepPoint& r : ExpandGrid(repeat)) {
      SweepPoint p;
      p.overrides = extra;
      p.overrides.insert(p.overrides.end(), r.overrides.begin(), r.overrides.end());
      points.push_back(std::move(p));
    }
  }
  for (size_t i = 0; i < points.size(); ++i) points[i].index = static_cast<int64_t>(i);
  return points;
}

// `--shard I/N`: this process runs the points whose index % num_shards == index.
struct Shard {
  int64_t index = 0;
  int64_t num_shards = 1;

  bool Contains(int64_t point_index) const { return point_index % num_shards == index; }
};

// Parses "I/N" (0 <= I < N). kInvalidArgument otherwise, naming the text.
inline StatusOr<Shard> ParseShard(const std::string& text) {
  const size_t slash = text.find('/');
  auto parse = [](const std::string& s, int64_t& out) {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    out = std::stoll(s);
    return true;
  };
  Shard shard;
  if (slash == std::string::npos || !parse(text.substr(0, slash), shard.index) ||
      !parse(text.substr(slash + 1), shard.num_shards)) {
    return InvalidArgumentError("--shard '" + text + "': expected I/N, e.g. 0/2");
  }
  if (shard.num_shards == 0 || shard.index >= shard.num_shards) {
    return InvalidArgumentError("--shard '" + text + "': need 0 <= I < N");
  }
  return shard;
}

// Counts of the points a sweep process is responsible for.
struct SweepProgress {
  int64_t total = 0;    // points selected (this shard)
  int64_t done = 0;     // run to completion now
  int64_t skipped = 0;  // already completed (--resume)
  int64_t failed = 0;
  int64_t running = 0;
};

// "1h02m", "3m05s", "42s"; "?" for a negative or non-finite duration.
inline std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = std::llround(seconds);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  } else if (s >= 60) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(s));
  }
  return buf;
}

// Seconds left, from the mean time of the points finished so far (done or failed; skipped
// points cost nothing). `jobs` points run at once. Negative when nothing has finished yet.
inline double EstimateRemaining(const SweepProgress& p, double elapsed_s, int64_t jobs) {
  const int64_t finished = p.done + p.failed;
  const int64_t left = p.total - finished - p.skipped;
  if (left <= 0) return 0;
  if (finished == 0) return -1;
  const double per_point =
      elapsed_s * static_cast<double>(std::min(jobs, finished)) / static_cast<double>(finished);
  return per_point * static_cast<double>(left) / static_cast<double>(std::max<int64_t>(jobs, 1));
}

// The progress line: a `width`-character bar of the points finished or skipped, then counts,
// elapsed time and ETA, e.g.
// "[#####.....] 4/8  done 3  skipped 1  failed 0  running 2  12s elapsed  ETA 24s".
inline std::string FormatProgress(const SweepProgress& p, double elapsed_s, int64_t jobs,
                                  int width = 20) {
  const int64_t settled = p.done + p.skipped + p.failed;
  const int64_t filled = p.total == 0 ? width : settled * width / p.total;
  std::string bar = "[" + std::string(static_cast<size_t>(filled), '#') +
                    std::string(static_cast<size_t>(width - filled), '.') + "]";
  char buf[192];
  std::snprintf(buf, sizeof(buf),
                " %lld/%lld  done %lld  skipped %lld  failed %lld  running %lld  %s elapsed  "
                "ETA %s",
                static_cast<long long>(settled), static_cast<long long>(p.total),
                static_cast<long long>(p.done), static_cast<long long>(p.skipped),
                static_cast<long long>(p.failed), static_cast<long long>(p.running),
                FormatDuration(elapsed_s).c_str(),
                FormatDuration(EstimateRemaining(p, elapsed_s, jobs)).c_str());
  return bar + buf;
}

}  // namespace vtoken::cli
