#include "lib/pypolicy/python_policy.h"

#include <pybind11/embed.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "lib/core/policy.h"
#include "lib/core/policy_registry.h"
#include "lib/core/token_signal.h"

namespace py = pybind11;

namespace vtoken {
namespace {

// The interpreter is started once and never finalized (registered policies live until exit).
// The thread that starts it gives up the interpreter lock at once, so that whichever thread
// calls a policy takes it for the call.
void EnsureInterpreter() {
  static std::once_flag once;
  std::call_once(once, [] {
    py::initialize_interpreter();
    PyEval_SaveThread();
  });
}

// The first line of a Python exception's text ("TypeError: ...").
std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// What a class declared, checked once at registration.
struct PyPolicyClass {
  std::string name;
  std::vector<std::string> attention_signals;  // Of attn, attn_sum, key_norm, as declared.
  uint8_t signal_bits = 0;
  std::vector<std::string> token_signals;  // Registered token signals, as declared.
  int32_t state_size = 0;
  bool has_observe = false;
  py::object* cls = nullptr;  // Never freed: the class lives as long as the registry.
};

float AttentionSignal(const TokenView& t, const std::string& name) {
  if (name == "attn") return t.attn;
  if (name == "attn_sum") return t.attn_sum;
  return t.key_norm;
}

// An instance of a registered Python policy class.
class PythonPolicy final : public Policy {
 public:
  PythonPolicy(std::shared_ptr<const PyPolicyClass> cls, py::object instance)
      : cls_(std::move(cls)), instance_(std::move(instance)) {}
  ~PythonPolicy() override {
    py::gil_scoped_acquire gil;
    instance_ = py::object();
  }

  uint8_t signals() const override { return cls_->signal_bits; }
  std::vector<std::string> token_signals() const override { return cls_->token_signals; }
  int32_t state_size() const override { return cls_->state_size; }

  void Observe(std::span<const TokenView> tokens, PolicyContext& ctx) const override {
    if (!cls_->has_observe || !failure().ok()) return;
    Record(Call("observe", tokens, ctx, {}));
  }
  void Score(std::span<const TokenView> tokens, PolicyContext& ctx,
             std::span<float> scores) const override {
    // After a failure the scores are not read (the evictor returns failure() first).
    if (failure().ok()) Record(Call("score", tokens, ctx, scores));
  }
  Status failure() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

