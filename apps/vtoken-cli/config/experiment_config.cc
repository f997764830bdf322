#include "apps/vtoken-cli/config/experiment_config.h"

#include <toml++/toml.h>
#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <variant>

#include "apps/vtoken-cli/config/config_keys.h"
#include "apps/vtoken-cli/config/config_source.h"
#include "apps/vtoken-cli/config/config_sweep.h"
#include "lib/core/policy_registry.h"

namespace vtoken::cli {
namespace {

Status ParseParamTable(const toml::table& t, const ConfigSource& source, const std::string& where,
                       RawParams& out) {
  for (const auto& [key, node] : t) {
    const std::string k(key.str());
    if (auto i = node.value_exact<int64_t>()) {
      out[k] = *i;
    } else if (auto d = node.value_exact<double>()) {
      out[k] = *d;
    } else if (auto b = node.value_exact<bool>()) {
      out[k] = *b;
    } else if (auto s = node.value_exact<std::string>()) {
      out[k] = *s;
    } else {
      return source.KeyError(where + k, &node, "must be an integer, number, boolean or string");
    }
  }
  return Status::Ok();
}

// Parameter `name` of `policy`, given at dotted `key` (`node` its value), against the policy's
// declaration: an error names the file, the line (or the --set) and the key, and for an unknown
// name the nearest declared one.
Status CheckParam(const ConfigSource& source, const std::string& key, const toml::node* node,
                  const PolicyInfo& policy, const std::string& name, const ParamValue& value) {
  const Status s = ResolveParams(policy.name, policy.params, {{name, value}}).status();
  if (s.ok()) return s;
  std::string what = s.message();
  std::vector<std::string> names;
  for (const ParamSpec& spec : policy.params) names.push_back(spec.name);
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    if (const std::string near = NearestName(name, names); !near.empty()) {
      what += "; did you mean '" + near + "'?";
    }
  }
  return InvalidArgumentError(source.Where(key, node) + ": key '" + key + "': " + what);
}

// [policy.params]: the running policy's parameters, as plain keys (`decay = 0.9`) or in a table
// named after a policy (`[policy.params.ema_attention]`) that applies only when that policy
// runs, so that one config or sweep grid sets the parameters of several policies. The tables of
// the policies that do not run are checked against their parameters all the same; the plain
// keys against the running policy's (CrossCheck, once the modes are known).
Status ParsePolicyParams(const toml::table* t, const ConfigSource& source,
                         const std::string& policy, RawParams& out) {
  if (t == nullptr) return Status::Ok();
  RawParams plain, own;
  for (const auto& [key, node] : *t) {
    const std::string k(key.str());
    const toml::table* sub = node.as_table();
    if (sub == nullptr) continue;
    const std::string where = "policy.params." + k + ".";
    StatusOr<const PolicyInfo*> info = FindPolicy(k);
    if (!info.ok()) {
      return InvalidArgumentError(source.Where("policy.params." + k, &node) +
                                  ": table 'policy.params." + k +
                                  "' is not a policy's: " + info.status().message());
    }
    RawParams values;
    VTOKEN_RETURN_IF_ERROR(ParseParamTable(*sub, source, where, values));
    for (const auto& [name, value] : values) {
      VTOKEN_RETURN_IF_ERROR(CheckParam(source, where + name, sub->get(name), **info, name, value));
    }
    if (k == policy) own = std::move(values);
  }
  toml::table scalars;
  for (const auto& [key, node] : *t) {
    if (!node.is_table()) scalars.insert(key, node);
  }
  VTOKEN_RETURN_IF_ERROR(ParseParamTable(scalars, source, "policy.params.", plain));
  for (const auto& [key, value] : own) {
    if (plain.contains(key)) {
      return InvalidArgumentError(source.Where("policy.params." + key, t->get(key)) +
                                  ": policy parameter '" + key + "' is given twice, as " +
                                  "'policy.params." + key + "' and 'policy.params." + policy + "." +
                                  key + "'");
    }
    plain[key] = value;
  }
  out = std::move(plain);
  return Status::Ok();
}

// The node at dotted `key` under `root`, or nullptr.
const toml::node* Find(const toml::table& root, std::string_view key) {
  const toml::table* table = &root;
  while (true) {
    const size_t dot = key.find('.');
    const toml::node* n = table->get(key.substr(0, dot));
    if (dot == std::string_view::npos || n == nullptr) return n;
    table = n->as_table();
    if (table == nullptr) return nullptr;
    key.remove_prefix(dot + 1);
  }
}

// Every key of `table` (named `prefix`) is a key of the table, a table of keys, or [sweep].
Status CheckKnownKeys(const toml::table& table, const std::string& prefix,
                      const ConfigSource& source) {
  for (const auto& [k, node] : table) {
    const std::string key =
        prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (key == "sweep" || FindConfigKey(key) != nullptr) continue;
    if (!IsConfigSection(key)) return source.UnknownKey(key, &node);
    if (!node.is_table()) return source.KeyError(key, &node, "must be a table");
    VTOKEN_RETURN_IF_ERROR(CheckKnownKeys(*node.as_table(), key, source));
  }
  return Status::Ok();
}

// The value of `node` as a value of `key`'s type. An integer is taken for a number.
StatusOr<KeyValue> Convert(const ConfigKey& key, const toml::node& node,
                           const ConfigSource& source) {
  const Status wrong =
      source.KeyError(key.name, &node, std::string("must be ") + KeyTypeNoun(key.type));
  auto number = [](const toml::node& n) -> std::optional<double> {
    if (auto d = n.value_exact<double>()) return *d;
    if (auto i = n.value_exact<int64_t>()) return static_cast<double>(*i);
    return std::nullopt;
  };
  switch (key.type) {
    case KeyType::kInt:
      if (auto i = node.value_exact<int64_t>()) return KeyValue(*i);
      return wrong;
    case KeyType::kDouble:
      if (auto d = number(node)) return KeyValue(*d);
      return wrong;
    case KeyType::kBool:
      if (auto b = node.value_exact<bool>()) return KeyValue(*b);
      return wrong;
    case KeyType::kString:
      if (auto s = node.value_exact<std::string>()) return KeyValue(*s);
      return wrong;
    case KeyType::kStringList: {
      const toml::array* a = node.as_array();
      if (a == nullptr) return wrong;
      std::vector<std::string> out;
      for (const toml::node& e : *a) {
        auto s = e.value_exact<std::string>();
        if (!s) return wrong;
        out.push_back(*s);
      }
      return KeyValue(std::move(out));
    }
    case KeyType::kDoubleList: {
      const toml::array* a = node.as_array();
      if (a == nullptr) return wrong;
      std::vector<double> out;
      for (const toml::node& e : *a) {
        auto d = number(e);
        if (!d) return wrong;
        out.push_back(*d);
      }
      return KeyValue(std::move(out));
    }
    case KeyType::kParams:
      break;
  }
  return wrong;
}

// Applies every key the file gives, in the table's order: type, range, then the key's setter.
Status ApplyKeys(const toml::table& root, const ConfigSource& source, ExperimentConfig& c) {
  const bool budget_given = Find(root, "policy.budget_tokens") != nullptr;
  for (const ConfigKey& key : ConfigKeys()) {
    const toml::node* node = Find(root, key.name);
    if (node == nullptr) continue;
    KeyValue value;
    if (key.type == KeyType::kParams) {
      if (!node->is_table()) return source.KeyError(key.name, node, "must be a table");
      RawParams params;
      VTOKEN_RETURN_IF_ERROR(ParsePolicyParams(node->as_table(), source, c.engine.policy, params));
      value = std::move(params);
    } else {
      VTOKEN_ASSIGN_OR_RETURN(value, Convert(key, *node, source));
    }
    // keep_ratio = 0 beside budget_tokens: the old way to choose an absolute budget.
    const bool old_budget_spelling =
        key.name == "policy.keep_ratio" && budget_given && std::get<double>(value) == 0;
    if (std::string must = CheckRange(key, value); !must.empty() && !old_budget_spelling) {
      std::string what = "must be " + must + " (is " + KeyValueText(value) + ")";
      if (key.name == "policy.keep_ratio")
        what += "; for an absolute budget give policy.budget_tokens";
      return source.KeyError(key.name, node, what);
    }
    if (Status s = key.set(c, value); !s.ok()) return source.KeyError(key.name, node, s.message());
  }
  // An absolute budget replaces the default ratio.
  if (budget_given && Find(root, "policy.keep_ratio") == nullptr) c.engine.evictor.keep_ratio = 0;
  return Status::Ok();
}

// engine.gpu_memory_utilization: num_blocks as vLLM would size the pool.
// `given_blocks`: engine.num_blocks as the file gives it (a resolved config records both keys;
// it loads again when they agree).
Status SizePoolFromUtilization(ExperimentConfig& c, std::optional<int32_t> given_blocks) {
  if (c.gpu_memory_utilization == 0) return Status::Ok();
  StatusOr<model::ModelConfig> mc = sim::SimModelConfig(c.model);
  if (!mc.ok()) return InvalidArgumentError(c.file + ": model.path: " + mc.status().message());
  const sim::ModelShape shape = sim::ShapeOf(*mc, *sim::DtypeBytes(c.sim.dtype));
  StatusOr<sim::PoolSizing> p = sim::SizePool(shape, c.sim.hardware, c.gpu_memory_utilization,
                                              c.engine.pool.block_size, c.sim.profile_tokens);
  if (!p.ok()) {
    return InvalidArgumentError(c.file +
                                ": key 'engine.gpu_memory_utilization': " + p.status().message());
  }
  if (p->num_blocks > INT32_MAX) {
    return InvalidArgumentError(c.file + ": key 'engine.gpu_memory_utilization' gives " +
                                std::to_string(p->num_blocks) + " blocks, more than a pool holds");
  }
  if (given_blocks && *given_blocks != p->num_blocks) {
    return InvalidArgumentError(c.file +
                                ": key 'engine.num_blocks' = " + std::to_string(*given_blocks) +
                                " disagrees with the " + std::to_string(p->num_blocks) +
                                " blocks engine.gpu_memory_utilization gives: give one");
  }
  c.engine.pool.num_blocks = static_cast<int32_t>(p->num_blocks);
  c.pool_sizing = c.sim.hardware.name + ", " + c.model + ": " + p->Explain();
  return Status::Ok();
}

// What no single key can check: keys that need each other, and the options structs' own
// validation.
Status CrossCheck(const toml::table& root, const ConfigSource& source, ExperimentConfig& c) {
  engine::EngineOptions& e = c.engine;
  auto error = [&](std::string_view key, const std::string& what) {
    return source.KeyError(key, Find(root, key), what);
  };
  if (c.cuda_graphs && (sim::IsSimSpec(c.model) || c.model_device.rfind("cuda", 0) != 0)) {
    return error("engine.cuda_graphs", "needs model.device = \"cuda\" (a real or synthetic model)");
  }
  std::optional<int32_t> blocks_given;
  if (c.gpu_memory_utilization != 0) {
    if (!sim::IsSimSpec(c.model)) {
      return error("engine.gpu_memory_utilization",
                   "needs a sim: model (model.path = \"sim:NAME\")");
    }
    if (Find(root, "engine.num_blocks") != nullptr) blocks_given = e.pool.num_blocks;
  }
  if (Status fits = CheckAllocationFits(e.evictor.allocation, c.granularity); !fits.ok()) {
    return error("policy.budget_allocation", fits.message());
  }
  if (const toml::node* sim = root.get("sim"); sim != nullptr && !sim::IsSimSpec(c.model)) {
    return InvalidArgumentError(source.Where("sim", sim) +
                                ": table [sim] needs a sim: model (model.path = \"sim:NAME\")");
  }
  if (root.get("sim") != nullptr) {
    Status valid = sim::ValidateHardware(c.sim.hardware);
    if (!valid.ok())
      return InvalidArgumentError(source.Where("sim.hardware", Find(root, "sim.hardware")) +
                                  ": [sim.hardware] " + valid.message());
    valid = c.sim.parametric.Validate();
    if (!valid.ok())
      return InvalidArgumentError(source.Where("sim.parametric", Find(root, "sim.parametric")) +
                                  ": " + valid.message());
  }
  if (e.evictor.keep_ratio > 0 && e.evictor.budget_tokens > 0) {
    return error("policy.budget_tokens", "and policy.keep_ratio are exclusive: give one");
  }
  VTOKEN_RETURN_IF_ERROR(SizePoolFromUtilization(c, blocks_given));
  if (int64_t{e.pool.num_blocks} * std::max(1, e.pool.block_size) > kMaxSlots) {
    return error("engine.num_blocks",
                 "= " + std::to_string(e.pool.num_blocks) + " x engine.block_size " +
                     std::to_string(e.pool.block_size) + " = " +
                     std::to_string(int64_t{e.pool.num_blocks} * e.pool.block_size) +
                     " slots, more than the " + std::to_string(kMaxSlots) + " a pool can hold");
  }
  const std::string& f = c.file;
  if (Status valid = ValidateBlockPoolOptions(e.pool); !valid.ok()) {
    return InvalidArgumentError(f + ": engine: " + valid.message());
  }
  if (Status valid = ValidateReclaimOptions(e.reclaim); !valid.ok()) {
    return InvalidArgumentError(f + ": reclaim: " + valid.message());
  }
  if (Status valid = engine::ValidateWorkloadOptions(c.workload); !valid.ok()) {
    // A field that is a key of the file's is blamed on its line: "x.toml:7: key 'workload.rate'
    // = 0: must be > 0".
    const std::string field = engine::WorkloadOptionField(valid);
    const std::string key = "workload." + field;
    if (!field.empty() && FindConfigKey(key) != nullptr) {
      const std::string what = valid.message().substr(("workload option " + field + " ").size());
      return source.KeyError(key, Find(root, key), what);
    }
    return InvalidArgumentError(f + ": " + valid.message());
  }
  if (std::find(c.modes.begin(), c.modes.end(), Mode::kNative) == c.modes.end() ||
      c.modes.size() > 1) {
    if (Status valid = ValidateEvictorOptions(e.evictor); !valid.ok()) {
      return InvalidArgumentError(f + ": policy: " + valid.message());
    }
    // The plain [policy.params] keys are the running policy's (its own table's were checked).
    StatusOr<const PolicyInfo*> info = FindPolicy(e.policy);
    for (const auto& [name, value] : e.policy_params) {
      const std::string key = "policy.params." + name;
      const toml::node* node = Find(root, key);
      if (!info.ok() || e.indirection_only || node == nullptr || node->is_table()) continue;
      VTOKEN_RETURN_IF_ERROR(CheckParam(source, key, node, **info, name, value));
    }
    if (!c.policy_source_xxh64.empty()) {
      const std::string now = PythonPolicySourceHash(e.policy);
      if (now.empty()) {
        return error("policy.source_xxh64",
                     "is given but policy " + e.policy + " is not a Python policy");
      }
      if (now != c.policy_source_xxh64) {
        return error("policy.source_xxh64",
                     "= \"" + c.policy_source_xxh64 + "\" but policy " + e.policy + "'s file " +
                         (*info)->source_file + " hashes to \"" + now +
                         "\" now: it changed since the config was recorded (drop the key to "
                         "run the file as it is)");
      }
    }
  }
  return Status::Ok();
}

Status Parse(const toml::table& root, const ConfigSource& source, bool check_sweep_points,
             ExperimentConfig& c) {
  VTOKEN_RETURN_IF_ERROR(CheckKnownKeys(root, "", source));
  VTOKEN_RETURN_IF_ERROR(ApplyKeys(root, source, c));
  const toml::node* sweep = root.get("sweep");
  if (sweep != nullptr && !sweep->is_table())
    return source.KeyError("sweep", sweep, "must be a table");
  c.has_sweep_table = sweep != nullptr;
  VTOKEN_RETURN_IF_ERROR(
      ParseSweep(c.has_sweep_table ? sweep->as_table() : nullptr, source, check_sweep_points, c));
  return CrossCheck(root, source, c);
}

// Every key with its effective value (defaults included) for one mode: what a run ran. How a
// config is swept ([sweep]) and where results go (db) are not part of it; a key whose
// ConfigKey::record_when does not hold is left out (the hashes of older configs stay).
toml::table ResolvedTable(const ExperimentConfig& config, Mode mode) {
  ExperimentConfig c = config;
  c.modes = {mode};
  toml::table resolved;
  for (const ConfigKey& key : ConfigKeys()) {
    if (!key.resolved || (key.record_when && !key.record_when(c))) continue;
    toml::table* table = &resolved;
    std::string_view rest = key.name;
    for (size_t dot; (dot = rest.find('.')) != std::string_view::npos;
         rest.remove_prefix(dot + 1)) {
      const std::string part(rest.substr(0, dot));
      if (table->get(part) == nullptr) table->insert(part, toml::table{});
      table = table->get(part)->as_table();
    }
    const std::string leaf(rest);
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, RawParams>) {
            toml::table params;
            for (const auto& [k, p] : v) {
              std::visit([&, k = k](const auto& x) { params.insert_or_assign(k, x); }, p);
            }
            table->insert(leaf, std::move(params));
          } else if constexpr (std::is_same_v<T, std::vector<std::string>> ||
                               std::is_same_v<T, std::vector<double>>) {
            toml::array a;
            for (const auto& x : v) a.push_back(x);
            table->insert(leaf, std::move(a));
          } else {
            table->insert(leaf, v);
          }
        },
        key.get(c));
  }
  return resolved;
}

}  // namespace

