#include "apps/vtoken-cli/experiment_config.h"

#include <xxhash.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <tuple>
#include <sstream>
#include <variant>
#include <toml++/toml.h>

#include "lib/model/io/device_spec.h"

#include "lib/core/policy_registry.h"

namespace vtoken::cli {
namespace {

// Reads typed keys of one TOML table and remembers which it consumed, so leftovers can be
// reported as unknown keys.
class Section {
 public:
  Section(const toml::table* table, std::string prefix, const std::string& file)
      : table_(table), prefix_(std::move(prefix)), file_(file) {}

  Status Int(const char* key, int64_t& out) { return Get<int64_t>(key, out, "an integer"); }
  Status Int32(const char* key, int32_t& out) {
    int64_t v = out;
    VTOKEN_RETURN_IF_ERROR(Int(key, v));
    if (v < INT32_MIN || v > INT32_MAX) return Error(key, "is out of range");
    out = static_cast<int32_t>(v);
    return Status::Ok();
  }
  Status Uint(const char* key, uint64_t& out) {
    int64_t v = static_cast<int64_t>(out);
    VTOKEN_RETURN_IF_ERROR(Int(key, v));
    if (v < 0) return Error(key, "must be >= 0");
    out = static_cast<uint64_t>(v);
    return Status::Ok();
  }
  Status Double(const char* key, double& out) {
    const toml::node* n = Node(key);
    if (n == nullptr) return Status::Ok();
    if (auto d = n->value_exact<double>()) {
      out = *d;
    } else if (auto i = n->value_exact<int64_t>()) {
      out = static_cast<double>(*i);
    } else {
      return Error(key, "must be a number");
    }
    return Status::Ok();
  }
  Status Bool(const char* key, bool& out) { return Get<bool>(key, out, "true or false"); }
  Status String(const char* key, std::string& out) {
    return Get<std::string>(key, out, "a string");
  }
  Status StringArray(const char* key, std::vector<std::string>& out) {
    const toml::node* n = Node(key);
    if (n == nullptr) return Status::Ok();
    const toml::array* a = n->as_array();
    if (a == nullptr) return Error(key, "must be an array of strings");
    out.clear();
    for (const toml::node& e : *a) {
      auto s = e.value_exact<std::string>();
      if (!s) return Error(key, "must be an array of strings");
      out.push_back(*s);
    }
    return Status::Ok();
  }
  Status DoubleArray(const char* key, std::vector<double>& out) {
    const toml::node* n = Node(key);
    if (n == nullptr) return Status::Ok();
    const toml::array* a = n->as_array();
    if (a == nullptr) return Error(key, "must be an array of numbers");
    out.clear();
    for (const toml::node& e : *a) {
      if (auto d = e.value_exact<double>()) {
        out.push_back(*d);
      } else if (auto i = e.value_exact<int64_t>()) {
        out.push_back(static_cast<double>(*i));
      } else {
        return Error(key, "must be an array of numbers");
      }
    }
    return Status::Ok();
  }
  // The raw node of `key` (nullptr when absent), marked as used.
  const toml::node* Raw(const char* key) { return Node(key); }
  // A sub-table, or nullptr when absent. Error when present but not a table.
  StatusOr<const toml::table*> Table(const char* key) {
    const toml::node* n = Node(key);
    if (n == nullptr) return static_cast<const toml::table*>(nullptr);
    if (!n->is_table()) return Error(key, "must be a table");
    return n->as_table();
  }
  Status Finish() const {
    if (table_ == nullptr) return Status::Ok();
    for (const auto& [key, value] : *table_) {
      if (!used_.count(std::string(key.str()))) {
        return InvalidArgumentError(file_ + ": unknown key '" + Path(std::string(key.str())) +
                                    "'");
      }
    }
    return Status::Ok();
  }
  Status Error(const char* key, const std::string& what) const {
    return InvalidArgumentError(file_ + ": key '" + Path(key) + "' " + what);
  }

 private:
  const toml::node* Node(const char* key) {
    used_.insert(key);
    if (table_ == nullptr) return nullptr;
    return table_->get(key);
  }
  template <typename T>
  Status Get(const char* key, T& out, const char* type) {
    const toml::node* n = Node(key);
    if (n == nullptr) return Status::Ok();
    auto v = n->value_exact<T>();
    if (!v) return Error(key, std::string("must be ") + type);
    out = *v;
    return Status::Ok();
  }
  std::string Path(const std::string& key) const {
    return prefix_.empty() ? key : prefix_ + "." + key;
  }

  const toml::table* table_;
  std::string prefix_;
  const std::string& file_;
  std::set<std::string> used_;
};

Status ApplyOverride(toml::table& root, const std::string& file, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgumentError("--set '" + assignment + "': expected key=value");
  }
  const std::string path = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  toml::table* table = &root;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    if (dot == std::string::npos) break;
    const std::string part = path.substr(start, dot - start);
    toml::node* n = table->get(part);
    if (n == nullptr) {
      table->insert(part, toml::table{});
      n = table->get(part);
    }
    if (!n->is_table()) {
      return InvalidArgumentError("--set " + path + ": '" + part + "' in " + file +
                                  " is not a table");
    }
    table = n->as_table();
    start = dot + 1;
  }
  const std::string leaf = path.substr(start);
  try {
    toml::table parsed = toml::parse("v = " + text);
    table->insert_or_assign(leaf, *parsed.get("v"));
  } catch (const toml::parse_error&) {
    table->insert_or_assign(leaf, text);  // Not a TOML value: take it as a bare string.
  }
  return Status::Ok();
}

