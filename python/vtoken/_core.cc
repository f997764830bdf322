// vtoken._core: pybind11 bindings of lib/core for people who run their own model loop. Binds the
// existing API unchanged (docs/PYTHON.md): VirtualKvCache, ReclaimPlanner, the policy registry,
// Policy (score / observe one sequence's signals), PolicyEvictor and RunCheck. Slots, tokens and
// moves cross the boundary as numpy int64 arrays; a non-OK Status becomes a Python exception of
// the class named after its code (vtoken.NotFoundError, ...), carrying the Status message.
//
// Not thread-safe, like the classes it binds: use one cache from one Python thread.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/core/check_harness.h"
#include "lib/core/policy.h"
#include "lib/core/policy_evictor.h"
#include "lib/core/policy_registry.h"
#include "lib/core/reclaim_planner.h"
#include "lib/core/virtual_kv_cache.h"

namespace py = pybind11;

namespace vtoken {
namespace {

using I64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

// Exception classes by StatusCode, created in the module init.
PyObject* g_errors[7] = {};

[[noreturn]] void Throw(const Status& status) {
  PyErr_SetString(g_errors[static_cast<int>(status.code())], status.message().c_str());
  throw py::error_already_set();
}

void Check(const Status& status) {
  if (!status.ok()) Throw(status);
}

template <typename T>
T Value(StatusOr<T> s) {
  if (!s.ok()) Throw(s.status());
  return std::move(s).value();
}

[[noreturn]] void ThrowInvalid(const std::string& message) { Throw(InvalidArgumentError(message)); }

template <typename T>
py::array_t<T> ToArray(const std::vector<T>& v) {
  py::array_t<T> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

// Moves as an (n, 3) int64 array of (token, src, dst).
py::array_t<int64_t> MovesArray(const std::vector<Move>& moves) {
  py::array_t<int64_t> out({static_cast<py::ssize_t>(moves.size()), py::ssize_t{3}});
  auto m = out.mutable_unchecked<2>();
  for (size_t i = 0; i < moves.size(); ++i) {
    m(i, 0) = moves[i].token;
    m(i, 1) = moves[i].src;
    m(i, 2) = moves[i].dst;
  }
  return out;
}

std::vector<Move> MovesFrom(const I64Array& a) {
  if (a.size() == 0) return {};
  if (a.ndim() != 2 || a.shape(1) != 3) {
    ThrowInvalid("moves must be an (n, 3) array of (token, src, dst)");
  }
  auto m = a.unchecked<2>();
  std::vector<Move> moves(static_cast<size_t>(a.shape(0)));
  for (size_t i = 0; i < moves.size(); ++i) moves[i] = Move{m(i, 0), m(i, 1), m(i, 2)};
  return moves;
}

// Slot copies as an (n, 2) int64 array of (src, dst).
py::array_t<int64_t> CopiesArray(const std::vector<SlotCopy>& copies) {
  py::array_t<int64_t> out({static_cast<py::ssize_t>(copies.size()), py::ssize_t{2}});
  auto m = out.mutable_unchecked<2>();
  for (size_t i = 0; i < copies.size(); ++i) {
    m(i, 0) = copies[i].src;
    m(i, 1) = copies[i].dst;
  }
  return out;
}

Mode ModeFrom(const std::string& name) { return Value(ParseMode(name)); }

// Python keyword values -> RawParams (bool before int: a Python bool is an int).
RawParams RawFrom(const py::dict& kwargs) {
  RawParams raw;
  for (auto [k, v] : kwargs) {
    const std::string key = py::cast<std::string>(k);
    if (py::isinstance<py::bool_>(v)) {
      raw[key] = v.cast<bool>();
    } else if (py::isinstance<py::int_>(v)) {
      raw[key] = v.cast<int64_t>();
    } else if (py::isinstance<py::float_>(v)) {
      raw[key] = v.cast<double>();
    } else if (py::isinstance<py::str>(v)) {
      raw[key] = v.cast<std::string>();
    } else {
      ThrowInvalid("policy parameter " + key + ": expected int, float, bool or str, got " +
                   py::str(py::type::of(v)).cast<std::string>());
    }
  }
  return raw;
}

py::object ParamValueObject(const ParamValue& v) {
  switch (TypeOf(v)) {
    case ParamType::kInt:
      return py::int_(std::get<int64_t>(v));
    case ParamType::kDouble:
      return py::float_(std::get<double>(v));
    case ParamType::kBool:
      return py::bool_(std::get<bool>(v));
    case ParamType::kString:
      return py::str(std::get<std::string>(v));
  }
  return py::none();
}

py::dict FragStatsDict(const FragStats& s) {
  py::dict d;
  d["block_size"] = s.block_size;
  d["allocated_blocks"] = s.allocated_blocks;
  d["live_slots"] = s.live_slots;
  d["waste_ratio"] = s.waste_ratio;
  d["utilization_hist"] =
      std::vector<int64_t>(s.utilization_hist.begin(), s.utilization_hist.end());
  d["ideal_blocks"] = s.ideal_blocks;
  d["held_blocks"] = s.held_blocks;
  d["num_seqs"] = s.num_seqs;
  return d;
}

// One sequence's signals for Policy.score / observe: a mapping (dict, pandas DataFrame) with any
// of position, age, attn, attn_sum, key_norm and the policy's token signals by name (1-D, one
// entry per live token, logical order) and state ((n, state_size), dicts only; or the `state`
// argument). Missing: position = 0..n-1, the others 0.
struct Signals {
  std::vector<TokenId> position;
  std::vector<int64_t> age;
  std::vector<float> attn, attn_sum, key_norm, state, token_values;
  std::vector<int32_t> offsets;  // PolicyContext::token_signal_offsets.
  int32_t state_size = 0;
  std::vector<TokenView> views;

  Signals(const py::object& signals, const py::object& state_arg, int32_t ssize,
          const std::vector<std::string>& token_signals)
      : state_size(ssize) {
    static const char* kNames[] = {"position", "age", "attn", "attn_sum", "key_norm"};
    py::ssize_t n = -1;
    std::string first;
    auto column = [&](const char* name) -> py::object {
      if (!signals.contains(name)) return py::none();
      py::array a = py::array::ensure(py::object(signals[name]));
      if (!a || a.ndim() != 1) ThrowInvalid(std::string("signal ") + name + " must be 1-D");
      if (n < 0) {
        n = a.shape(0);
        first = name;
      } else if (a.shape(0) != n) {
        ThrowInvalid(std::string("signal ") + name + " has " + std::to_string(a.shape(0)) +
                     " entries, " + first + " has " + std::to_string(n));
      }
      return a;
    };
    py::object cols[5];
    for (int i = 0; i < 5; ++i) cols[i] = column(kNames[i]);
    for (size_t j = 0; n < 0 && j < token_signals.size(); ++j) {  // Or a token signal's length.
      if (!signals.contains(token_signals[j].c_str())) continue;
      const py::array a = py::array::ensure(py::object(signals[token_signals[j].c_str()]));
      if (a && a.ndim() >= 1) n = a.shape(0), first = token_signals[j];
    }
    if (n < 0) {
      ThrowInvalid(
          "signals: none of position, age, attn, attn_sum, key_norm or the policy's "
          "token signals given");
    }
    const auto size = static_cast<size_t>(n);
    position.resize(size);
    age.assign(size, 0);
    attn.assign(size, 0);
    attn_sum.assign(size, 0);
    key_norm.assign(size, 0);
    for (size_t i = 0; i < size; ++i) position[i] = static_cast<TokenId>(i);
    if (!cols[0].is_none()) CopyInto(I64Array::ensure(cols[0]), position);
    if (!cols[1].is_none()) CopyInto(I64Array::ensure(cols[1]), age);
    if (!cols[2].is_none()) CopyInto(F32Array::ensure(cols[2]), attn);
    if (!cols[3].is_none()) CopyInto(F32Array::ensure(cols[3]), attn_sum);
    if (!cols[4].is_none()) CopyInto(F32Array::ensure(cols[4]), key_norm);
    state.assign(size * static_cast<size_t>(state_size), 0);
    py::object st = state_arg;
    if (st.is_none() && py::isinstance<py::dict>(signals) && signals.contains("state")) {
      st = signals["state"];
    }
    if (!st.is_none() && state_size > 0) {
      F32Array a = F32Array::ensure(st);
      if (!a || a.size() != static_cast<py::ssize_t>(state.size())) {
        ThrowInvalid("state must hold " + std::to_string(size) + " x " +
                     std::to_string(state_size) + " floats");
      }
      std::copy(a.data(), a.data() + a.size(), state.begin());
    }
    // A token signal is a 1-D array, or (n, columns) for a view (NAME@layer, NAME@head); one
    // not given is one column of zeros.
    std::vector<F32Array> given(token_signals.size());
    offsets.assign(1, 0);
    for (size_t j = 0; j < token_signals.size(); ++j) {
      const std::string& name = token_signals[j];
      int32_t columns = 1;
      if (signals.contains(name.c_str())) {
        given[j] = F32Array::ensure(py::object(signals[name.c_str()]));
        const F32Array& a = given[j];
        if (!a || a.ndim() < 1 || a.ndim() > 2 || a.shape(0) != n) {
          ThrowInvalid("token signal " + name + " must be (" + std::to_string(n) + ",) or (" +
                       std::to_string(n) + ", columns) floats");
        }
        columns = a.ndim() == 2 ? static_cast<int32_t>(a.shape(1)) : 1;
      }
      offsets.push_back(offsets.back() + columns);
    }
    const auto nv = static_cast<size_t>(offsets.back());
    token_values.assign(size * nv, 0);
    for (size_t j = 0; j < token_signals.size(); ++j) {
      if (!given[j]) continue;
      const auto first = static_cast<size_t>(offsets[j]);
      const auto columns = static_cast<size_t>(offsets[j + 1]) - first;
      for (size_t i = 0; i < size; ++i) {
        std::copy_n(given[j].data() + i * columns, columns, token_values.data() + i * nv + first);
      }
    }
    views.resize(size);
    for (size_t i = 0; i < size; ++i) {
      views[i] = TokenView{
          .position = position[i],
          .age = age[i],
          .attn = attn[i],
          .attn_sum = attn_sum[i],
          .key_norm = key_norm[i],
          .state = std::span<float>(state.data() + i * state_size, static_cast<size_t>(state_size)),
          .token_signals = std::span<const float>(token_values.data() + i * nv, nv)};
    }
  }

  template <typename A, typename T>
  static void CopyInto(const A& a, std::vector<T>& out) {
    std::copy(a.data(), a.data() + a.size(), out.begin());
  }
};

std::vector<std::string> SignalNames(std::span<const TokenSignalInfo* const> infos) {
  std::vector<std::string> names;
  for (const TokenSignalInfo* i : infos) names.push_back(i->name);
  return names;
}

// A registered policy constructed with resolved parameters.
struct PyPolicy {
  std::string name;
  std::unique_ptr<Policy> policy;

  py::array_t<float> Score(const py::object& signals, int64_t budget, int64_t step, uint64_t seed,
                           const py::object& state) const {
    if (budget < 1) ThrowInvalid("budget must be >= 1");
    Signals s(signals, state, policy->state_size(), policy->token_signals());
    std::vector<float> scores(s.views.size(), 0.0f);
    PolicyRng rng(seed);
    PolicyContext ctx{
        .step = step, .budget = budget, .rng = rng, .token_signal_offsets = s.offsets};
    policy->Score(s.views, ctx, scores);
    return ToArray(scores);
  }

  py::array_t<float> Observe(const py::object& signals, int64_t budget, int64_t step, uint64_t seed,
                             const py::object& state) const {
    if (budget < 1) ThrowInvalid("budget must be >= 1");
    Signals s(signals, state, policy->state_size(), policy->token_signals());
    PolicyRng rng(seed);
    PolicyContext ctx{
        .step = step, .budget = budget, .rng = rng, .token_signal_offsets = s.offsets};
    policy->Observe(s.views, ctx);
    py::array_t<float> out(
        {static_cast<py::ssize_t>(s.views.size()), static_cast<py::ssize_t>(s.state_size)});
    std::copy(s.state.begin(), s.state.end(), out.mutable_data());
    return out;
  }
};

py::dict CheckReportDict(const CheckReport& r) {
  py::dict d;
  d["steps"] = r.steps;
  d["evictions"] = r.evictions;
  d["appended_tokens"] = r.appended_tokens;
  d["forks"] = r.forks;
  d["pool_exhausted"] = r.pool_exhausted;
  d["relocations"] = r.relocations;
  d["tokens_moved"] = r.tokens_moved;
  d["blocks_reclaimed"] = r.blocks_reclaimed;
  d["hash_checks"] = r.hash_checks;
  d["invariant_checks"] = r.invariant_checks;
  d["tokens_verified"] = r.tokens_verified;
  d["fence_waits"] = r.fence_waits;
  d["violations"] = r.violations;
  d["first_violations"] = r.first_violations;
  return d;
}

void BindErrors(py::module_& m) {
  PyObject* base = PyErr_NewExceptionWithDoc(
      "vtoken._core.VtokenError", "A vtoken Status that is not OK; str() is its message.",
      PyExc_RuntimeError, nullptr);
  m.add_object("VtokenError", py::handle(base));
  struct Spec {
    StatusCode code;
    const char* name;
    PyObject* extra;
  };
  const Spec specs[] = {
      {StatusCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError},
      {StatusCode::kNotFound, "NotFoundError", PyExc_LookupError},
      {StatusCode::kFailedPrecondition, "FailedPreconditionError", nullptr},
      {StatusCode::kResourceExhausted, "ResourceExhaustedError", nullptr},
      {StatusCode::kDataLoss, "DataLossError", nullptr},
      {StatusCode::kInternal, "InternalError", nullptr},
  };
  g_errors[0] = base;
  for (const Spec& s : specs) {
    py::tuple bases = s.extra ? py::make_tuple(py::handle(base), py::handle(s.extra))
                              : py::make_tuple(py::handle(base));
    PyObject* cls =
        PyErr_NewException((std::string("vtoken._core.") + s.name).c_str(), bases.ptr(), nullptr);
    g_errors[static_cast<int>(s.code)] = cls;
    m.add_object(s.name, py::handle(cls));
  }
}

// NotFound for an unknown sequence or a group outside [0, num_groups).
void CheckSeqGroup(const VirtualKvCache& c, SeqId s, int32_t g) {
  if (!c.HasSequence(s)) Throw(NotFoundError("unknown sequence " + std::to_string(s)));
  if (g < 0 || g >= c.num_groups()) {
    Throw(NotFoundError("unknown group " + std::to_string(g) + " (" +
                        std::to_string(c.num_groups()) + " groups)"));
  }
}

void BindCache(py::module_& m) {
  py::class_<SeqRelocation>(m, "SeqRelocation", "The moves of one sequence in a relocation.")
      .def_readonly("seq", &SeqRelocation::seq)
      .def_readonly("group", &SeqRelocation::group, "KV group (0 at token granularity)")
      .def_property_readonly(
          "moves", [](const SeqRelocation& s) { return MovesArray(s.moves); },
          "(n, 3) int64 array of (token, src slot, dst slot), logical order")
      .def_property_readonly("src_blocks",
                             [](const SeqRelocation& s) { return ToArray(s.src_blocks); })
      .def_property_readonly("dst_blocks",
                             [](const SeqRelocation& s) { return ToArray(s.dst_blocks); });

  py::class_<Relocation>(m, "Relocation", "A relocation begun by begin_relocation.")
      .def_readonly("id", &Relocation::id)
      .def_readonly("seqs", &Relocation::seqs)
      .def_property_readonly("num_moves", &Relocation::num_moves)
      .def(
          "copies", [](const Relocation& r) { return CopiesArray(r.Copies()); },
          "(n, 2) int64 array of (src slot, dst slot): copy each token's KV in every layer")
      .def("__len__", &Relocation::num_moves);

  py::class_<SeqPlan>(m, "SeqPlan")
      .def_readonly("seq", &SeqPlan::seq)
      .def_property_readonly("src_blocks", [](const SeqPlan& p) { return ToArray(p.src_blocks); })
      .def_readonly("num_moves", &SeqPlan::num_moves)
      .def_readonly("num_dst_blocks", &SeqPlan::num_dst_blocks);

  py::class_<ReclaimPlan>(m, "ReclaimPlan",
                          "ReclaimPlanner.plan's output (lib/core/reclaim_plan.h).")
      .def_readonly("snapshot_version", &ReclaimPlan::snapshot_version)
      .def_readonly("seqs", &ReclaimPlan::seqs)
      .def_readonly("num_moves", &ReclaimPlan::num_moves)
      .def_readonly("num_src_blocks", &ReclaimPlan::num_src_blocks)
      .def_readonly("num_dst_blocks", &ReclaimPlan::num_dst_blocks)
      .def_property_readonly("blocks_freed", &ReclaimPlan::blocks_freed)
      .def("empty", &ReclaimPlan::empty)
      .def("__bool__", [](const ReclaimPlan& p) { return !p.empty(); })
      .def("__repr__", [](const ReclaimPlan& p) {
        return "<ReclaimPlan " + std::to_string(p.seqs.size()) + " seqs, " +
               std::to_string(p.num_moves) + " moves, frees " + std::to_string(p.blocks_freed()) +
               " blocks>";
      });

  py::class_<VirtualKvCache>(m, "VirtualKvCache",
                             "Token table + block pool (lib/core/virtual_kv_cache.h).")
      .def(py::init([](int32_t num_blocks, int32_t block_size, int32_t headroom_blocks,
                       const std::string& mode, int32_t num_groups) {
             CacheOptions o{.mode = ModeFrom(mode),
                            .pool = {.num_blocks = num_blocks,
                                     .block_size = block_size,
                                     .headroom_blocks = headroom_blocks},
                            .num_groups = num_groups};
             Check(ValidateCacheOptions(o));
             return std::make_unique<VirtualKvCache>(o);
           }),
           py::arg("num_blocks"), py::arg("block_size") = 16, py::arg("headroom_blocks") = 0,
           py::arg("mode") = "vtoken", py::arg("num_groups") = 1,
           "num_groups: KV groups per sequence (1 token, L per layer, L * H_kv per head), each "
           "with its own token table; sync_new_tokens then returns [num_groups * n] slots, "
           "group-major.")
      .def_property_readonly("num_groups", &VirtualKvCache::num_groups)
      .def_property_readonly("mode", [](const VirtualKvCache& c) { return ModeName(c.mode()); })
      .def_property_readonly("block_size", &VirtualKvCache::block_size)
      .def_property_readonly("num_blocks",
                             [](const VirtualKvCache& c) { return c.pool().num_blocks(); })
      .def_property_readonly("num_slots",
                             [](const VirtualKvCache& c) { return c.pool().num_slots(); })
      .def_property_readonly("headroom_blocks",
                             [](const VirtualKvCache& c) { return c.pool().headroom_blocks(); })
      .def_property_readonly("num_free_blocks",
                             [](const VirtualKvCache& c) { return c.pool().num_free_blocks(); })
      .def_property_readonly("version", &VirtualKvCache::version)
      .def("add_sequence", &VirtualKvCache::AddSequence,
           "Creates an empty sequence; returns its id.")
      .def(
          "fork_sequence",
          [](VirtualKvCache& c, SeqId parent, int64_t n) {
            ForkResult f = Value(c.ForkSequence(parent, n));
            return py::make_tuple(f.child, CopiesArray(f.copies));
          },
          py::arg("parent"), py::arg("num_tokens"),
          "Returns (child, copies): copies is an (n, 2) array of (src, dst) slots to copy.")
      .def("free_sequence", [](VirtualKvCache& c, SeqId s) { Check(c.FreeSequence(s)); })
      .def(
          "sync_new_tokens",
          [](VirtualKvCache& c, SeqId s, int64_t n) {
            return ToArray(Value(c.SyncNewTokens(s, n)));
          },
          py::arg("seq"), py::arg("n"),
          "Registers n new tokens; returns their slots (int64 array) to write their KV to.")
      .def(
          "evict_token",
          [](VirtualKvCache& c, SeqId s, TokenId t, std::optional<int32_t> g) {
            Check(g ? c.EvictToken(s, *g, t) : c.EvictToken(s, t));
          },
          py::arg("seq"), py::arg("token"), py::arg("group") = py::none(),
          "Evicts the token from one KV group, or (group None) from every group where it lives.")
      .def(
          "evict_tokens",
          [](VirtualKvCache& c, SeqId s, const I64Array& tokens, std::optional<int32_t> g) {
            const int64_t* t = tokens.data();
            for (py::ssize_t i = 0; i < tokens.size(); ++i) {
              Check(g ? c.EvictToken(s, *g, t[i]) : c.EvictToken(s, t[i]));
            }
          },
          py::arg("seq"), py::arg("tokens"), py::arg("group") = py::none(),
          "evict_token for each; stops at the first error (earlier tokens stay evicted).")
      .def("begin_relocation",
           [](VirtualKvCache& c, const ReclaimPlan& p) { return Value(c.BeginRelocation(p)); })
      .def(
          "apply_moves",
          [](VirtualKvCache& c, SeqId s, const I64Array& moves, int32_t group) {
            std::vector<Move> mv = MovesFrom(moves);
            Check(c.ApplyMoves(s, mv, group));
          },
          py::arg("seq"), py::arg("moves"), py::arg("group") = 0)
      .def("live_moves", [](const VirtualKvCache& c,
                            const SeqRelocation& r) { return MovesArray(c.LiveMoves(r)); })
      .def("complete_relocation",
           [](VirtualKvCache& c, uint64_t id) { Check(c.CompleteRelocation(id)); })
      .def("is_slot_pending", &VirtualKvCache::IsSlotPending)
      .def("has_pending_reads", &VirtualKvCache::HasPendingReads)
      .def("in_flight_relocations", &VirtualKvCache::InFlightRelocations)
      .def("has_sequence", &VirtualKvCache::HasSequence)
      .def("sequences", &VirtualKvCache::Sequences)
      .def("num_tokens",
           [](const VirtualKvCache& c, SeqId s) {
             if (!c.HasSequence(s)) Throw(NotFoundError("unknown sequence " + std::to_string(s)));
             return c.num_tokens(s);
           })
      .def("num_live",
           [](const VirtualKvCache& c, SeqId s) {
             if (!c.HasSequence(s)) Throw(NotFoundError("unknown sequence " + std::to_string(s)));
             return c.num_live(s);
           })
      .def("num_blocks_held",
           [](const VirtualKvCache& c, SeqId s) {
             if (!c.HasSequence(s)) Throw(NotFoundError("unknown sequence " + std::to_string(s)));
             return c.num_blocks_held(s);
           })
      .def(
          "live_slots",
          [](const VirtualKvCache& c, SeqId s, int32_t g) {
            CheckSeqGroup(c, s, g);
            return ToArray(c.LiveSlots(s, g));
          },
          py::arg("seq"), py::arg("group") = 0,
          "Slots of the group's live tokens in logical order (what attention reads), int64 array.")
      .def(
          "live_tokens",
          [](const VirtualKvCache& c, SeqId s, int32_t g) {
            CheckSeqGroup(c, s, g);
            return ToArray(c.table(s, g).LiveTokens());
          },
          py::arg("seq"), py::arg("group") = 0,
          "Logical ids (= RoPE positions) of the group's live tokens, increasing, int64 array.")
      .def(
          "ideal_blocks",
          [](const VirtualKvCache& c, SeqId s) {
            CheckSeqGroup(c, s, 0);
            return c.IdealBlocks(s);
          },
          "Sum over the sequence's groups of ceil(live / block_size).")
      .def("blocks_needed_for", &VirtualKvCache::BlocksNeededFor)
      .def(
          "stats", [](const VirtualKvCache& c) { return FragStatsDict(c.Stats()); },
          "Fragmentation figures (docs/METRICS.md) as a dict.")
      .def("check_invariants", [](const VirtualKvCache& c) { Check(c.CheckInvariants()); });

  py::class_<ReclaimPlanner>(m, "ReclaimPlanner", "Which sparse blocks to repack (pure).")
      .def(py::init([](const std::string& trigger, double frag_threshold, double low_watermark,
                       int64_t max_moves_per_step) {
             ReclaimOptions o{.trigger = Value(ParseTrigger(trigger)),
                              .frag_threshold = frag_threshold,
                              .low_watermark = low_watermark,
                              .max_moves_per_step = max_moves_per_step};
             Check(ValidateReclaimOptions(o));
             return std::make_unique<ReclaimPlanner>(o);
           }),
           // The defaults are ReclaimOptions's, the one declaration the config keys read too.
           py::arg("trigger") = "pressure",
           py::arg("frag_threshold") = ReclaimOptions{}.frag_threshold,
           py::arg("low_watermark") = ReclaimOptions{}.low_watermark,
           py::arg("max_moves_per_step") = ReclaimOptions{}.max_moves_per_step)
      .def("triggered", [](const ReclaimPlanner& p,
                           const VirtualKvCache& c) { return p.Triggered(c.PoolSnapshot()); })
      .def(
          "plan", [](const ReclaimPlanner& p, const VirtualKvCache& c) { return c.PlanReclaim(p); },
          "The plan for the cache's current state (empty when not triggered or nothing pays).");
}

void BindPolicies(py::module_& m) {
  py::class_<PolicyInfo>(m, "PolicyInfo", "A registered policy.")
      .def_readonly("name", &PolicyInfo::name)
      .def_readonly("rule", &PolicyInfo::rule)
      .def_readonly("source_file", &PolicyInfo::source_file)
      .def_property_readonly("params",
                             [](const PolicyInfo& info) {
                               py::list out;
                               for (const ParamSpec& p : info.params) {
                                 py::dict d;
                                 d["name"] = p.name;
                                 d["type"] = ParamTypeName(TypeOf(p.default_value));
                                 d["default"] = ParamValueObject(p.default_value);
                                 d["help"] = p.help;
                                 d["min"] = p.min;
                                 d["max"] = p.max;
                                 d["min_exclusive"] = p.min_exclusive;
                                 d["max_exclusive"] = p.max_exclusive;
                                 d["choices"] = p.choices;
                                 out.append(d);
                               }
                               return out;
                             })
      .def("__repr__", [](const PolicyInfo& i) { return "<PolicyInfo " + i.name + ">"; });

  m.def("policies", &RegisteredPolicies, py::return_value_policy::reference,
        "Every registered policy, sorted by name.");
  m.def(
      "token_signals",
      [] {
        py::list out;
        for (const TokenSignalInfo* info : RegisteredTokenSignals()) {
          py::dict d;
          d["name"] = info->name;
          d["doc"] = info->doc;
          d["source_file"] = info->source_file;
          d["relative"] = info->relative();
          d["queries"] = info->queries;
          out.append(d);
        }
        return out;
      },
      "Every registered token signal (signals/*.cc): name, doc, source_file, relative (computed "
      "over the live tokens at each eviction, not once per token), queries (reads the runner's "
      "statistics of the sequence's queries), sorted by name.");

  py::class_<PyPolicy>(m, "Policy", "A registered policy built with its parameters.")
      .def(py::init([](const std::string& name, const py::kwargs& params) {
             RawParams raw = RawFrom(params);
             return std::make_unique<PyPolicy>(PyPolicy{name, Value(CreatePolicy(name, raw))});
           }),
           py::arg("name"))
      .def_readonly("name", &PyPolicy::name)
      .def_property_readonly("state_size", [](const PyPolicy& p) { return p.policy->state_size(); })
      .def_property_readonly(
          "token_signals", [](const PyPolicy& p) { return p.policy->token_signals(); },
          "The token signals it reads (names; columns of the same names in `signals`).")
      .def("score", &PyPolicy::Score, py::arg("signals"), py::arg("budget"), py::kw_only(),
           py::arg("step") = 0, py::arg("seed") = 0, py::arg("state") = py::none(),
           "Scores one sequence's live tokens (higher = keep); float32 array.")
      .def("observe", &PyPolicy::Observe, py::arg("signals"), py::arg("budget"), py::kw_only(),
           py::arg("step") = 0, py::arg("seed") = 0, py::arg("state") = py::none(),
           "Runs Observe; returns the tokens' new state, (n, state_size) float32.");

  py::class_<PolicyEvictor>(m, "Evictor",
                            "Budget, protection and victims over a policy (policy_evictor.h).")
      .def(py::init([](const std::string& policy, int64_t budget_tokens, double keep_ratio,
                       int64_t num_sink, int64_t num_recent, int64_t evict_interval, uint64_t seed,
                       int32_t num_layers, int32_t num_kv_heads, const py::kwargs& params) {
             EvictorOptions o{.budget_tokens = budget_tokens,
                              .keep_ratio = keep_ratio,
                              .num_sink = num_sink,
                              .num_recent = num_recent,
                              .evict_interval = evict_interval,
                              .seed = seed,
                              .num_layers = num_layers,
                              .num_kv_heads = num_kv_heads};
             return Value(PolicyEvictor::Create(policy, RawFrom(params), o));
           }),
           py::arg("policy"), py::kw_only(), py::arg("budget_tokens") = 0,
           py::arg("keep_ratio") = 0.0, py::arg("num_sink") = 0, py::arg("num_recent") = 0,
           py::arg("evict_interval") = 1, py::arg("seed") = 0, py::arg("num_layers") = 1,
           py::arg("num_kv_heads") = 1,
           "One KV group per token (token granularity); num_layers and num_kv_heads set how many "
           "columns a token signal view (NAME@layer, NAME@head) has.")
      .def_property_readonly("policy", &PolicyEvictor::policy_name)
      .def(
          "observe",
          [](PolicyEvictor& e, SeqId seq, const I64Array& live, const F32Array& attn,
             const F32Array& key_norm, const py::object& token_values) {
            std::vector<float> values;
            if (!token_values.is_none()) {
              const F32Array v = F32Array::ensure(token_values);
              if (!v) ThrowInvalid("token_values must be a float array");
              values.assign(v.data(), v.data() + v.size());
            }
            Check(e.Observe(seq, std::span<const TokenId>(live.data(), live.size()),
                            std::span<const float>(attn.data(), attn.size()),
                            std::span<const float>(key_norm.data(), key_norm.size()), values));
          },
          py::arg("seq"), py::arg("live_tokens"), py::arg("attn"), py::arg("key_norm"),
          py::arg("token_values") = py::none(),
          "token_values: the absolute token signals of the tokens with ids >= unseen_from(seq), "
          "(new tokens, absolute_width) float32; None when the policy reads none.")
      .def(
          "observe_relative",
          [](PolicyEvictor& e, SeqId seq, const F32Array& values) {
            Check(e.ObserveRelative(seq, 0, std::span<const float>(values.data(), values.size())));
          },
          py::arg("seq"), py::arg("values"),
          "On an eviction step (scores_next(seq) before observe), after observe: the relative "
          "token signals of every live token, (live tokens, relative_width) float32.")
      .def(
          "scores_next", [](const PolicyEvictor& e, SeqId seq) { return e.ScoresNext(seq); },
          py::arg("seq"),
          "Whether seq's next step is an eviction step (relative token signals needed).")
      .def_property_readonly("token_signals",
                             [](const PolicyEvictor& e) { return SignalNames(e.token_signals()); })
      .def_property_readonly(
          "absolute_token_signals",
          [](const PolicyEvictor& e) { return SignalNames(e.absolute_token_signals()); })
      .def_property_readonly(
          "relative_token_signals",
          [](const PolicyEvictor& e) { return SignalNames(e.relative_token_signals()); })
      .def_property_readonly(
          "absolute_width", &PolicyEvictor::absolute_width,
          "Values per token of the absolute token signals (a view, NAME@layer or NAME@head, "
          "gives one per layer or per KV row).")
      .def_property_readonly("relative_width", &PolicyEvictor::relative_width,
                             "Values per token of the relative token signals.")
      .def(
          "unseen_from", [](const PolicyEvictor& e, SeqId seq) { return e.UnseenFrom(seq, 0); },
          py::arg("seq"), "The first token id seq's observe takes token signals for.")
      .def("signals_wanted", &PolicyEvictor::SignalsWanted, py::arg("seq"),
           "Whether the next observe of seq reads its signals (else pass empty attn, key_norm).")
      .def("victims", [](PolicyEvictor& e, SeqId seq) { return ToArray(Value(e.Victims(seq))); })
      .def("forget", &PolicyEvictor::Forget)
      .def("budget", [](const PolicyEvictor& e, SeqId seq) { return Value(e.Budget(seq)); });
}

void BindCheck(py::module_& m) {
  m.def(
      "run_check",
      [](uint64_t seed, int64_t steps, const std::string& mode, int32_t num_blocks,
         int32_t block_size, int32_t headroom_blocks, const std::string& trigger) {
        CheckOptions o;
        o.seed = seed;
        o.steps = steps;
        o.mode = ModeFrom(mode);
        o.pool = {
            .num_blocks = num_blocks, .block_size = block_size, .headroom_blocks = headroom_blocks};
        o.reclaim.trigger = Value(ParseTrigger(trigger));
        return CheckReportDict(Value(RunCheck(o)));
      },
      py::arg("seed") = 1, py::arg("steps") = 20000, py::arg("mode") = "vtoken",
      py::arg("num_blocks") = 64, py::arg("block_size") = 16, py::arg("headroom_blocks") = 8,
      py::arg("trigger") = "always",
      "lib/core's RunCheck (what `vtoken-cli check` runs, host copies); returns its report.");
  m.def(
      "split_mix64",
      [](uint64_t state) {
        const uint64_t v = SplitMix64(state);
        return py::make_tuple(v, state);
      },
      "One step of the check harness's random source: returns (value, new state).");
}

}  // namespace
}  // namespace vtoken

PYBIND11_MODULE(_core, m) {
  m.doc() = "vtoken core bindings (lib/core); see docs/PYTHON.md";
  vtoken::BindErrors(m);
  vtoken::BindCache(m);
  vtoken::BindPolicies(m);
  vtoken::BindCheck(m);
}
