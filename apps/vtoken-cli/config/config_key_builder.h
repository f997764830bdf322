// The builder of the config key table's entries (config_key_table.cc): Field for a key stored
// as is in an ExperimentConfig field, Custom for one with its own getter and setter, then
// chainable modifiers as the policies' ParamSpec has (Unit, Range, Choices, Record, Doc, ...).
// Internal to the table; include nowhere else.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "apps/vtoken-cli/config/config_keys.h"
#include "lib/core/budget_allocation.h"
#include "lib/sim/sim_spec.h"

namespace vtoken::cli::config_key_builder {

constexpr double kNone = std::numeric_limits<double>::infinity();
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

inline const ExperimentConfig& Defaults() {
  static const ExperimentConfig defaults;
  return defaults;
}

// When the resolved config records a key (ConfigKey::record_when). Each keeps the hashes of the
// configs from before the key existed, or leaves out what a run does not read.
enum RecordRule {
  kAlways,
  kSet,               // only when it differs from the default
  kTask,              // workload.kind = "task"
  kTaskOrPerplexity,  // workload.kind = "task" or "perplexity"
  kEvicts,            // the run's mode evicts (a native run reads no [policy] and [reclaim])
  kEvictsSet,         // kEvicts and kSet
  kPyramid,           // kEvicts and policy.budget_allocation = "pyramid"
  kAdaptive,          // kEvicts and policy.budget_allocation = "adaptive"
  kSim,               // a sim: model
  kSimSet,            // kSim and kSet
  kSimGrouped,        // kSim and cache.granularity is not "token"
};

inline bool Evicts(const ExperimentConfig& c) {
  return std::any_of(c.modes.begin(), c.modes.end(), [](Mode m) { return m != Mode::kNative; });
}
inline bool IsSim(const ExperimentConfig& c) { return sim::IsSimSpec(c.model); }

// Builds one ConfigKey; chainable like ParamSpec's modifiers.
class Key {
 public:
  using Getter = std::function<KeyValue(const ExperimentConfig&)>;
  using Setter = std::function<Status(ExperimentConfig&, const KeyValue&)>;