// One policy's parameters from a TOML table: `where` names the table in errors.
Status ParseParamTable(const toml::table& t, const std::string& file, const std::string& where,
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
      return InvalidArgumentError(file + ": key '" + where + k +
                                  "' must be an integer, number, boolean or string");
    }
  }
  return Status::Ok();
}

// [policy.params]: the running policy's parameters, as plain keys (`decay = 0.9`) or in a table
// named after a policy (`[policy.params.ema_attention]`) that applies only when that policy
// runs, so that one config or sweep grid sets the parameters of several policies. The tables of
// the policies that do not run are checked against their parameters all the same.
Status ParsePolicyParams(const toml::table* t, const std::string& file, const std::string& policy,
                         RawParams& out) {
  if (t == nullptr) return Status::Ok();
  RawParams plain, own;
  for (const auto& [key, node] : *t) {
    const std::string k(key.str());
    const toml::table* sub = node.as_table();
    if (sub == nullptr) continue;
    const std::string where = "policy.params." + k + ".";
    StatusOr<const PolicyInfo*> info = FindPolicy(k);
    if (!info.ok()) {
      return InvalidArgumentError(file + ": table 'policy.params." + k +
                                  "' is not a policy's: " + info.status().message());
    }
    RawParams values;
    VTOKEN_RETURN_IF_ERROR(ParseParamTable(*sub, file, where, values));
    if (Status s = ResolveParams(k, (*info)->params, values).status(); !s.ok()) {
      return InvalidArgumentError(file + ": table 'policy.params." + k + "': " + s.message());
    }
    if (k == policy) own = std::move(values);
  }
  toml::table scalars;
  for (const auto& [key, node] : *t) {
    if (!node.is_table()) scalars.insert(key, node);
  }
  VTOKEN_RETURN_IF_ERROR(ParseParamTable(scalars, file, "policy.params.", plain));
  for (const auto& [key, value] : own) {
    if (plain.contains(key)) {
      return InvalidArgumentError(file + ": policy parameter '" + key + "' is given twice, as " +
                                  "'policy.params." + key + "' and 'policy.params." + policy +
                                  "." + key + "'");
    }
    plain[key] = value;
  }
  out = std::move(plain);
  return Status::Ok();
}

// A grid value as the TOML text an override takes ("4", "'h2o'", "[ 'naive' ]").
std::string TomlValueText(const toml::node& value) {
  if (auto d = value.value_exact<double>(); d && std::isfinite(*d)) {
    char buf[32];  // Shortest round-trip form: 0.9, not 0.90000000000000002.
    std::string text(buf, std::to_chars(buf, buf + sizeof(buf), *d).ptr);
    if (text.find_first_of(".e") == std::string::npos) text += ".0";
    return text;
  }
  toml::table holder;
  holder.insert("v", value);
  std::ostringstream out;
  out << holder;
  return out.str().substr(4);  // Drop "v = ".
}

// Flattens [sweep.grid] into axes: a quoted dotted key ("engine.max_num_seqs" = [...]) and an
// unquoted one (a nested table in TOML) name the same config key.
Status ParseGrid(const toml::table& t, const std::string& prefix, const std::string& file,
                 std::vector<SweepAxis>& axes) {
  for (const auto& [key, node] : t) {
    const std::string k =
        prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
    if (const toml::table* sub = node.as_table()) {
      VTOKEN_RETURN_IF_ERROR(ParseGrid(*sub, k, file, axes));
      continue;
    }
    const std::string where = file + ": key 'sweep.grid.\"" + k + "\"'";
    if (k == "db" || k == "sweep" || k.rfind("sweep.", 0) == 0) {
      return InvalidArgumentError(where + " cannot be swept (use --db and [sweep] name)");
    }
    const toml::array* values = node.as_array();
    if (values == nullptr || values->empty()) {
      return InvalidArgumentError(where + " must be a non-empty array of values");
    }
    SweepAxis axis{.key = k, .values = {}};
    for (const toml::node& v : *values) {
      if (v.is_table() || v.is_array_of_tables()) {
        return InvalidArgumentError(where + " values must not be tables");
      }
      const std::string text = TomlValueText(v);
      // Two equal points would run twice and share one config hash.
      if (std::find(axis.values.begin(), axis.values.end(), text) != axis.values.end()) {
        return InvalidArgumentError(where + " lists " + text + " twice");
      }
      axis.values.push_back(text);
    }
    for (const SweepAxis& other : axes) {
      if (other.key == k) return InvalidArgumentError(where + " is given twice");
    }
    axes.push_back(std::move(axis));
  }
  return Status::Ok();
}

Status ParseSweep(const toml::table* t, const std::string& file, ExperimentConfig& c) {
  Section sweep(t, "sweep", file);
  c.sweep_name = c.name;
  VTOKEN_RETURN_IF_ERROR(sweep.String("name", c.sweep_name));
  if (c.sweep_name.empty()) return sweep.Error("name", "must not be empty");
  VTOKEN_ASSIGN_OR_RETURN(const toml::table* grid, sweep.Table("grid"));
  if (grid != nullptr) VTOKEN_RETURN_IF_ERROR(ParseGrid(*grid, "", file, c.sweep_grid));
  // seeds: every point runs once per seed, with both the engine seed and the workload seed set
  // to it (repetitions for mean and confidence interval: `export --table points`).
  if (const toml::node* seeds_node = sweep.Raw("seeds")) {
    const toml::array* seeds = seeds_node->as_array();
    if (seeds == nullptr || seeds->empty()) return sweep.Error("seeds", "must be a non-empty array");
    SweepAxis axis{.key = "seed", .values = {}, .also = {"workload.seed"}};
    for (const toml::node& v : *seeds) {
      const std::optional<int64_t> seed = v.value<int64_t>();
      if (!v.is_integer() || !seed || *seed < 0) {
        return sweep.Error("seeds", "must list integers >= 0");
      }
      const std::string text = std::to_string(*seed);
      if (std::find(axis.values.begin(), axis.values.end(), text) != axis.values.end()) {
        return sweep.Error("seeds", "lists " + text + " twice");
      }
      axis.values.push_back(text);
    }
    for (const SweepAxis& other : c.sweep_grid) {
      if (other.key == "seed" || other.key == "workload.seed") {
        return sweep.Error("seeds", "cannot be combined with a [sweep.grid] axis \"" + other.key +
                                        "\"");
      }
    }
    c.sweep_grid.push_back(std::move(axis));
  }
  return sweep.Finish();
}