  // Calls `method` with the tokens as numpy arrays; "score" writes `scores`, "observe" the
  // tokens' state. InvalidArgument naming the policy for an exception or a malformed result.
  Status Call(const char* method, std::span<const TokenView> tokens, PolicyContext& ctx,
              std::span<float> scores) const {
    py::gil_scoped_acquire gil;
    const auto n = static_cast<py::ssize_t>(tokens.size());
    const auto ss = static_cast<py::ssize_t>(cls_->state_size);
    try {
      py::dict t;
      py::array_t<int64_t> position(n), age(n);
      for (py::ssize_t i = 0; i < n; ++i) {
        position.mutable_at(i) = tokens[i].position;
        age.mutable_at(i) = tokens[i].age;
      }
      t["position"] = position;
      t["age"] = age;
      for (const std::string& name : cls_->attention_signals) {
        py::array_t<float> a(n);
        for (py::ssize_t i = 0; i < n; ++i) a.mutable_at(i) = AttentionSignal(tokens[i], name);
        t[name.c_str()] = a;
      }
      // A plain name's values as (n,), a view's (NAME@layer, NAME@head) as (n, columns).
      for (size_t j = 0; j < cls_->token_signals.size(); ++j) {
        const std::string& name = cls_->token_signals[j];
        const std::span<const int32_t> offsets = ctx.token_signal_offsets;
        const py::ssize_t columns = offsets.empty() ? 1 : offsets[j + 1] - offsets[j];
        const bool view = name.find('@') != std::string::npos;
        py::array_t<float> a = view ? py::array_t<float>({n, columns}) : py::array_t<float>(n);
        for (py::ssize_t i = 0; i < n; ++i) {
          const std::span<const float> v = ctx.token_signal(tokens[i], j);
          std::copy(v.begin(), v.end(), a.mutable_data() + i * columns);
        }
        t[name.c_str()] = a;
      }
      py::array_t<float> state;  // Only for a policy with state.
      if (ss > 0) {
        state = py::array_t<float>({n, ss});
        for (py::ssize_t i = 0; i < n; ++i) {
          std::copy_n(tokens[i].state.data(), ss, state.mutable_data(i, 0));
        }
        t["state"] = state;
      }
      py::dict c;
      c["step"] = ctx.step;
      c["budget"] = ctx.budget;
      c["group"] = ctx.group;
      c["seed"] = ctx.rng.Next();
      py::object result = instance_.attr(method)(t, c);
      if (scores.data() == nullptr) {  // observe: the state comes back through `state`.
        for (py::ssize_t i = 0; ss > 0 && i < n; ++i) {
          std::copy_n(state.data(i, 0), ss, tokens[i].state.data());
        }
        return Status::Ok();
      }
      const auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(result);
      if (!a || a.ndim() != 1 || a.shape(0) != n) {
        return InvalidArgumentError("python policy " + cls_->name + ": score must return " +
                                    std::to_string(n) + " numbers (one per token), got " +
                                    std::string(py::str(py::repr(result))).substr(0, 80));
      }
      std::copy_n(a.data(), n, scores.data());
      return Status::Ok();
    } catch (py::error_already_set& e) {
      return InvalidArgumentError("python policy " + cls_->name + ": " + method + " raised " +
                                  FirstLine(e.what()));
    } catch (const std::exception& e) {
      return InvalidArgumentError("python policy " + cls_->name + ": " + method + ": " + e.what());
    }
  }

 private:
  // Keeps the first failure for failure() (the evictor returns it; later calls do nothing).
  void Record(const Status& status) const {
    if (status.ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.ok()) failure_ = status;
  }