  // A key stored as is in the field `ref` returns; its type is the field's.
  template <typename Ref>
  static Key Field(std::string name, Ref ref) {
    using T = std::remove_reference_t<decltype(ref(std::declval<ExperimentConfig&>()))>;
    // The getter reads through the same accessor; it never writes.
    Getter get = [ref](const ExperimentConfig& c) -> KeyValue {
      const T& v = ref(const_cast<ExperimentConfig&>(c));
      if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, double> ||
                    std::is_same_v<T, std::string> || std::is_same_v<T, std::vector<double>> ||
                    std::is_same_v<T, std::vector<std::string>>) {
        return v;
      } else {
        return static_cast<int64_t>(v);
      }
    };
    Setter set = [ref](ExperimentConfig& c, const KeyValue& v) {
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        const int64_t i = std::get<int64_t>(v);
        if constexpr (std::is_same_v<T, int32_t>) {
          if (i < INT32_MIN || i > INT32_MAX) return InvalidArgumentError("is out of range");
        }
        ref(c) = static_cast<T>(i);
      } else {
        ref(c) = std::get<T>(v);
      }
      return Status::Ok();
    };
    Key k = Custom(std::move(name), TypeOf<T>(), std::move(get), std::move(set));
    if constexpr (std::is_unsigned_v<T> && !std::is_same_v<T, bool>) k.key_.min = 0;
    return k;
  }
  static inline Key Custom(std::string name, KeyType type, Getter get, Setter set) {
    Key k;
    k.key_.name = std::move(name);
    k.key_.type = type;
    k.key_.get = std::move(get);
    k.key_.set = std::move(set);
    return k;
  }

  Key&& Unit(std::string unit) && { return key_.unit = std::move(unit), std::move(*this); }
  Key&& Doc(std::string doc) && { return key_.doc = std::move(doc), std::move(*this); }
  Key&& Range(double min, double max) && {
    key_.min = min == kNone ? -kNone : min;
    key_.max = max;
    return std::move(*this);
  }
  Key&& MinExclusive() && { return key_.min_exclusive = true, std::move(*this); }
  Key&& MaxExclusive() && { return key_.max_exclusive = true, std::move(*this); }
  // Not NaN and not infinite (a range alone lets +inf through).
  Key&& Finite() && { return key_.max_exclusive = true, key_.max = kNone, std::move(*this); }
  Key&& Choices(std::vector<std::string> choices) && {
    return key_.choices = std::move(choices), std::move(*this);
  }
  Key&& DefaultText(std::string text) && {
    return key_.default_text = std::move(text), std::move(*this);
  }
  Key&& RangeText(std::string text) && {
    return key_.range_text = std::move(text), std::move(*this);
  }
  // A string the table cannot check by choices: `ok` says whether it is valid, `must` what it
  // must be.
  Key&& Check(bool (*ok)(const std::string&), std::string must) && {
    key_.set = [set = key_.set, ok, must](ExperimentConfig& c, const KeyValue& v) {
      if (!ok(std::get<std::string>(v))) return InvalidArgumentError(must);
      return set(c, v);
    };
    return std::move(*this);
  }
  Key&& Record(RecordRule when) && {
    const Getter get = key_.get;
    auto set = [get](const ExperimentConfig& c) { return get(c) != get(Defaults()); };
    static const char* const kDocs[] = {"",
                                        "when not the default",
                                        "for kind task",
                                        "for kinds task and perplexity",
                                        "when the mode evicts",
                                        "when the mode evicts and not the default",
                                        "when the mode evicts and the allocation is pyramid",
                                        "when the mode evicts and the allocation is adaptive",
                                        "for sim: models",
                                        "for sim: models, when not the default",
                                        "for sim: models at layer or head granularity"};
    key_.record_doc = kDocs[when];
    switch (when) {
      case kAlways:
        break;
      case kSet:
        key_.record_when = set;
        break;
      case kTask:
        key_.record_when = [](const ExperimentConfig& c) { return c.workload.kind == "task"; };
        break;
      case kTaskOrPerplexity:
        key_.record_when = [](const ExperimentConfig& c) {
          return c.workload.kind == "task" || c.workload.kind == "perplexity";
        };
        break;
      case kEvicts:
        key_.record_when = Evicts;
        break;
      case kEvictsSet:
        key_.record_when = [set](const ExperimentConfig& c) { return Evicts(c) && set(c); };
        break;
      case kPyramid:
        key_.record_when = [](const ExperimentConfig& c) {
          return Evicts(c) && c.engine.evictor.allocation == BudgetAllocation::kPyramid;
        };
        break;
      case kAdaptive:
        key_.record_when = [](const ExperimentConfig& c) {
          return Evicts(c) && c.engine.evictor.allocation == BudgetAllocation::kAdaptive;
        };
        break;
      case kSim:
        key_.record_when = IsSim;
        break;
      case kSimSet:
        key_.record_when = [set](const ExperimentConfig& c) { return IsSim(c) && set(c); };
        break;
      case kSimGrouped:
        key_.record_when = [](const ExperimentConfig& c) {
          return IsSim(c) && c.granularity != Granularity::kToken;
        };
        break;
    }
    return std::move(*this);
  }
  // Records the key when `when` holds (a rule the enum does not have); `doc` says when.
  Key&& RecordWhen(std::function<bool(const ExperimentConfig&)> when, std::string doc) && {
    key_.record_when = std::move(when);
    key_.record_doc = std::move(doc);
    return std::move(*this);
  }
  Key&& NotResolved() && { return key_.resolved = false, std::move(*this); }
  operator ConfigKey() && { return std::move(key_); }

 private:
  template <typename T>
  static constexpr KeyType TypeOf() {
    if constexpr (std::is_same_v<T, bool>)
      return KeyType::kBool;
    else if constexpr (std::is_same_v<T, double>)
      return KeyType::kDouble;
    else if constexpr (std::is_same_v<T, std::string>)
      return KeyType::kString;
    else if constexpr (std::is_same_v<T, std::vector<std::string>>)
      return KeyType::kStringList;
    else if constexpr (std::is_same_v<T, std::vector<double>>)
      return KeyType::kDoubleList;
    else
      return KeyType::kInt;
  }

  ConfigKey key_;
};

inline Key Field(std::string name, auto ref) { return Key::Field(std::move(name), ref); }
inline Key Custom(std::string name, KeyType type, Key::Getter get, Key::Setter set) {
  return Key::Custom(std::move(name), type, std::move(get), std::move(set));
}

// Appends the [sim] keys (config_key_table_sim.cc), in the order they are applied.
void AppendSimKeys(std::vector<ConfigKey>& keys);

}  // namespace vtoken::cli::config_key_builder