Status ParseSim(const toml::table* t, const std::string& file, ExperimentConfig& c) {
  if (t == nullptr) return Status::Ok();
  Section sim(t, "sim", file);
  if (!sim::IsSimSpec(c.model)) {
    return InvalidArgumentError(file + ": table [sim] needs a sim: model (model.path = \"sim:NAME\")");
  }
  sim::SimConfig& s = c.sim;
  VTOKEN_RETURN_IF_ERROR(sim.String("attention", s.attention));
  if (s.attention != "parametric" && (s.attention.rfind("trace:", 0) != 0 || s.attention.size() == 6)) {
    return sim.Error("attention", "must be \"parametric\" or \"trace:FILE\"");
  }
  VTOKEN_RETURN_IF_ERROR(sim.String("dtype", s.dtype));
  if (!sim::DtypeBytes(s.dtype).ok()) {
    return sim.Error("dtype", "must be \"bfloat16\", \"float16\" or \"float32\"");
  }
  std::string planner_time = s.measured_planner_time ? "measured" : "none";
  VTOKEN_RETURN_IF_ERROR(sim.String("planner_time", planner_time));
  if (planner_time != "none" && planner_time != "measured") {
    return sim.Error("planner_time", "must be \"none\" or \"measured\"");
  }
  s.measured_planner_time = planner_time == "measured";
  std::string policy_time = s.measured_policy_time ? "measured" : "none";
  VTOKEN_RETURN_IF_ERROR(sim.String("policy_time", policy_time));
  if (policy_time != "none" && policy_time != "measured") {
    return sim.Error("policy_time", "must be \"none\" or \"measured\"");
  }
  s.measured_policy_time = policy_time == "measured";
  std::string schedule_time = s.measured_schedule_time ? "measured" : "none";
  VTOKEN_RETURN_IF_ERROR(sim.String("schedule_time", schedule_time));
  if (schedule_time != "none" && schedule_time != "measured") {
    return sim.Error("schedule_time", "must be \"none\" or \"measured\"");
  }
  s.measured_schedule_time = schedule_time == "measured";
  VTOKEN_RETURN_IF_ERROR(sim.Uint("seed", s.seed));
  VTOKEN_RETURN_IF_ERROR(sim.Int("profile_tokens", s.profile_tokens));
  if (s.profile_tokens < 1) return sim.Error("profile_tokens", "must be >= 1");

  VTOKEN_ASSIGN_OR_RETURN(const toml::table* hw_t, sim.Table("hardware"));
  Section hw(hw_t, "sim.hardware", file);
  std::string preset_name = s.hardware.name;
  VTOKEN_RETURN_IF_ERROR(hw.String("preset", preset_name));
  StatusOr<sim::HardwareSpec> preset = sim::HardwarePreset(preset_name);
  if (!preset.ok()) return hw.Error("preset", preset.status().message());
  s.hardware = *preset;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  sim::HardwareSpec& h = s.hardware;
  double memory_gib = h.memory_bytes / kGiB, hbm_tbps = h.hbm_bandwidth / 1e12,
         peak_tflops = h.peak_flops / 1e12, copy_tbps = h.copy_bandwidth / 1e12,
         non_torch_gib = h.non_torch_bytes / kGiB;
  VTOKEN_RETURN_IF_ERROR(hw.Double("memory_gib", memory_gib));
  VTOKEN_RETURN_IF_ERROR(hw.Double("hbm_tbps", hbm_tbps));
  VTOKEN_RETURN_IF_ERROR(hw.Double("peak_tflops", peak_tflops));
  VTOKEN_RETURN_IF_ERROR(hw.Double("copy_tbps", copy_tbps));
  VTOKEN_RETURN_IF_ERROR(hw.Double("non_torch_gib", non_torch_gib));
  VTOKEN_RETURN_IF_ERROR(hw.Double("memory_efficiency", h.memory_efficiency));
  VTOKEN_RETURN_IF_ERROR(hw.Double("compute_efficiency", h.compute_efficiency));
  VTOKEN_RETURN_IF_ERROR(hw.Double("forward_overhead_s", h.forward_overhead_s));
  VTOKEN_RETURN_IF_ERROR(hw.Double("host_overhead_s", h.host_overhead_s));
  VTOKEN_RETURN_IF_ERROR(hw.Finish());
  h.memory_bytes = memory_gib * kGiB;
  h.hbm_bandwidth = hbm_tbps * 1e12;
  h.peak_flops = peak_tflops * 1e12;
  h.copy_bandwidth = copy_tbps * 1e12;
  h.non_torch_bytes = non_torch_gib * kGiB;
  Status valid = sim::ValidateHardware(h);
  if (!valid.ok()) return InvalidArgumentError(file + ": [sim.hardware] " + valid.message());

  VTOKEN_ASSIGN_OR_RETURN(const toml::table* par_t, sim.Table("parametric"));
  Section par(par_t, "sim.parametric", file);
  sim::ParametricParams& p = s.parametric;
  VTOKEN_RETURN_IF_ERROR(par.Int("num_sinks", p.num_sinks));
  VTOKEN_RETURN_IF_ERROR(par.Double("sink_weight", p.sink_weight));
  VTOKEN_RETURN_IF_ERROR(par.Double("recency_weight", p.recency_weight));
  VTOKEN_RETURN_IF_ERROR(par.Double("recency_exponent", p.recency_exponent));
  VTOKEN_RETURN_IF_ERROR(par.Double("importance_sigma", p.importance_sigma));
  VTOKEN_RETURN_IF_ERROR(par.Double("noise_sigma", p.noise_sigma));
  VTOKEN_RETURN_IF_ERROR(par.Double("key_norm_median", p.key_norm_median));
  VTOKEN_RETURN_IF_ERROR(par.Double("key_norm_rho", p.key_norm_rho));
  VTOKEN_RETURN_IF_ERROR(par.Double("key_norm_sigma", p.key_norm_sigma));
  VTOKEN_RETURN_IF_ERROR(par.Double("group_sigma", p.group_sigma));
  VTOKEN_RETURN_IF_ERROR(par.Uint("seed", p.seed));
  VTOKEN_RETURN_IF_ERROR(par.String("fitted_on", p.fitted_on));
  VTOKEN_RETURN_IF_ERROR(par.Finish());
  valid = p.Validate();
  if (!valid.ok()) return InvalidArgumentError(file + ": " + valid.message());
  return sim.Finish();
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
    return InvalidArgumentError(c.file + ": key 'engine.gpu_memory_utilization': " +
                                p.status().message());
  }
  if (p->num_blocks > INT32_MAX) {
    return InvalidArgumentError(c.file + ": key 'engine.gpu_memory_utilization' gives " +
                                std::to_string(p->num_blocks) + " blocks, more than a pool holds");
  }
  if (given_blocks && *given_blocks != p->num_blocks) {
    return InvalidArgumentError(c.file + ": key 'engine.num_blocks' = " +
                                std::to_string(*given_blocks) + " disagrees with the " +
                                std::to_string(p->num_blocks) +
                                " blocks engine.gpu_memory_utilization gives: give one");
  }
  c.engine.pool.num_blocks = static_cast<int32_t>(p->num_blocks);
  c.pool_sizing = c.sim.hardware.name + ", " + c.model + ": " + p->Explain();
  return Status::Ok();
}

