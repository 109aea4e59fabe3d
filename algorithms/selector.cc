#include "algorithms/selector.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <tuple>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"

namespace chorus::algo {

namespace {

constexpr double kNearTie = 1.03;             // another candidate must be more than 3% faster to win
constexpr size_t kMemoMax = size_t{1} << 16;  // decisions kept; the memo starts over beyond this

constexpr Coll kSpecColls[] = {Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::Broadcast, Coll::Reduce,
                               Coll::AllToAll,  Coll::AllToAllv, Coll::Barrier,       Coll::Gather,    Coll::Scatter};

[[noreturn]] void bad_spec(const std::string& what) {
  throw Error(chorusInvalidArgument, Subsys::Algorithms, "CHORUS_ALGO: " + what);
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    out.push_back(trim(s.substr(start, at == std::string::npos ? std::string::npos : at - start)));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

uint64_t parse_bytes(const std::string& text, const std::string& part) {
  try {
    return static_cast<uint64_t>(parse_size(text, "size"));
  } catch (const Error& e) {
    bad_spec(cat("bad size in '", part, "': ", e.what(), " (sizes are bytes with an optional K, M or G suffix)"));
  }
}

std::string fmt_us(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f us", seconds * 1e6);
  return buf;
}

}  // namespace

const char* coll_spec_name(Coll coll) {
  switch (coll) {
    case Coll::AllReduce: return "allreduce";
    case Coll::AllGather: return "allgather";
    case Coll::ReduceScatter: return "reducescatter";
    case Coll::Broadcast: return "broadcast";
    case Coll::Reduce: return "reduce";
    case Coll::AllToAll: return "alltoall";
    case Coll::AllToAllv: return "alltoallv";
    case Coll::Barrier: return "barrier";
    case Coll::Gather: return "gather";
    case Coll::Scatter: return "scatter";
    default: return "";
  }
}

std::string algorithm_names(Coll coll) {
  std::string out;
  for (const AlgorithmInfo& a : algorithm_table())
    if (a.coll == coll) out += (out.empty() ? "" : ", ") + std::string(a.name);
  return out.empty() ? "(none)" : out;
}

uint64_t selection_bytes(Coll coll, size_t count, size_t elem_size, int nranks) {
  const uint64_t b = static_cast<uint64_t>(count) * elem_size;
  switch (coll) {
    case Coll::AllGather:
    case Coll::ReduceScatter:
    case Coll::AllToAll:
    case Coll::AllToAllv:
    case Coll::Gather:
    case Coll::Scatter: return b * static_cast<uint64_t>(std::max(nranks, 1));
    default: return b;
  }
}

const char* choice_reason_name(ChoiceReason r) {
  switch (r) {
    case ChoiceReason::PerCall: return "per-call";
    case ChoiceReason::Override: return "CHORUS_ALGO";
    case ChoiceReason::Pinned: return "CHORUS_DETERMINISTIC";
    case ChoiceReason::CostModel: return "cost model";
  }
  return "?";
}

const AlgoRule* AlgoOverrides::find(Coll coll, uint64_t bytes) const {
  const auto c = static_cast<size_t>(coll);
  if (c >= rules.size()) return nullptr;
  for (const AlgoRule& r : rules[c])
    if (bytes >= r.lo && bytes < r.hi) return &r;
  return nullptr;
}

bool AlgoOverrides::empty() const {
  return std::all_of(rules.begin(), rules.end(), [](const auto& v) { return v.empty(); });
}

AlgoOverrides parse_algo_overrides(const std::string& spec) {
  AlgoOverrides out;
  for (const std::string& entry : split(spec, ';')) {
    if (entry.empty()) continue;
    const size_t colon = entry.find(':');
    if (colon == std::string::npos)
      bad_spec(cat("'", entry, "' has no ':' (expected collective:[lo-hi:]algorithm[,...], e.g. allreduce:ring)"));
    const std::string cname = lower(trim(entry.substr(0, colon)));
    Coll coll = Coll::Count;
    for (Coll c : kSpecColls)
      if (cname == coll_spec_name(c)) coll = c;
    if (coll == Coll::Count) {
      std::string names;
      for (Coll c : kSpecColls) names += (names.empty() ? "" : ", ") + std::string(coll_spec_name(c));
      bad_spec(cat("unknown collective '", cname, "' in '", entry, "' (known: ", names, ")"));
    }
    const std::string rules = entry.substr(colon + 1);
    for (const std::string& rule : split(rules, ',')) {
      const std::string part = cat(entry.substr(0, colon), ":", rule);  // as written, for errors
      if (rule.empty()) bad_spec(cat("empty rule in '", entry, "'"));
      // "allreduce:ring,allgather:0-1M:bruck": a second collective after a ',' instead of a ';'.
      if (const size_t first = rule.find(':'); first != std::string::npos)
        for (Coll c : kSpecColls)
          if (lower(trim(rule.substr(0, first))) == coll_spec_name(c))
            bad_spec(cat("'", trim(rule), "' in '", entry, "' is a rule for another collective: separate ",
                         "collectives with ';' (e.g. allreduce:ring;allgather:bruck), ranges of one with ','"));
      AlgoRule r;
      r.text = cat(cname, ":", rule);
      const size_t rc = rule.rfind(':');
      // Names match without regard to case, as collectives' do.
      r.algorithm = lower(trim(rc == std::string::npos ? rule : rule.substr(rc + 1)));
      if (rc != std::string::npos) {
        const std::string range = trim(rule.substr(0, rc));
        const size_t dash = range.find('-');
        if (dash == std::string::npos)
          bad_spec(cat("range '", range, "' in '", part, "' has no '-' (expected lo-hi, lo- or -hi)"));
        const std::string lo = trim(range.substr(0, dash)), hi = trim(range.substr(dash + 1));
        if (!lo.empty()) r.lo = parse_bytes(lo, part);
        if (!hi.empty()) r.hi = parse_bytes(hi, part);
        if (r.lo >= r.hi) bad_spec(cat("empty range '", range, "' in '", part, "' (lo must be below hi)"));
      }
      if (r.algorithm.empty()) bad_spec(cat("no algorithm named in '", part, "'"));
      if (find_algorithm(coll, r.algorithm) == nullptr)
        bad_spec(cat("unknown algorithm '", r.algorithm, "' for ", cname, " in '", part,
                     "' (known: ", algorithm_names(coll), ")"));
      out.rules[static_cast<size_t>(coll)].push_back(std::move(r));
    }
  }
  return out;
}

void add_deterministic_rules(AlgoOverrides& overrides) {
  const std::pair<Coll, const char*> pins[] = {
      {Coll::AllReduce, "rhd"}, {Coll::ReduceScatter, "rhd"}, {Coll::Reduce, "ring"}};
  for (const auto& [coll, name] : pins) {
    AlgoRule r;
    r.algorithm = name;
    r.text = cat(coll_spec_name(coll), ":", name);
    r.pinned = true;
    overrides.rules[static_cast<size_t>(coll)].push_back(std::move(r));
  }
}

int pick_candidate(const std::vector<Candidate>& candidates) {
  double best = std::numeric_limits<double>::infinity();
  bool any = false;
  for (const Candidate& c : candidates)
    if (c.applicable) {
      best = std::min(best, c.predicted_s);
      any = true;
    }
  if (!any) return -1;
  for (size_t i = 0; i < candidates.size(); ++i)
    if (candidates[i].applicable && candidates[i].predicted_s <= best * kNearTie) return static_cast<int>(i);
  return -1;
}

size_t decision_count(size_t count) {
  constexpr int kBits = 4;  // significant bits kept: 8 bands per doubling
  const int width = std::bit_width(count);
  if (width <= kBits) return count;
  const size_t unit = size_t{1} << (width - kBits);
  const size_t down = count & ~(unit - 1);
  if (down == count || down > std::numeric_limits<size_t>::max() - unit) return count;  // exact, or no room above
  return down + unit;
}

size_t decision_count_low(size_t d) {
  if (d <= 16) return d;
  if (d & ((size_t{1} << (std::bit_width(d) - 4)) - 1)) return d;  // too large to round up: its own band
  return d - (size_t{1} << (std::bit_width(d - 1) - 4)) + 1;
}

size_t Selector::KeyHash::operator()(const Key& k) const {
  size_t h = std::hash<size_t>()(k.count);
  auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(static_cast<size_t>(k.coll));
  mix(k.elem_size);
  mix(static_cast<size_t>(k.root));
  mix(std::hash<std::string>()(k.algorithm));
  mix(static_cast<size_t>(k.rule + 1));
  return h;
}

Selector::Selector(topo::Topology topology, SimOptions sim, int nchannels, AlgoOverrides overrides)
    : topo_(std::move(topology)), sim_(sim), nchannels_(nchannels), overrides_(std::move(overrides)) {
  if (topo_.nranks() < 1) throw Error(chorusInvalidArgument, Subsys::Algorithms, "selector: topology has no ranks");
  if (nchannels_ < 1)
    throw Error(chorusInvalidArgument, Subsys::Algorithms, cat("selector: nchannels ", nchannels_, " must be >= 1"));
  host_of_rank_ = topo_.host_of_rank();
  // The cheapest hop and per-message overhead among the link classes this communicator has. A pair's class
  // depends only on the hosts and on each rank's (process, NUMA node, GPU or not), so one rank per such signature
  // and host stands for all (two ranks of one signature: the class of that rank with itself).
  std::array<bool, topo::kLinkClasses> present{};
  if (topo_.nhosts() > 1) present[static_cast<size_t>(topo::LinkClass::Network)] = true;
  for (int h = 0; h < topo_.nhosts(); ++h) {
    std::map<std::tuple<int, int, bool>, std::pair<int, int>> reps;  // signature -> (a rank, how many)
    for (int r : topo_.ranks_of_host(h)) {
      const topo::RankPlace& p = topo_.ranks[static_cast<size_t>(r)];
      ++reps.try_emplace({p.process, p.numa, p.gpu >= 0}, r, 0).first->second.second;
    }
    for (auto a = reps.begin(); a != reps.end(); ++a)
      for (auto b = a; b != reps.end(); ++b)
        if (a != b || a->second.second > 1)
          present[static_cast<size_t>(topo_.link(a->second.first, b->second.first))] = true;
  }
  hop_floor_s_ = overhead_floor_s_ = std::numeric_limits<double>::infinity();
  for (size_t c = 0; c < present.size(); ++c) {
    if (!present[c]) continue;
    const topo::LinkParams& lp = topo_.links[c];
    hop_floor_s_ = std::min(hop_floor_s_, lp.alpha_s + 2 * lp.overhead_s);
    overhead_floor_s_ = std::min(overhead_floor_s_, lp.overhead_s);
  }
  if (topo_.nhosts() > 1) {
    size_t smallest = static_cast<size_t>(topo_.nranks());
    for (int h = 0; h < topo_.nhosts(); ++h) smallest = std::min(smallest, topo_.ranks_of_host(h).size());
    direct_floor_s_ = 2.0 * static_cast<double>(static_cast<size_t>(topo_.nranks()) - smallest) *
                      topo_.links[static_cast<size_t>(topo::LinkClass::Network)].overhead_s;
  }
}

std::shared_ptr<const Choice> Selector::choose(Coll coll, size_t count, size_t elem_size, int root,
                                               const char* per_call_algorithm) const {
  Key key{coll, decision_count(count), elem_size, rooted(coll) ? root : 0,
          per_call_algorithm ? per_call_algorithm : ""};
  if (key.algorithm.empty()) {
    // A CHORUS_ALGO range holds the exact size: counts of one band may fall on both sides of its edge.
    if (const AlgoRule* rule = overrides_.find(coll, selection_bytes(coll, count, elem_size, topo_.nranks())))
      key.rule = static_cast<int>(rule - overrides_.rules[static_cast<size_t>(coll)].data());
  }
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
  }
  std::promise<std::shared_ptr<const Choice>> promise;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    if (auto it = deciding_.find(key); it != deciding_.end()) {
      std::shared_future<std::shared_ptr<const Choice>> made = it->second;
      lock.unlock();
      return made.get();  // rethrows what the deciding thread's decide() threw
    }
    deciding_.emplace(key, promise.get_future().share());
  }
  std::shared_ptr<const Choice> made;
  try {
    made = decide(key);
  } catch (...) {
    promise.set_exception(std::current_exception());
    std::unique_lock<std::shared_mutex> lock(mu_);
    deciding_.erase(key);  // not kept: a later call decides again (and fails alike)
    throw;
  }
  promise.set_value(made);
  std::unique_lock<std::shared_mutex> lock(mu_);
  deciding_.erase(key);
  if (memo_.size() >= kMemoMax) memo_.clear();
  return memo_.try_emplace(std::move(key), std::move(made)).first->second;
}