StatusOr<ExperimentConfig> LoadExperimentConfig(const std::string& path,
                                                const std::vector<std::string>& overrides,
                                                bool check_sweep_points) {
  if (!std::filesystem::exists(path)) return NotFoundError("config file " + path + " not found");
  if (!std::filesystem::is_regular_file(path)) {
    return InvalidArgumentError("config file " + path + " is not a regular file (a directory?)");
  }
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& err) {
    return InvalidArgumentError(path + ":" + std::to_string(err.source().begin.line) + ": " +
                                std::string(err.description()));
  }
  ConfigSource source(path);
  for (const std::string& o : overrides) VTOKEN_RETURN_IF_ERROR(source.ApplyOverride(root, o));
  ExperimentConfig c;
  c.file = path;
  c.name = std::filesystem::path(path).stem().string();
  VTOKEN_RETURN_IF_ERROR(Parse(root, source, check_sweep_points, c));
  for (Mode mode : c.modes) {
    std::ostringstream out;
    out << ResolvedTable(c, mode);
    c.resolved_toml.push_back(out.str());
  }
  return c;
}

std::string ResolvedToml(const ExperimentConfig& config, Mode mode) {
  std::ostringstream out;
  out << ResolvedTable(config, mode);
  return out.str();
}

std::string PythonPolicySourceHash(const std::string& policy) {
  const StatusOr<const PolicyInfo*> info = FindPolicy(policy);
  if (!info.ok() || std::filesystem::path((*info)->source_file).extension() != ".py") return "";
  std::ifstream in((*info)->source_file, std::ios::binary);
  if (!in) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return ConfigHash(text.str());
}

std::string ConfigHash(const std::string& resolved_toml) {
  char buf[17];
  std::snprintf(
      buf, sizeof(buf), "%016llx",
      static_cast<unsigned long long>(XXH64(resolved_toml.data(), resolved_toml.size(), 0)));
  return buf;
}

}  // namespace vtoken::cli