Status Parse(const toml::table& root, ExperimentConfig& c) {
  const std::string& f = c.file;
  Section top(&root, "", f);
  std::vector<std::string> modes = {"native", "naive", "vtoken"};
  VTOKEN_RETURN_IF_ERROR(top.String("name", c.name));
  VTOKEN_RETURN_IF_ERROR(top.StringArray("modes", modes));
  VTOKEN_RETURN_IF_ERROR(top.String("db", c.db));
  VTOKEN_RETURN_IF_ERROR(top.Uint("seed", c.engine.seed));

  VTOKEN_ASSIGN_OR_RETURN(const toml::table* model_t, top.Table("model"));
  Section model(model_t, "model", f);
  VTOKEN_RETURN_IF_ERROR(model.String("path", c.model));
  VTOKEN_RETURN_IF_ERROR(model.Uint("seed", c.model_seed));
  VTOKEN_RETURN_IF_ERROR(model.String("device", c.model_device));
  if (!model::ParseDeviceSpec(c.model_device).ok()) {
    return model.Error("device", "must be \"cpu\", \"cuda\" or \"cuda:N\"");
  }
  VTOKEN_RETURN_IF_ERROR(model.String("dtype", c.model_dtype));
  if (!model::ParseComputeDtype(c.model_dtype).ok()) {
    return model.Error("dtype", "must be \"float32\", \"bfloat16\" or \"float16\"");
  }
  VTOKEN_RETURN_IF_ERROR(model.Int("threads", c.model_threads));
  if (c.model_threads < 0 || c.model_threads > 1024) {
    return model.Error("threads", "must be 0 (every CPU this process may use) to 1024");
  }
  VTOKEN_RETURN_IF_ERROR(model.Finish());

  engine::WorkloadOptions& w = c.workload;
  VTOKEN_ASSIGN_OR_RETURN(const toml::table* work_t, top.Table("workload"));
  Section work(work_t, "workload", f);
  VTOKEN_RETURN_IF_ERROR(work.String("kind", w.kind));
  VTOKEN_RETURN_IF_ERROR(work.Int("num_requests", w.num_requests));
  VTOKEN_RETURN_IF_ERROR(work.Uint("seed", w.seed));
  VTOKEN_RETURN_IF_ERROR(work.Double("input_mean", w.input_mean));
  VTOKEN_RETURN_IF_ERROR(work.Double("output_mean", w.output_mean));
  VTOKEN_RETURN_IF_ERROR(work.Double("length_sigma", w.length_sigma));
  VTOKEN_RETURN_IF_ERROR(work.Int("input_min", w.input_min));
  VTOKEN_RETURN_IF_ERROR(work.Int("input_max", w.input_max));
  VTOKEN_RETURN_IF_ERROR(work.Int("output_min", w.output_min));
  VTOKEN_RETURN_IF_ERROR(work.Int("output_max", w.output_max));
  VTOKEN_RETURN_IF_ERROR(work.Int("max_total_tokens", w.max_total_tokens));
  VTOKEN_RETURN_IF_ERROR(work.String("arrival", w.arrival));
  VTOKEN_RETURN_IF_ERROR(work.Double("rate", w.rate));
  VTOKEN_RETURN_IF_ERROR(work.Double("gamma_cv", w.gamma_cv));
  VTOKEN_RETURN_IF_ERROR(work.Int32("prefix_sharing_degree", w.prefix_sharing_degree));
  VTOKEN_RETURN_IF_ERROR(work.Double("shared_prefix_fraction", w.shared_prefix_fraction));
  VTOKEN_RETURN_IF_ERROR(work.String("jsonl", w.jsonl_path));
  VTOKEN_RETURN_IF_ERROR(work.Int("jsonl_default_max_tokens", w.jsonl_default_max_tokens));
  VTOKEN_RETURN_IF_ERROR(work.String("prompt_template", w.prompt_template));
  VTOKEN_RETURN_IF_ERROR(work.String("truncate", w.truncate));
  VTOKEN_RETURN_IF_ERROR(work.String("corpus", w.corpus_path));
  VTOKEN_RETURN_IF_ERROR(work.Bool("chat", w.chat));
  VTOKEN_RETURN_IF_ERROR(work.String("task", w.task));
  VTOKEN_RETURN_IF_ERROR(work.Int("context_tokens", w.context_tokens));
  VTOKEN_RETURN_IF_ERROR(work.DoubleArray("depths", w.depths));
  VTOKEN_RETURN_IF_ERROR(work.String("filler", w.filler));
  std::string protocol = engine::TaskProtocolName(w.protocol);
  VTOKEN_RETURN_IF_ERROR(work.String("protocol", protocol));
  if (StatusOr<engine::TaskProtocol> p = engine::ParseTaskProtocol(protocol); p.ok()) {
    w.protocol = *p;
  } else {
    return work.Error("protocol", "must be \"question_aware\" or \"query_agnostic\"");
  }
  VTOKEN_RETURN_IF_ERROR(work.Finish());

  engine::EngineOptions& e = c.engine;
  VTOKEN_ASSIGN_OR_RETURN(const toml::table* eng_t, top.Table("engine"));
  Section eng(eng_t, "engine", f);
  VTOKEN_RETURN_IF_ERROR(eng.Int32("num_blocks", e.pool.num_blocks));
  VTOKEN_RETURN_IF_ERROR(eng.Int32("block_size", e.pool.block_size));
  VTOKEN_RETURN_IF_ERROR(eng.Int32("headroom_blocks", e.pool.headroom_blocks));
  VTOKEN_RETURN_IF_ERROR(eng.Int32("max_num_seqs", e.max_num_seqs));
  std::string admission = "reserve";
  VTOKEN_RETURN_IF_ERROR(eng.String("admission", admission));
  if (admission == "reserve") {
    e.admission = engine::EngineOptions::Admission::kReserve;
  } else if (admission == "greedy") {
    e.admission = engine::EngineOptions::Admission::kGreedy;
  } else {
    return eng.Error("admission", "must be \"reserve\" or \"greedy\"");
  }
  VTOKEN_RETURN_IF_ERROR(eng.Int("max_prefill_chunk", e.max_prefill_chunk));
  VTOKEN_RETURN_IF_ERROR(eng.Int("max_batched_tokens", e.max_batched_tokens));
  VTOKEN_RETURN_IF_ERROR(eng.Bool("indirection_only", e.indirection_only));
  VTOKEN_RETURN_IF_ERROR(eng.Bool("force_sync", e.force_sync));
  VTOKEN_RETURN_IF_ERROR(eng.Bool("stop_at_eos", e.stop_at_eos));
  VTOKEN_RETURN_IF_ERROR(eng.Int32("obs_window", e.obs_window));
  VTOKEN_RETURN_IF_ERROR(eng.Bool("verify", e.verify));
  VTOKEN_RETURN_IF_ERROR(eng.Bool("async_copies", c.async_copies));
  VTOKEN_RETURN_IF_ERROR(eng.Bool("cuda_graphs", c.cuda_graphs));
  if (c.cuda_graphs && (sim::IsSimSpec(c.model) || c.model_device.rfind("cuda", 0) != 0)) {
    return eng.Error("cuda_graphs", "needs model.device = \"cuda\" (a real or synthetic model)");
  }
  VTOKEN_RETURN_IF_ERROR(eng.Double("gpu_memory_utilization", c.gpu_memory_utilization));
  std::optional<int32_t> blocks_given;
  if (c.gpu_memory_utilization != 0) {
    if (!sim::IsSimSpec(c.model)) {
      return eng.Error("gpu_memory_utilization", "needs a sim: model (model.path = \"sim:NAME\")");
    }
    if (eng_t->get("num_blocks") != nullptr) blocks_given = e.pool.num_blocks;
  }
  VTOKEN_RETURN_IF_ERROR(eng.Finish());

  VTOKEN_ASSIGN_OR_RETURN(const toml::table* pol_t, top.Table("policy"));
  Section pol(pol_t, "policy", f);
  VTOKEN_RETURN_IF_ERROR(pol.String("name", e.policy));
  VTOKEN_RETURN_IF_ERROR(pol.Int("budget_tokens", e.evictor.budget_tokens));
  VTOKEN_RETURN_IF_ERROR(pol.Double("keep_ratio", e.evictor.keep_ratio));
  if (pol_t != nullptr && pol_t->get("budget_tokens") != nullptr &&
      pol_t->get("keep_ratio") == nullptr) {
    e.evictor.keep_ratio = 0;  // An absolute budget replaces the default ratio.
  }
  VTOKEN_RETURN_IF_ERROR(pol.Int("num_sink", e.evictor.num_sink));
  VTOKEN_RETURN_IF_ERROR(pol.Int("num_recent", e.evictor.num_recent));
  VTOKEN_RETURN_IF_ERROR(pol.Int("evict_interval", e.evictor.evict_interval));
  std::string allocation = "uniform";
  VTOKEN_RETURN_IF_ERROR(pol.String("budget_allocation", allocation));
  StatusOr<BudgetAllocation> parsed_allocation = ParseBudgetAllocation(allocation);
  if (!parsed_allocation.ok()) {
    return pol.Error("budget_allocation", "must be \"uniform\", \"pyramid\" or \"adaptive\"");
  }
  e.evictor.allocation = *parsed_allocation;
  VTOKEN_RETURN_IF_ERROR(pol.Double("pyramid_beta", e.evictor.pyramid_beta));
  VTOKEN_RETURN_IF_ERROR(pol.Double("adaptive_floor", e.evictor.adaptive_floor));
  VTOKEN_ASSIGN_OR_RETURN(const toml::table* params_t, pol.Table("params"));
  VTOKEN_RETURN_IF_ERROR(ParsePolicyParams(params_t, f, e.policy, e.policy_params));
  VTOKEN_RETURN_IF_ERROR(pol.Finish());

  VTOKEN_ASSIGN_OR_RETURN(const toml::table* cache_t, top.Table("cache"));
  Section cache(cache_t, "cache", f);
  std::string granularity = "token";
  VTOKEN_RETURN_IF_ERROR(cache.String("granularity", granularity));
  StatusOr<Granularity> parsed_granularity = ParseGranularity(granularity);
  if (!parsed_granularity.ok()) {
    return cache.Error("granularity", "must be \"token\", \"layer\" or \"head\"");
  }
  c.granularity = *parsed_granularity;
  e.evictor.granularity = c.granularity;
  VTOKEN_RETURN_IF_ERROR(cache.Finish());
  if (Status fits = CheckAllocationFits(e.evictor.allocation, c.granularity); !fits.ok()) {
    return pol.Error("budget_allocation", fits.message());
  }
  if (!(e.evictor.pyramid_beta >= 1)) return pol.Error("pyramid_beta", "must be >= 1");
  if (!(e.evictor.adaptive_floor >= 0 && e.evictor.adaptive_floor <= 1)) {
    return pol.Error("adaptive_floor", "must be in [0, 1]");
  }

  VTOKEN_ASSIGN_OR_RETURN(const toml::table* rec_t, top.Table("reclaim"));
  Section rec(rec_t, "reclaim", f);
  std::string trigger = "pressure";
  VTOKEN_RETURN_IF_ERROR(rec.String("trigger", trigger));
  StatusOr<ReclaimOptions::Trigger> t = ParseTrigger(trigger);
  if (!t.ok()) return rec.Error("trigger", "must be \"pressure\" or \"always\"");
  e.reclaim.trigger = *t;
  VTOKEN_RETURN_IF_ERROR(rec.Double("frag_threshold", e.reclaim.frag_threshold));
  VTOKEN_RETURN_IF_ERROR(rec.Double("low_watermark", e.reclaim.low_watermark));
  VTOKEN_RETURN_IF_ERROR(rec.Int("max_moves_per_step", e.reclaim.max_moves_per_step));
  VTOKEN_RETURN_IF_ERROR(rec.Finish());

  VTOKEN_ASSIGN_OR_RETURN(const toml::table* samp_t, top.Table("sampling"));
  Section samp(samp_t, "sampling", f);
  VTOKEN_RETURN_IF_ERROR(samp.Double("temperature", e.sampling.temperature));
  VTOKEN_RETURN_IF_ERROR(samp.Double("top_p", e.sampling.top_p));
  VTOKEN_RETURN_IF_ERROR(samp.Uint("seed", e.sampling.seed));
  VTOKEN_RETURN_IF_ERROR(samp.Finish());
  if (!(std::isfinite(e.sampling.temperature) && e.sampling.temperature >= 0)) {
    return samp.Error("temperature", "must be a finite number >= 0 (0 = greedy)");
  }
  if (!(e.sampling.top_p > 0 && e.sampling.top_p <= 1)) {
    return samp.Error("top_p", "must be in (0, 1]");
  }

  VTOKEN_ASSIGN_OR_RETURN(const toml::table* sim_t, top.Table("sim"));
  VTOKEN_RETURN_IF_ERROR(ParseSim(sim_t, f, c));

  VTOKEN_ASSIGN_OR_RETURN(const toml::table* sweep_t, top.Table("sweep"));
  c.has_sweep_table = sweep_t != nullptr;
  VTOKEN_RETURN_IF_ERROR(ParseSweep(sweep_t, f, c));
  VTOKEN_RETURN_IF_ERROR(top.Finish());

  // Counts bounded before any arithmetic on them (engine.* and policy.* are int64 tokens).
  const std::tuple<Section*, const char*, int64_t> counts[] = {
      {&eng, "max_prefill_chunk", e.max_prefill_chunk},
      {&eng, "max_batched_tokens", e.max_batched_tokens},
      {&pol, "budget_tokens", e.evictor.budget_tokens},
      {&pol, "num_sink", e.evictor.num_sink},
      {&pol, "num_recent", e.evictor.num_recent},
      {&pol, "evict_interval", e.evictor.evict_interval},
      {&rec, "max_moves_per_step", e.reclaim.max_moves_per_step}};
  for (const auto& [section, key, value] : counts) {
    if (value > engine::kMaxRequestTokens) {
      return section->Error(key, "must be <= " + std::to_string(engine::kMaxRequestTokens));
    }
  }

  // Modes: native first, so the others can be scored against its outputs.
  c.modes.clear();
  for (const std::string& m : modes) {
    StatusOr<Mode> mode = ParseMode(m);
    if (!mode.ok()) return top.Error("modes", mode.status().message());
    if (std::find(c.modes.begin(), c.modes.end(), *mode) != c.modes.end()) {
      return top.Error("modes", "names mode " + m + " twice");
    }
    c.modes.push_back(*mode);
  }
  if (c.modes.empty()) return top.Error("modes", "must name at least one mode");
  std::stable_sort(c.modes.begin(), c.modes.end(), [](Mode a, Mode b) {
    return (a == Mode::kNative) > (b == Mode::kNative);
  });
  if (c.engine.evictor.keep_ratio > 0 && c.engine.evictor.budget_tokens > 0) {
    return pol.Error("budget_tokens", "and policy.keep_ratio are exclusive: give one");
  }
  VTOKEN_RETURN_IF_ERROR(SizePoolFromUtilization(c, blocks_given));
  if (int64_t{e.pool.num_blocks} * std::max(1, e.pool.block_size) > kMaxSlots) {
    return eng.Error("num_blocks", "= " + std::to_string(e.pool.num_blocks) +
                                       " x engine.block_size " +
                                       std::to_string(e.pool.block_size) + " = " +
                                       std::to_string(int64_t{e.pool.num_blocks} *
                                                      e.pool.block_size) +
                                       " slots, more than the " + std::to_string(kMaxSlots) +
                                       " a pool can hold");
  }
  if (Status valid = ValidateBlockPoolOptions(e.pool); !valid.ok()) {
    return InvalidArgumentError(f + ": engine: " + valid.message());
  }
  VTOKEN_RETURN_IF_ERROR(ValidateReclaimOptions(e.reclaim));
  if (Status valid = engine::ValidateWorkloadOptions(w); !valid.ok()) {
    return InvalidArgumentError(f + ": " + valid.message());
  }
  if (std::find(c.modes.begin(), c.modes.end(), Mode::kNative) == c.modes.end() ||
      c.modes.size() > 1) {
    VTOKEN_RETURN_IF_ERROR(ValidateEvictorOptions(e.evictor));
  }
  return Status::Ok();
}