std::vector<Candidate> Selector::unsimulated(Coll coll, int root) const {
  const int n = topo_.nranks();
  if (rooted(coll) && (root < 0 || root >= n))
    throw Error(chorusInvalidArgument, Subsys::Algorithms,
                cat("selector: root ", root, " out of range for ", n, " ranks"));
  std::vector<Candidate> out;
  for (const AlgorithmInfo& a : algorithm_table())
    if (a.coll == coll) out.push_back(Candidate{&a, false, 0, "was not simulated: another algorithm was named"});
  if (out.empty())
    throw Error(chorusInvalidArgument, Subsys::Algorithms, cat("selector: no algorithm for ", coll_name(coll)));
  return out;
}

std::shared_ptr<const Program> Selector::program(const AlgorithmInfo& algorithm, int root) const {
  const std::pair<int, int> key{algorithm.id, root};
  {
    std::lock_guard<std::mutex> lock(held_mu_);
    auto it = held_.find(key);
    if (it != held_.end()) return it->second;
  }
  std::shared_ptr<const Program> prog = get_program(algorithm, {topo_.nranks(), root, nchannels_, host_of_rank_});
  std::lock_guard<std::mutex> lock(held_mu_);
  return held_.try_emplace(key, std::move(prog)).first->second;
}

void Selector::simulate_candidate(Candidate& c, int root, size_t count, size_t elem_size,
                                  std::shared_ptr<const Program>* out) const {
  c.applicable = false;
  try {
    std::shared_ptr<const Program> prog = program(*c.algorithm, root);
    c.predicted_s = simulate(*prog, topo_, count, elem_size, sim_).seconds;
    c.applicable = true;
    c.note.clear();
    if (out) *out = std::move(prog);
  } catch (const std::invalid_argument& e) {
    c.note = cat("does not apply: ", e.what());
  } catch (const Error& e) {
    c.note = cat("could not be simulated: ", e.what());
  }
}