  std::shared_ptr<const PyPolicyClass> cls_;
  py::object instance_;
  // The one mutable member a policy may have: its failure, behind a lock (Policy::failure).
  mutable std::mutex mu_;
  mutable Status failure_;
};

py::object ToPython(const ParamValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return py::int_(*i);
  if (const auto* d = std::get_if<double>(&v)) return py::float_(*d);
  if (const auto* b = std::get_if<bool>(&v)) return py::bool_(*b);
  return py::str(std::get<std::string>(v));
}

bool SnakeCase(const std::string& s) {
  if (s.empty() || !(s[0] >= 'a' && s[0] <= 'z')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// Reads and checks the class's declarations (GIL held).
StatusOr<std::shared_ptr<PyPolicyClass>> Declarations(const py::object& cls,
                                                      const std::string& where,
                                                      std::vector<ParamSpec>& params,
                                                      std::string& rule) {
  auto out = std::make_shared<PyPolicyClass>();
  auto bad = [&](const std::string& what) { return InvalidArgumentError(where + ": " + what); };
  if (!py::hasattr(cls, "name") || !py::isinstance<py::str>(cls.attr("name"))) {
    return bad("the class needs a string attribute name (the policy's registered name)");
  }
  out->name = py::str(cls.attr("name"));
  if (!SnakeCase(out->name)) return bad("name '" + out->name + "' is not snake_case");
  rule = py::hasattr(cls, "rule") ? std::string(py::str(cls.attr("rule"))) : "a Python policy";
  if (!py::hasattr(cls, "score")) return bad("the class has no score(self, tokens, ctx) method");
  out->has_observe = py::hasattr(cls, "observe");
  if (py::hasattr(cls, "state_size")) {
    if (!py::isinstance<py::int_>(cls.attr("state_size"))) return bad("state_size must be an int");
    const auto ss = cls.attr("state_size").cast<int64_t>();
    if (ss < 0 || ss > 1024) return bad("state_size must be in [0, 1024]");
    out->state_size = static_cast<int32_t>(ss);
  }
  if (py::hasattr(cls, "signals")) {
    for (const py::handle h : cls.attr("signals")) {
      if (!py::isinstance<py::str>(h)) return bad("signals must be a list of names");
      const std::string name = py::str(h);
      if (name == "attn" || name == "attn_sum" || name == "key_norm") {
        out->attention_signals.push_back(name);
        out->signal_bits |= name == "attn"       ? kAttnSignal
                            : name == "attn_sum" ? kAttnSumSignal
                                                 : kKeyNormSignal;
      } else if (StatusOr<const TokenSignalInfo*> info = FindTokenSignal(name); info.ok()) {
        out->token_signals.push_back(name);
      } else {
        return bad("signals: '" + name + "' is neither attn, attn_sum, key_norm nor a " +
                   info.status().message().substr(std::string("unknown ").size()));
      }
    }
  }
  if (py::hasattr(cls, "params")) {
    if (!py::isinstance<py::dict>(cls.attr("params"))) return bad("params must be a dict");
    for (const auto& [k, v] : cls.attr("params").cast<py::dict>()) {
      const std::string name = py::str(k);
      const std::string help = "parameter of the Python policy " + out->name;
      if (py::isinstance<py::bool_>(v)) {
        params.push_back(BoolParam(name, v.cast<bool>(), help));
      } else if (py::isinstance<py::int_>(v)) {
        params.push_back(IntParam(name, v.cast<int64_t>(), help));
      } else if (py::isinstance<py::float_>(v)) {
        params.push_back(DoubleParam(name, v.cast<double>(), help));
      } else if (py::isinstance<py::str>(v)) {
        params.push_back(StringParam(name, v.cast<std::string>(), help));
      } else {
        return bad("params['" + name + "'] must be a float, int, bool or str default");
      }
    }
  }
  return out;
}

}  // namespace

bool PythonPoliciesAvailable() { return true; }

StatusOr<std::string> RegisterPythonPolicy(std::string_view spec_text) {
  const std::string spec(spec_text);
  const size_t colon = spec.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size()) {
    return InvalidArgumentError("python policy '" + spec + "': expected FILE.py:CLASS");
  }
  const std::filesystem::path file = std::filesystem::absolute(spec.substr(0, colon));
  const std::string class_name = spec.substr(colon + 1);
  if (file.extension() != ".py") {
    return InvalidArgumentError("python policy '" + spec + "': " + file.string() +
                                " is not a .py file");
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    return NotFoundError("python policy '" + spec + "': no file " + file.string());
  }
  EnsureInterpreter();
  py::gil_scoped_acquire gil;
  std::shared_ptr<PyPolicyClass> cls;
  std::vector<ParamSpec> params;
  std::string rule;
  try {
    py::module_ sys = py::module_::import("sys");
    sys.attr("path").attr("insert")(0, file.parent_path().string());
    py::module_ util = py::module_::import("importlib.util");
    const std::string module_name = "vtoken_python_policy_" + file.stem().string();
    py::object loader_spec = util.attr("spec_from_file_location")(module_name, file.string());
    py::object module = util.attr("module_from_spec")(loader_spec);
    sys.attr("modules")[module_name.c_str()] = module;
    loader_spec.attr("loader").attr("exec_module")(module);
    if (!py::hasattr(module, class_name.c_str())) {
      return NotFoundError("python policy '" + spec + "': " + file.filename().string() +
                           " has no class " + class_name);
    }
    py::object c = module.attr(class_name.c_str());
    VTOKEN_ASSIGN_OR_RETURN(cls, Declarations(c, "python policy '" + spec + "'", params, rule));
    cls->cls = new py::object(c);
  } catch (py::error_already_set& e) {
    return InvalidArgumentError("python policy '" + spec + "': loading " +
                                file.filename().string() + " raised " + FirstLine(e.what()));
  }
  if (FindPolicy(cls->name).ok()) {
    return FailedPreconditionError("python policy '" + spec + "': the name '" + cls->name +
                                   "' is taken by " + (*FindPolicy(cls->name))->source_file);
  }
  std::shared_ptr<const PyPolicyClass> shared = cls;
  auto make = [shared](const PolicyParams& p) -> StatusOr<std::unique_ptr<PythonPolicy>> {
    py::gil_scoped_acquire gil;
    try {
      py::dict kwargs;
      for (const auto& [name, value] : p.values()) kwargs[name.c_str()] = ToPython(value);
      return std::make_unique<PythonPolicy>(shared, (*shared->cls)(**kwargs));
    } catch (py::error_already_set& e) {
      return InvalidArgumentError("python policy " + shared->name + ": constructing it raised " +
                                  FirstLine(e.what()));
    }
  };
  // A first call on eight synthetic tokens with the default parameters: the usual mistakes
  // (a wrong signature, a name error, a score of the wrong length) become this Status.
  {
    py::gil_scoped_release release;
    RawParams defaults;
    for (const ParamSpec& s : params) defaults[s.name] = s.default_value;
    StatusOr<std::unique_ptr<PythonPolicy>> trial = make(PolicyParams(defaults));
    if (!trial.ok()) return trial.status();
    // Views get two columns here (as for a model of two layers of one KV head).
    std::vector<int32_t> offsets{0};
    for (const std::string& name : shared->token_signals) {
      offsets.push_back(offsets.back() + (name.find('@') == std::string::npos ? 1 : 2));
    }
    const size_t n = 8, nv = static_cast<size_t>(offsets.back());
    const auto ss = static_cast<size_t>(shared->state_size);
    std::vector<float> state(n * ss, 0.0f), values(n * nv, 1.0f), scores(n, 0.0f);
    std::vector<TokenView> views(n);
    for (size_t i = 0; i < n; ++i) {
      views[i] = TokenView{.position = static_cast<TokenId>(i),
                           .attn = 1.0f / n,
                           .attn_sum = 1.0f / n,
                           .key_norm = 1.0f,
                           .state = std::span<float>(state).subspan(i * ss, ss),
                           .token_signals = std::span<const float>(values).subspan(i * nv, nv)};
    }
    PolicyRng rng(1);
    PolicyContext ctx{.step = 0, .budget = 4, .rng = rng, .token_signal_offsets = offsets};
    if (shared->has_observe && ss > 0) {
      VTOKEN_RETURN_IF_ERROR((*trial)->Call("observe", views, ctx, {}));
    }
    VTOKEN_RETURN_IF_ERROR((*trial)->Call("score", views, ctx, scores));
    PolicyInfo info{shared->name, rule, params, file.string(), nullptr};
    info.factory = [make](const PolicyParams& p) -> std::unique_ptr<Policy> {
      StatusOr<std::unique_ptr<PythonPolicy>> policy = make(p);
      if (!policy.ok()) {
        std::fprintf(stderr, "vtoken: error: %s\n", policy.status().message().c_str());
        std::fflush(stderr);
        std::_Exit(1);
      }
      return std::unique_ptr<Policy>(std::move(*policy));
    };
    RegisterPolicy(std::move(info));
  }
  return shared->name;
}

Status RegisterPythonPoliciesFromEnvironment() {
  const char* env = std::getenv("VTOKEN_PYTHON_POLICIES");
  if (env == nullptr || *env == 0) return Status::Ok();
  std::string list(env);
  size_t begin = 0;
  while (begin <= list.size()) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const std::string spec = list.substr(begin, end - begin);
    if (!spec.empty()) {
      StatusOr<std::string> name = RegisterPythonPolicy(spec);
      if (!name.ok()) {
        return Status(name.status().code(), "VTOKEN_PYTHON_POLICIES: " + name.status().message());
      }
    }
    begin = end + 1;
  }
  return Status::Ok();
}

}  // namespace vtoken