// Every key with its effective value (defaults included) for one mode: what a run ran. How a
// config is swept ([sweep]) and where results go (db) are not part of it.
toml::table ResolvedTable(const ExperimentConfig& c, Mode mode) {
  const engine::WorkloadOptions& w = c.workload;
  const engine::EngineOptions& e = c.engine;
  auto i64 = [](auto v) { return static_cast<int64_t>(v); };
  toml::table params;
  for (const auto& [key, value] : e.policy_params) {
    std::visit([&, k = key](const auto& v) { params.insert_or_assign(k, v); }, value);
  }
  toml::table resolved{
      {"name", c.name},
      {"modes", toml::array{std::string(ModeName(mode))}},
      {"seed", i64(e.seed)},
      {"model", toml::table{{"path", c.model}, {"seed", i64(c.model_seed)}}},
      {"workload",
       toml::table{{"kind", w.kind},
                   {"num_requests", w.num_requests},
                   {"seed", i64(w.seed)},
                   {"input_mean", w.input_mean},
                   {"output_mean", w.output_mean},
                   {"length_sigma", w.length_sigma},
                   {"input_min", w.input_min},
                   {"input_max", w.input_max},
                   {"output_min", w.output_min},
                   {"output_max", w.output_max},
                   {"max_total_tokens", w.max_total_tokens},
                   {"arrival", w.arrival},
                   {"rate", w.rate},
                   {"gamma_cv", w.gamma_cv},
                   {"prefix_sharing_degree", i64(w.prefix_sharing_degree)},
                   {"shared_prefix_fraction", w.shared_prefix_fraction},
                   {"jsonl", w.jsonl_path},
                   {"jsonl_default_max_tokens", w.jsonl_default_max_tokens},
                   {"corpus", w.corpus_path}}},
      {"engine",
       toml::table{
           {"num_blocks", i64(e.pool.num_blocks)},
           {"block_size", i64(e.pool.block_size)},
           {"headroom_blocks", i64(e.pool.headroom_blocks)},
           {"max_num_seqs", i64(e.max_num_seqs)},
           {"admission", e.admission == engine::EngineOptions::Admission::kReserve ? "reserve"
                                                                                    : "greedy"},
           {"max_prefill_chunk", e.max_prefill_chunk},
           {"indirection_only", e.indirection_only},
           {"force_sync", e.force_sync},
           {"stop_at_eos", e.stop_at_eos},
           {"obs_window", i64(e.obs_window)},
           {"verify", e.verify},
           {"async_copies", c.async_copies}}},
      {"policy", toml::table{{"name", e.policy},
                             {"budget_tokens", e.evictor.budget_tokens},
                             {"keep_ratio", e.evictor.keep_ratio},
                             {"num_sink", e.evictor.num_sink},
                             {"num_recent", e.evictor.num_recent},
                             {"evict_interval", e.evictor.evict_interval},
                             {"params", params}}},
      {"reclaim",
       toml::table{{"trigger", e.reclaim.trigger == ReclaimOptions::Trigger::kAlways ? "always"
                                                                                     : "pressure"},
                   {"frag_threshold", e.reclaim.frag_threshold},
                   {"low_watermark", e.reclaim.low_watermark},
                   {"max_moves_per_step", e.reclaim.max_moves_per_step}}},
      {"sampling", toml::table{{"temperature", e.sampling.temperature},
                               {"top_p", e.sampling.top_p},
                               {"seed", i64(e.sampling.seed)}}},
  };
  // Keys recorded only when they differ from the defaults, so that older runs' hashes stay.
  if (c.model_device != "cpu") resolved["model"].as_table()->insert("device", c.model_device);
  if (c.model_dtype != "float32") resolved["model"].as_table()->insert("dtype", c.model_dtype);
  if (c.model_threads != 0) resolved["model"].as_table()->insert("threads", c.model_threads);
  if (c.cuda_graphs) resolved["engine"].as_table()->insert("cuda_graphs", true);
  // Keys that only sim: models have, so the resolved configs (and hashes) of other runs stay.
  if (c.gpu_memory_utilization != 0) {
    resolved["engine"].as_table()->insert("gpu_memory_utilization", c.gpu_memory_utilization);
  }
  if (e.max_batched_tokens != 0) {
    resolved["engine"].as_table()->insert("max_batched_tokens", e.max_batched_tokens);
  }
  // jsonl reading options, recorded only when set (older runs' hashes stay).
  const engine::WorkloadOptions defaults;
  if (w.prompt_template != defaults.prompt_template) {
    resolved["workload"].as_table()->insert("prompt_template", w.prompt_template);
  }
  if (w.truncate != defaults.truncate) {
    resolved["workload"].as_table()->insert("truncate", w.truncate);
  }
  if (w.chat) resolved["workload"].as_table()->insert("chat", true);
  if (w.kind == "task") {  // Task keys exist for kind task only (older runs' hashes stay).
    toml::table& work = *resolved["workload"].as_table();
    work.insert("task", w.task);
    work.insert("context_tokens", w.context_tokens);
    toml::array depths;
    for (double d : w.depths) depths.push_back(d);
    work.insert("depths", depths);
    work.insert("filler", w.filler);
    work.insert("protocol", engine::TaskProtocolName(w.protocol));
  }
  if (w.kind == "perplexity") {
    resolved["workload"].as_table()->insert("context_tokens", w.context_tokens);
  }
  // Per-layer / per-head KV groups (token granularity records nothing, as before they existed).
  if (c.granularity != Granularity::kToken) {
    resolved.insert("cache", toml::table{{"granularity", GranularityName(c.granularity)}});
  }
  toml::table& policy = *resolved["policy"].as_table();
  if (e.evictor.allocation != BudgetAllocation::kUniform) {
    policy.insert("budget_allocation", BudgetAllocationName(e.evictor.allocation));
  }
  if (e.evictor.allocation == BudgetAllocation::kPyramid) {
    policy.insert("pyramid_beta", e.evictor.pyramid_beta);
  }
  if (e.evictor.allocation == BudgetAllocation::kAdaptive) {
    policy.insert("adaptive_floor", e.evictor.adaptive_floor);
  }
  if (sim::IsSimSpec(c.model)) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    const sim::SimConfig& s = c.sim;
    const sim::HardwareSpec& h = s.hardware;
    const sim::ParametricParams& p = s.parametric;
    resolved.insert(
        "sim",
        toml::table{
            {"attention", s.attention},
            {"dtype", s.dtype},
            {"planner_time", s.measured_planner_time ? "measured" : "none"},
            {"seed", i64(s.seed)},
            {"profile_tokens", s.profile_tokens},
            {"hardware",
             toml::table{{"preset", h.name},
                         {"memory_gib", h.memory_bytes / kGiB},
                         {"hbm_tbps", h.hbm_bandwidth / 1e12},
                         {"peak_tflops", h.peak_flops / 1e12},
                         {"copy_tbps", h.copy_bandwidth / 1e12},
                         {"non_torch_gib", h.non_torch_bytes / kGiB},
                         {"memory_efficiency", h.memory_efficiency},
                         {"compute_efficiency", h.compute_efficiency},
                         {"forward_overhead_s", h.forward_overhead_s},
                         {"host_overhead_s", h.host_overhead_s}}},
            {"parametric", toml::table{{"num_sinks", p.num_sinks},
                                       {"sink_weight", p.sink_weight},
                                       {"recency_weight", p.recency_weight},
                                       {"recency_exponent", p.recency_exponent},
                                       {"importance_sigma", p.importance_sigma},
                                       {"noise_sigma", p.noise_sigma},
                                       {"key_norm_median", p.key_norm_median},
                                       {"key_norm_rho", p.key_norm_rho},
                                       {"key_norm_sigma", p.key_norm_sigma},
                                       {"seed", i64(p.seed)},
                                       {"fitted_on", p.fitted_on}}}});
    if (c.granularity != Granularity::kToken) {
      resolved["sim"]["parametric"].as_table()->insert("group_sigma", p.group_sigma);
    }
    // Only when measured: the configs from before the key keep their hashes.
    if (s.measured_policy_time) resolved["sim"].as_table()->insert("policy_time", "measured");
    if (s.measured_schedule_time) {
      resolved["sim"].as_table()->insert("schedule_time", "measured");
    }
  }
  // Native mode neither evicts nor reclaims: its run does not depend on [policy] or [reclaim],
  // so the points of a sweep that differ only there share one native run (one config hash).
  if (mode == Mode::kNative) {
    resolved.erase("policy");
    resolved.erase("reclaim");
  }
  return resolved;
}

}  // namespace

StatusOr<ExperimentConfig> LoadExperimentConfig(const std::string& path,
                                                const std::vector<std::string>& overrides) {
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
  for (const std::string& o : overrides) VTOKEN_RETURN_IF_ERROR(ApplyOverride(root, path, o));
  ExperimentConfig c;
  c.file = path;
  c.name = std::filesystem::path(path).stem().string();
  VTOKEN_RETURN_IF_ERROR(Parse(root, c));
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

std::string ConfigHash(const std::string& resolved_toml) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(XXH64(resolved_toml.data(), resolved_toml.size(), 0)));
  return buf;
}

}  // namespace vtoken::cli