double Selector::floor_seconds(const AlgorithmInfo& algorithm) const {
  if (algorithm.floor == nullptr || !std::isfinite(hop_floor_s_)) return 0;
  const CostFloor f = algorithm.floor(topo_.nranks());
  return std::max({static_cast<double>(f.hops) * hop_floor_s_, static_cast<double>(f.rank_messages) * overhead_floor_s_,
                   f.direct ? direct_floor_s_ : 0.0});
}

std::vector<Candidate> Selector::evaluate(Coll coll, size_t count, size_t elem_size, int root) const {
  if (elem_size == 0) throw Error(chorusInvalidArgument, Subsys::Algorithms, "selector: elem_size is 0");
  std::vector<Candidate> out = unsimulated(coll, root);
  for (Candidate& c : out) simulate_candidate(c, rooted(coll) ? root : 0, count, elem_size, nullptr);
  return out;
}

std::shared_ptr<const Choice> Selector::decide(const Key& key) const {
  const Coll coll = key.coll;
  const int n = topo_.nranks();
  if (key.elem_size == 0) throw Error(chorusInvalidArgument, Subsys::Algorithms, "selector: elem_size is 0");
  auto choice = std::make_shared<Choice>();
  choice->candidates = unsimulated(coll, key.root);
  choice->count = key.count;
  choice->bytes = selection_bytes(coll, key.count, key.elem_size, n);

  std::vector<std::shared_ptr<const Program>> programs(choice->candidates.size());
  std::vector<bool> simulated(choice->candidates.size(), false);
  auto run = [&](size_t i) {
    if (simulated[i]) return;
    simulate_candidate(choice->candidates[i], key.root, key.count, key.elem_size, &programs[i]);
    simulated[i] = true;
  };
  // A named algorithm is generated, not simulated: nothing is compared with it, and a simulation costs what the
  // program's messages cost (minutes for a pairwise all-to-all on 4096 ranks, docs/perf/selector-4096-ranks-*).
  auto generate_named = [&](size_t i) {
    Candidate& c = choice->candidates[i];
    try {
      programs[i] = program(*c.algorithm, key.root);
      c.applicable = true;
      c.predicted_s = std::numeric_limits<double>::quiet_NaN();
      c.note = "was named: generated, not simulated";
    } catch (const std::invalid_argument& e) {
      c.note = cat("does not apply: ", e.what());
    }
  };
  auto index_of = [&](const std::string& name) -> int {
    for (size_t i = 0; i < choice->candidates.size(); ++i)
      if (name == choice->candidates[i].algorithm->name) return static_cast<int>(i);
    return -1;
  };
  auto take = [&](int i, ChoiceReason reason, std::string why) {
    const Candidate& c = choice->candidates[static_cast<size_t>(i)];
    choice->algorithm = c.algorithm;
    choice->program = programs[static_cast<size_t>(i)];
    choice->predicted_s = c.predicted_s;
    choice->reason = reason;
    choice->why = std::move(why);
    CHORUS_INFO(Algorithms, "%s(count %zu-%zu, %zu-byte elements, %llu bytes): %s: %s", coll_name(key.coll),
                decision_count_low(key.count), key.count, key.elem_size, static_cast<unsigned long long>(choice->bytes),
                c.algorithm->name, choice->why.c_str());
    return std::shared_ptr<const Choice>(std::move(choice));
  };

  if (!key.algorithm.empty()) {
    const int i = index_of(key.algorithm);
    if (i < 0)
      throw Error(chorusInvalidArgument, Subsys::Algorithms,
                  cat("unknown algorithm '", key.algorithm, "' for ", coll_name(coll),
                      " (known: ", algorithm_names(coll), ")"));
    generate_named(static_cast<size_t>(i));
    const Candidate& c = choice->candidates[static_cast<size_t>(i)];
    if (!c.applicable)
      throw Error(chorusInvalidArgument, Subsys::Algorithms,
                  cat("algorithm '", key.algorithm, "' for ", coll_name(coll), " on ", n, " ranks ", c.note));
    return take(i, ChoiceReason::PerCall, cat("per-call algorithm ", key.algorithm));
  }

  std::string prefix;
  if (key.rule >= 0) {
    const AlgoRule& rule = overrides_.rules[static_cast<size_t>(coll)][static_cast<size_t>(key.rule)];
    const int i = index_of(rule.algorithm);
    if (i >= 0) generate_named(static_cast<size_t>(i));
    const std::string what = cat(rule.pinned ? "CHORUS_DETERMINISTIC=1 pin '" : "CHORUS_ALGO rule '", rule.text, "'");
    if (i >= 0 && choice->candidates[static_cast<size_t>(i)].applicable)
      return take(i, rule.pinned ? ChoiceReason::Pinned : ChoiceReason::Override, what);
    prefix = cat(what, " ignored: ", rule.algorithm, " ",
                 i >= 0 ? choice->candidates[static_cast<size_t>(i)].note : "is unknown", "; ");
    // The user asked for it: said as a warning, once per process for each distinct reason (every thread-rank and
    // size it applies to would repeat it), where the rest of the decision is INFO.
    static std::mutex warned_mu;
    static std::set<std::string>* warned = new std::set<std::string>();  // never freed: used until exit
    const std::string text = cat(coll_name(coll), " on ", n, " ranks: ", prefix, "the cost model chooses instead");
    std::lock_guard<std::mutex> lock(warned_mu);
    if (warned->insert(text).second) CHORUS_WARN(Algorithms, "%s", text.c_str());
  }

  // Cheapest floors first; a candidate whose floor already exceeds the best prediction by more than the near-tie
  // margin cannot be picked, so it is neither generated nor simulated.
  std::vector<double> floors(choice->candidates.size());
  std::vector<size_t> order(choice->candidates.size());
  for (size_t i = 0; i < order.size(); ++i) {
    floors[i] = floor_seconds(*choice->candidates[i].algorithm);
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return floors[a] < floors[b]; });
  double best_so_far = std::numeric_limits<double>::infinity();
  for (size_t i : order) {
    Candidate& c = choice->candidates[i];
    if (floors[i] > best_so_far * kNearTie) {
      c.note = "was not simulated: its cost floor (CostFloor) is slower than the best prediction";
      continue;
    }
    run(i);
    if (c.applicable) best_so_far = std::min(best_so_far, c.predicted_s);
  }
  const int pick = pick_candidate(choice->candidates);
  if (pick < 0) {
    std::string notes;
    for (const Candidate& c : choice->candidates) notes += cat("; ", c.algorithm->name, " ", c.note);
    throw Error(chorusInternalError, Subsys::Algorithms,
                cat("selector: no algorithm for ", coll_name(coll), " on ", n, " ranks can run", notes));
  }
  int fastest = pick;
  for (size_t i = 0; i < choice->candidates.size(); ++i) {
    const Candidate& c = choice->candidates[i];
    if (c.applicable && c.predicted_s < choice->candidates[static_cast<size_t>(fastest)].predicted_s)
      fastest = static_cast<int>(i);
  }
  const double best = choice->candidates[static_cast<size_t>(fastest)].predicted_s;
  const Candidate& chosen = choice->candidates[static_cast<size_t>(pick)];
  std::string why = prefix + cat("cost model: ", chosen.algorithm->name, " predicted ", fmt_us(chosen.predicted_s));
  if (pick != fastest) {
    why += cat(", within 3% of the fastest (", choice->candidates[static_cast<size_t>(fastest)].algorithm->name, " ",
               fmt_us(best), ") and earlier in the table");
  } else {
    double second = std::numeric_limits<double>::infinity();
    const Candidate* runner = nullptr;
    for (const Candidate& c : choice->candidates)
      if (&c != &chosen && c.applicable && c.predicted_s < second) {
        second = c.predicted_s;
        runner = &c;
      }
    if (runner) why += cat(", next ", runner->algorithm->name, " ", fmt_us(second));
  }
  return take(pick, ChoiceReason::CostModel, std::move(why));
}

}  // namespace chorus::algo
