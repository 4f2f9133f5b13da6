// The renderer: walks the syntax tree with Jinja2's scoping (a fresh scope per loop
// iteration and per macro call; `if` opens none), Python operator semantics, and the
// filters, tests, methods and globals of the subset. Every step and every byte produced is
// charged against kMaxWork, so a hostile template ends with an error, not a hang.
#include <algorithm>
#include <climits>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "jinja.h"

namespace daisy::jinja {
namespace {

using Kind = Value::Kind;
using Frame = std::unordered_map<std::string, Value>;

// Work units of one loop iteration (a scope and the loop object are built each time), so
// that kMaxWork allows about 260000 iterations.
constexpr uint64_t kIterationCost = 256;

std::string TypeName(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return v.dict->is_namespace ? "namespace" : "dict";
    case Kind::kFunc:
      return "function";
  }
  return "?";
}

Value Undefined(std::string hint) {
  Value v;
  v.s = std::move(hint);  // the name, for messages
  return v;
}

double AsDouble(const Value& v) {
  if (v.kind == Kind::kFloat) return v.f;
  if (v.kind == Kind::kInt) return static_cast<double>(v.i);
  return v.b ? 1.0 : 0.0;
}
int64_t AsInt(const Value& v) {
  return v.kind == Kind::kInt ? v.i : (v.b ? 1 : 0);
}
bool IsIntLike(const Value& v) {
  return v.kind == Kind::kInt || v.kind == Kind::kBool;
}

// Python's str.splitlines() boundaries.
std::vector<std::string> SplitLines(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0, p = 0;
  while (p < s.size()) {
    size_t nl = 0;
    unsigned char c = static_cast<unsigned char>(s[p]);
    // NOLINTNEXTLINE(bugprone-branch-clone): one branch per kind of line break, as Python orders them
    if (c == '\r' && p + 1 < s.size() && s[p + 1] == '\n') {
      nl = 2;
    } else if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) {
      nl = 1;
    } else if (c == 0xC2 && p + 1 < s.size() && static_cast<unsigned char>(s[p + 1]) == 0x85) {
      nl = 2;
    } else if (c == 0xE2 && p + 2 < s.size() && static_cast<unsigned char>(s[p + 1]) == 0x80 &&
               (static_cast<unsigned char>(s[p + 2]) == 0xA8 || static_cast<unsigned char>(s[p + 2]) == 0xA9)) {
      nl = 3;
    }
    if (nl) {
      out.emplace_back(s.substr(start, p - start));
      p += nl;
      start = p;
    } else {
      ++p;
    }
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  if (old.empty()) {
    auto cps = CodePoints(s);
    int64_t done = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (k < cps.size()) out += s.substr(cps[k].first, cps[k].second);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out += s.substr(pos, hit - pos);
    out += repl;
    pos = hit + old.size();
    ++done;
  }
  out += s.substr(pos);
  return out;
}

// Python slice indices for a sequence of length n.
struct SliceRange {
  std::vector<size_t> idx;
};

class Renderer {
 public:
  explicit Renderer(const Value& context) {
    frames_.emplace_back();
    if (context.kind == Kind::kDict) {
      for (const auto& [k, v] : context.dict->items) frames_[0][k] = v;
    }
  }

  Result<std::string> Run(const Program& program) {
    std::string out;
    out_ = &out;
    Flow flow = Flow::kNormal;
    DAISY_RETURN_IF_ERROR(Exec(program.body, &flow));
    return out;
  }

 private:
  enum class Flow : uint8_t { kNormal, kBreak, kContinue };

  static Status Err(int line, const std::string& what) {
    return InvalidArgument("chat template error at line " + std::to_string(line) + ": " + what);
  }
  static Status Refuse(int line, const std::string& what) {
    return Unimplemented("unsupported Jinja construct: " + what + " at line " + std::to_string(line));
  }
  static Status UndefinedErr(int line, const Value& v, const std::string& where) {
    std::string name = v.s.empty() ? "a value" : "'" + v.s + "'";
    return Err(line, name + " is undefined (" + where + ")");
  }

  Status Charge(uint64_t n, int line) {
    work_ += n + 1;
    if (work_ > kMaxWork) return Err(line, "the template exceeds its work limit (a runaway loop or value)");
    return Status::Ok();
  }

  Status Emit(std::string_view s, int line) {
    DAISY_RETURN_IF_ERROR(Charge(s.size(), line));
    if (out_->size() + s.size() > kMaxOutput) {
      return Err(line, "the rendered text exceeds " + std::to_string(kMaxOutput >> 20) + " MiB");
    }
    out_->append(s);
    return Status::Ok();
  }

  Status CheckDepth(const Value& v, int line) const {
    if (v.Depth() > kMaxValueDepth) {
      return Err(line, "a value nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
    }
    return Status::Ok();
  }

  Value Lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    static const std::pair<const char*, Func::Builtin> kBuiltins[] = {
        {"range", Func::Builtin::kRange},
        {"namespace", Func::Builtin::kNamespace},
        {"raise_exception", Func::Builtin::kRaiseException},
        {"strftime_now", Func::Builtin::kStrftimeNow},
        {"dict", Func::Builtin::kDict}};
    for (const auto& [n, b] : kBuiltins) {
      if (name == n) {
        Value v = Value::Of(Kind::kFunc);
        auto f = std::make_shared<Func>();
        f->builtin = b;
        f->name = n;
        v.func = std::move(f);
        return v;
      }
    }
    return Undefined(name);
  }

  // ---- Statements ----

  Status Exec(const Body& body, Flow* flow) {
    for (const auto& s : body) {
      DAISY_RETURN_IF_ERROR(ExecStmt(*s, flow));
      if (*flow != Flow::kNormal) return Status::Ok();
    }
    return Status::Ok();
  }

  Status ExecStmt(const Stmt& s, Flow* flow) {
    DAISY_RETURN_IF_ERROR(Charge(0, s.line));
    switch (s.kind) {
      case Stmt::Kind::kText:
        return Emit(s.text, s.line);
      case Stmt::Kind::kOutput: {
        DAISY_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        if (v.kind == Kind::kString) return Emit(v.s, s.line);
        if (v.IsUndefined()) return Status::Ok();
        return Emit(ToStr(v), s.line);
      }
      case Stmt::Kind::kIf:
        for (size_t k = 0; k < s.conds.size(); ++k) {
          DAISY_ASSIGN_OR_RETURN(Value c, Eval(*s.conds[k]));
          if (Truthy(c)) return Exec(s.bodies[k], flow);
        }
        if (s.bodies.size() > s.conds.size()) return Exec(s.bodies.back(), flow);
        return Status::Ok();
      case Stmt::Kind::kFor:
        return ExecFor(s, flow);
      case Stmt::Kind::kSet: {
        DAISY_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        return Assign(s, std::move(v));
      }
      case Stmt::Kind::kSetBlock: {
        std::string buf;
        std::string* saved = out_;
        out_ = &buf;
        Flow inner = Flow::kNormal;
        Status st = Exec(s.bodies[0], &inner);
        out_ = saved;
        DAISY_RETURN_IF_ERROR(st);
        frames_.back()[s.targets[0]] = Value::Str(std::move(buf));
        return Status::Ok();
      }
      case Stmt::Kind::kMacro: {
        Value v = Value::Of(Kind::kFunc);
        auto f = std::make_shared<Func>();
        f->macro = &s;
        f->name = s.text;
        v.func = std::move(f);
        frames_.back()[s.text] = std::move(v);
        return Status::Ok();
      }
      case Stmt::Kind::kBreak:
        *flow = Flow::kBreak;
        return Status::Ok();
      case Stmt::Kind::kContinue:
        *flow = Flow::kContinue;
        return Status::Ok();
    }
    return Status::Ok();
  }

  Status Assign(const Stmt& s, Value v) {
    if (s.attr_target) {
      Value target = Lookup(s.targets[0]);
      if (target.kind != Kind::kDict || !target.dict->is_namespace) {
        return Err(s.line, "cannot assign attribute '" + s.targets[1] + "' of " + TypeName(target) + " '" +
                               s.targets[0] + "': only a namespace() takes attribute assignment");
      }
      if (v.HasNamespace()) return Refuse(s.line, "a namespace stored inside a namespace");
      target.dict->Set(s.targets[1], std::move(v));
      return CheckDepth(target, s.line);
    }
    if (s.targets.size() == 1) {
      frames_.back()[s.targets[0]] = std::move(v);
      return Status::Ok();
    }
    DAISY_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, s.line));
    if (items.size() != s.targets.size()) {
      return Err(s.line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                             std::to_string(s.targets.size()) + " names");
    }
    for (size_t k = 0; k < items.size(); ++k) frames_.back()[s.targets[k]] = std::move(items[k]);
    return Status::Ok();
  }

  // What `for` walks: list items, dict keys, string characters; undefined is empty.
  Result<std::vector<Value>> Iterate(const Value& v, int line) {
    std::vector<Value> out;
    switch (v.kind) {
      case Kind::kUndefined:
        return out;
      case Kind::kList:
        DAISY_RETURN_IF_ERROR(Charge(v.list->items.size(), line));
        return v.list->items;
      case Kind::kDict:
        DAISY_RETURN_IF_ERROR(Charge(v.dict->items.size(), line));
        for (const auto& kv : v.dict->items) out.push_back(Value::Str(kv.first));
        return out;
      case Kind::kString:
        DAISY_RETURN_IF_ERROR(Charge(v.s.size(), line));
        for (const auto& [p, l] : CodePoints(v.s)) out.push_back(Value::Str(v.s.substr(p, l)));
        return out;
      default:
        return Err(line, "'" + TypeName(v) + "' object is not iterable");
    }
  }

  Status Bind(Frame& frame, const std::vector<std::string>& targets, const Value& item, int line) {
    if (targets.size() == 1) {
      frame[targets[0]] = item;
      return Status::Ok();
    }
    DAISY_ASSIGN_OR_RETURN(std::vector<Value> parts, Iterate(item, line));
    if (parts.size() != targets.size()) {
      return Err(line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                           std::to_string(targets.size()) + " loop variables");
    }
    for (size_t k = 0; k < parts.size(); ++k) frame[targets[k]] = std::move(parts[k]);
    return Status::Ok();
  }

  Status ExecFor(const Stmt& s, Flow* flow) {
    DAISY_ASSIGN_OR_RETURN(Value seq, Eval(*s.expr));
    DAISY_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(seq, s.line));
    if (s.cond) {  // the loop filter runs first: loop.length counts what passes
      std::vector<Value> kept;
      for (Value& item : items) {
        frames_.emplace_back();
        Status st = Bind(frames_.back(), s.targets, item, s.line);
        Result<Value> c = st.ok() ? Eval(*s.cond) : Result<Value>(st);
        frames_.pop_back();
        if (!c.ok()) return c.status();
        if (Truthy(*c)) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    // One loop object per loop, updated in place (as Jinja2's LoopContext), and one scope
    // emptied at each iteration.
    Value loop = Value::MakeDict({{"index", Value::Int(0)},
                                  {"index0", Value::Int(0)},
                                  {"revindex", Value::Int(0)},
                                  {"revindex0", Value::Int(0)},
                                  {"first", Value::Bool(false)},
                                  {"last", Value::Bool(false)},
                                  {"length", Value::Int(n)},
                                  {"previtem", Undefined("loop.previtem")},
                                  {"nextitem", Undefined("loop.nextitem")}});
    auto& fields = loop.dict->items;
    for (const Value& item : items) loop.dict->depth = std::max(loop.dict->depth, item.Depth() + 1);
    frames_.emplace_back();
    Status st;
    for (int64_t k = 0; k < n && st.ok(); ++k) {
      st = Charge(kIterationCost, s.line);
      if (!st.ok()) break;
      frames_.back().clear();
      st = Bind(frames_.back(), s.targets, items[static_cast<size_t>(k)], s.line);
      if (!st.ok()) break;
      fields[0].second.i = k + 1;
      fields[1].second.i = k;
      fields[2].second.i = n - k;
      fields[3].second.i = n - k - 1;
      fields[4].second.b = k == 0;
      fields[5].second.b = k == n - 1;
      fields[7].second = k > 0 ? items[static_cast<size_t>(k - 1)] : Undefined("loop.previtem");
      fields[8].second = k + 1 < n ? items[static_cast<size_t>(k + 1)] : Undefined("loop.nextitem");
      frames_.back()["loop"] = loop;
      Flow inner = Flow::kNormal;
      st = Exec(s.bodies[0], &inner);
      if (inner == Flow::kBreak) break;
    }
    frames_.pop_back();
    DAISY_RETURN_IF_ERROR(st);
    if (n == 0 && s.bodies.size() > 1) return Exec(s.bodies[1], flow);
    return Status::Ok();
  }

  // ---- Expressions ----

  Result<Value> Eval(const Expr& e) {
    DAISY_RETURN_IF_ERROR(Charge(0, e.line));
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList: {
        std::vector<Value> items;
        for (const auto& k : e.kids) {
          DAISY_ASSIGN_OR_RETURN(Value v, Eval(*k));
          items.push_back(std::move(v));
        }
        Value v = Value::MakeList(std::move(items));
        DAISY_RETURN_IF_ERROR(CheckDepth(v, e.line));
        return v;
      }
      case Expr::Kind::kDict: {
        std::vector<std::pair<std::string, Value>> items;
        for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          DAISY_ASSIGN_OR_RETURN(Value key, Eval(*e.kids[k]));
          if (key.kind != Kind::kString) return Refuse(e.line, "dict key of type " + TypeName(key));
          DAISY_ASSIGN_OR_RETURN(Value v, Eval(*e.kids[k + 1]));
          items.emplace_back(std::move(key.s), std::move(v));
        }
        Value v = Value::MakeDict(std::move(items));
        DAISY_RETURN_IF_ERROR(CheckDepth(v, e.line));
        return v;
      }
      case Expr::Kind::kAttr: {
        DAISY_ASSIGN_OR_RETURN(Value obj, Eval(*e.kids[0]));
        return GetAttr(obj, e.name, e.kids[0].get());
      }
      case Expr::Kind::kIndex: {
        DAISY_ASSIGN_OR_RETURN(Value obj, Eval(*e.kids[0]));
        DAISY_ASSIGN_OR_RETURN(Value key, Eval(*e.kids[1]));
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice:
        return EvalSlice(e);
      case Expr::Kind::kCall:
        return EvalCall(e);
      case Expr::Kind::kFilter: {
        DAISY_ASSIGN_OR_RETURN(Value v, Eval(*e.kids[0]));
        DAISY_ASSIGN_OR_RETURN(std::vector<Value> args, EvalArgs(e.args));
        DAISY_ASSIGN_OR_RETURN(auto kwargs, EvalKwargs(e.kwargs));
        return ApplyFilter(e.name, std::move(v), args, kwargs, e.line);
      }
      case Expr::Kind::kTest: {
        DAISY_ASSIGN_OR_RETURN(Value v, Eval(*e.kids[0]));
        DAISY_ASSIGN_OR_RETURN(std::vector<Value> args, EvalArgs(e.args));
        DAISY_ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, v, args, e.line));
        return Value::Bool(r != e.negated);
      }
      case Expr::Kind::kUnary: {
        DAISY_ASSIGN_OR_RETURN(Value v, Eval(*e.kids[0]));
        if (e.name == "not") return Value::Bool(!Truthy(v));
        if (v.IsUndefined()) return UndefinedErr(e.line, v, "unary " + e.name);
        if (!v.IsNumber()) return Err(e.line, "bad operand type for unary " + e.name + ": '" + TypeName(v) + "'");
        if (e.name == "+") return v.kind == Kind::kBool ? Value::Int(AsInt(v)) : v;
        if (v.kind == Kind::kFloat) return Value::Float(-v.f);
        if (AsInt(v) == INT64_MIN) return Err(e.line, "integer overflow");
        return Value::Int(-AsInt(v));
      }
      case Expr::Kind::kBinary: {
        if (e.name == "and" || e.name == "or") {
          DAISY_ASSIGN_OR_RETURN(Value l, Eval(*e.kids[0]));
          if (Truthy(l) == (e.name == "or")) return l;
          return Eval(*e.kids[1]);
        }
        DAISY_ASSIGN_OR_RETURN(Value l, Eval(*e.kids[0]));
        DAISY_ASSIGN_OR_RETURN(Value r, Eval(*e.kids[1]));
        return Arith(e.name, l, r, e.line);
      }
      case Expr::Kind::kCompare: {
        DAISY_ASSIGN_OR_RETURN(Value left, Eval(*e.kids[0]));
        for (size_t k = 0; k < e.ops.size(); ++k) {
          DAISY_ASSIGN_OR_RETURN(Value right, Eval(*e.kids[k + 1]));
          DAISY_ASSIGN_OR_RETURN(bool r, Compare(e.ops[k], left, right, e.line));
          if (!r) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kTernary: {
        DAISY_ASSIGN_OR_RETURN(Value c, Eval(*e.kids[1]));
        if (Truthy(c)) return Eval(*e.kids[0]);
        if (e.kids[2]) return Eval(*e.kids[2]);
        return Undefined("");
      }
    }
    return Err(e.line, "Bug: unknown expression kind");
  }

  Result<std::vector<Value>> EvalArgs(const std::vector<ExprPtr>& args) {
    std::vector<Value> out;
    for (const auto& a : args) {
      DAISY_ASSIGN_OR_RETURN(Value v, Eval(*a));
      out.push_back(std::move(v));
    }
    return out;
  }
  Result<std::vector<std::pair<std::string, Value>>> EvalKwargs(
      const std::vector<std::pair<std::string, ExprPtr>>& kwargs) {
    std::vector<std::pair<std::string, Value>> out;
    for (const auto& [k, a] : kwargs) {
      DAISY_ASSIGN_OR_RETURN(Value v, Eval(*a));
      out.emplace_back(k, std::move(v));
    }
    return out;
  }

  static std::string Hint(const Expr* e, const std::string& tail) {
    if (e && e->kind == Expr::Kind::kName) return e->name + tail;
    return tail.empty() ? "" : tail.substr(tail.front() == '.' ? 1 : 0);
  }

  Value GetAttr(const Value& obj, const std::string& name, const Expr* obj_expr) const {
    if (obj.kind == Kind::kDict) {
      if (const Value* v = obj.dict->Find(name)) return *v;
    }
    std::string hint = obj.IsUndefined() && !obj.s.empty() ? obj.s + "." + name : Hint(obj_expr, "." + name);
    return Undefined(hint);
  }

  Result<Value> GetItem(const Value& obj, const Value& key) const {
    if (obj.kind == Kind::kDict) {
      if (key.kind == Kind::kString) {
        if (const Value* v = obj.dict->Find(key.s)) return *v;
      }
      return Undefined(obj.IsUndefined() ? "" : key.kind == Kind::kString ? key.s : "");
    }
    if ((obj.kind == Kind::kList || obj.kind == Kind::kString) && IsIntLike(key)) {
      int64_t i = AsInt(key);
      if (obj.kind == Kind::kList) {
        const int64_t n = static_cast<int64_t>(obj.list->items.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Undefined("");
        return obj.list->items[static_cast<size_t>(i)];
      }
      auto cps = CodePoints(obj.s);
      const int64_t n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Undefined("");
      return Value::Str(obj.s.substr(cps[static_cast<size_t>(i)].first, cps[static_cast<size_t>(i)].second));
    }
    if (obj.kind == Kind::kString && key.kind == Kind::kString) {
      return Undefined("");  // a method name used as a subscript
    }
    return Undefined(obj.IsUndefined() ? obj.s : "");
  }

  Result<Value> EvalSlice(const Expr& e) {
    DAISY_ASSIGN_OR_RETURN(Value obj, Eval(*e.kids[0]));
    std::optional<int64_t> parts[3];
    for (int k = 0; k < 3; ++k) {
      if (!e.kids[static_cast<size_t>(k) + 1]) continue;
      DAISY_ASSIGN_OR_RETURN(Value v, Eval(*e.kids[static_cast<size_t>(k) + 1]));
      if (v.kind == Kind::kNone) continue;
      if (!IsIntLike(v)) return Err(e.line, "slice indices must be integers, not " + TypeName(v));
      parts[k] = AsInt(v);
    }
    if (obj.IsUndefined()) return UndefinedErr(e.line, obj, "sliced");
    if (obj.kind != Kind::kList && obj.kind != Kind::kString) {
      return Err(e.line, "'" + TypeName(obj) + "' object cannot be sliced");
    }
    std::vector<std::pair<size_t, size_t>> cps;
    if (obj.kind == Kind::kString) cps = CodePoints(obj.s);
    const int64_t n =
        obj.kind == Kind::kList ? static_cast<int64_t>(obj.list->items.size()) : static_cast<int64_t>(cps.size());
    const int64_t step = parts[2].value_or(1);
    if (step == 0) return Err(e.line, "slice step cannot be zero");
    if (step == INT64_MIN) return Err(e.line, "slice step out of range");
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v;
      if (x < 0)
        x = x < -n ? (step < 0 ? -1 : 0) : x + n;
      else if (x >= n)
        x = step < 0 ? n - 1 : n;
      return x;
    };
    const int64_t start = clamp(parts[0], step < 0 ? n - 1 : 0);
    const int64_t stop = clamp(parts[1], step < 0 ? -1 : n);
    std::vector<int64_t> idx;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      idx.push_back(i);
      if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
    }
    DAISY_RETURN_IF_ERROR(Charge(idx.size(), e.line));
    if (obj.kind == Kind::kList) {
      std::vector<Value> items;
      items.reserve(idx.size());
      for (int64_t i : idx) items.push_back(obj.list->items[static_cast<size_t>(i)]);
      return Value::MakeList(std::move(items));
    }
    std::string s;
    for (int64_t i : idx)
      s += std::string_view(obj.s).substr(cps[static_cast<size_t>(i)].first, cps[static_cast<size_t>(i)].second);
    return Value::Str(std::move(s));
  }

  // ---- Operators ----

  Result<Value> Arith(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "~") {
      std::string s = ToStr(a) + ToStr(b);
      DAISY_RETURN_IF_ERROR(Charge(s.size(), line));
      return Value::Str(std::move(s));
    }
    if (a.IsUndefined()) return UndefinedErr(line, a, "operand of '" + op + "'");
    if (b.IsUndefined()) return UndefinedErr(line, b, "operand of '" + op + "'");
    auto type_error = [&] {
      return Err(line, "unsupported operand types for " + op + ": '" + TypeName(a) + "' and '" + TypeName(b) + "'");
    };
    if (a.IsNumber() && b.IsNumber()) {
      const bool is_float = a.kind == Kind::kFloat || b.kind == Kind::kFloat;
      if (op == "/") {
        if (AsDouble(b) == 0) return Err(line, "division by zero");
        return Value::Float(AsDouble(a) / AsDouble(b));
      }
      if (is_float) {
        const double x = AsDouble(a), y = AsDouble(b);
        if (op == "+") return Value::Float(x + y);
        if (op == "-") return Value::Float(x - y);
        if (op == "*") return Value::Float(x * y);
        if (op == "**") return Value::Float(std::pow(x, y));
        if (y == 0) return Err(line, "float division by zero");
        if (op == "//") return Value::Float(std::floor(x / y));
        if (op == "%") {
          double m = std::fmod(x, y);
          if (m != 0 && ((m < 0) != (y < 0))) m += y;
          return Value::Float(m);
        }
        return type_error();
      }
      const int64_t x = AsInt(a), y = AsInt(b);
      int64_t r = 0;
      if (op == "+") {
        if (__builtin_add_overflow(x, y, &r)) return Err(line, "integer overflow");
        return Value::Int(r);
      }
      if (op == "-") {
        if (__builtin_sub_overflow(x, y, &r)) return Err(line, "integer overflow");
        return Value::Int(r);
      }
      if (op == "*") {
        if (__builtin_mul_overflow(x, y, &r)) return Err(line, "integer overflow");
        return Value::Int(r);
      }
      if (op == "**") {
        if (y < 0) return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
        r = 1;
        for (int64_t k = 0; k < y; ++k) {
          if (__builtin_mul_overflow(r, x, &r)) return Err(line, "integer overflow");
          if (r == 0 || r == 1) break;
          if (r == -1) {
            r = ((y - k - 1) % 2 == 0) ? -1 : 1;
            break;
          }
        }
        return Value::Int(r);
      }
      if (y == 0) return Err(line, "integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) return Err(line, "integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      if (op == "//") return Value::Int(q);
      if (op == "%") return Value::Int(m);
      return type_error();
    }
    if (op == "+") {
      if (a.kind == Kind::kString && b.kind == Kind::kString) {
        DAISY_RETURN_IF_ERROR(Charge(a.s.size() + b.s.size(), line));
        return Value::Str(a.s + b.s);
      }
      if (a.kind == Kind::kList && b.kind == Kind::kList) {
        DAISY_RETURN_IF_ERROR(Charge(a.list->items.size() + b.list->items.size(), line));
        std::vector<Value> items = a.list->items;
        items.insert(items.end(), b.list->items.begin(), b.list->items.end());
        return Value::MakeList(std::move(items));
      }
      return type_error();
    }
    if (op == "*" && (IsIntLike(a) || IsIntLike(b))) {
      const Value& seq = IsIntLike(a) ? b : a;
      const int64_t times = std::max<int64_t>(0, AsInt(IsIntLike(a) ? a : b));
      if (seq.kind == Kind::kString) {
        const uint64_t size = seq.s.size() * static_cast<uint64_t>(std::min<int64_t>(times, int64_t{1} << 40));
        DAISY_RETURN_IF_ERROR(Charge(size, line));
        std::string s;
        for (int64_t k = 0; k < times; ++k) s += seq.s;
        return Value::Str(std::move(s));
      }
      if (seq.kind == Kind::kList) {
        const uint64_t size =
            seq.list->items.size() * static_cast<uint64_t>(std::min<int64_t>(times, int64_t{1} << 40));
        DAISY_RETURN_IF_ERROR(Charge(size, line));
        std::vector<Value> items;
        for (int64_t k = 0; k < times; ++k) items.insert(items.end(), seq.list->items.begin(), seq.list->items.end());
        return Value::MakeList(std::move(items));
      }
    }
    if (op == "%" && a.kind == Kind::kString) return Refuse(line, "printf-style string formatting ('%')");
    return type_error();
  }

  Result<bool> Contains(const Value& container, const Value& item, int line) {
    switch (container.kind) {
      case Kind::kUndefined:
        return false;
      case Kind::kString:
        if (item.kind != Kind::kString) {
          return Err(line, "'in <string>' requires string as left operand, not " + TypeName(item));
        }
        return container.s.find(item.s) != std::string::npos;
      case Kind::kList:
        DAISY_RETURN_IF_ERROR(Charge(container.list->items.size(), line));
        for (const Value& x : container.list->items) {
          if (Equal(x, item)) return true;
        }
        return false;
      case Kind::kDict:
        if (item.kind != Kind::kString) return false;
        return container.dict->Find(item.s) != nullptr;
      default:
        return Err(line, "argument of type '" + TypeName(container) + "' is not iterable");
    }
  }

  Result<bool> Less(const Value& a, const Value& b, const std::string& op, int line) {
    if (a.IsNumber() && b.IsNumber()) {
      if (a.kind == Kind::kFloat || b.kind == Kind::kFloat) return AsDouble(a) < AsDouble(b);
      return AsInt(a) < AsInt(b);
    }
    if (a.kind == Kind::kString && b.kind == Kind::kString) return a.s < b.s;
    if (a.IsUndefined()) return UndefinedErr(line, a, "operand of '" + op + "'");
    if (b.IsUndefined()) return UndefinedErr(line, b, "operand of '" + op + "'");
    return Err(line, "'" + op + "' not supported between instances of '" + TypeName(a) + "' and '" + TypeName(b) + "'");
  }

  Result<bool> Compare(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "==") return Equal(a, b);
    if (op == "!=") return !Equal(a, b);
    if (op == "in") return Contains(b, a, line);
    if (op == "not in") {
      DAISY_ASSIGN_OR_RETURN(bool r, Contains(b, a, line));
      return !r;
    }
    if (op == "<") return Less(a, b, op, line);
    if (op == ">") return Less(b, a, op, line);
    if (op == "<=") {
      DAISY_ASSIGN_OR_RETURN(bool r, Less(b, a, op, line));
      return !r;
    }
    if (op == ">=") {
      DAISY_ASSIGN_OR_RETURN(bool r, Less(a, b, op, line));
      return !r;
    }
    return Err(line, "Bug: unknown comparison " + op);
  }

  // ---- Calls ----

  struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    // Positional k, else keyword `name`; nullptr when absent.
    const Value* Get(size_t k, std::string_view name) const {
      if (k < pos.size()) return &pos[k];
      for (const auto& [n, v] : kw) {
        if (n == name) return &v;
      }
      return nullptr;
    }
  };

  Result<Value> EvalCall(const Expr& e) {
    Args args;
    DAISY_ASSIGN_OR_RETURN(args.pos, EvalArgs(e.args));
    DAISY_ASSIGN_OR_RETURN(args.kw, EvalKwargs(e.kwargs));
    const Expr& callee = *e.kids[0];
    if (callee.kind == Expr::Kind::kAttr) {
      DAISY_ASSIGN_OR_RETURN(Value obj, Eval(*callee.kids[0]));
      if (obj.kind == Kind::kDict) {
        const Value* member = obj.dict->Find(callee.name);
        if (member && member->kind == Kind::kFunc) return CallFunc(*member, args, e.line);
      }
      return CallMethod(obj, callee.name, args, e.line);
    }
    DAISY_ASSIGN_OR_RETURN(Value f, Eval(callee));
    if (f.kind != Kind::kFunc) {
      if (f.IsUndefined()) {
        return Err(e.line, "'" + (f.s.empty() ? std::string("value") : f.s) + "' is undefined and cannot be called");
      }
      return Err(e.line, "'" + TypeName(f) + "' object is not callable");
    }
    return CallFunc(f, args, e.line);
  }

  Result<int64_t> IntArg(const Value* v, int64_t dflt, const std::string& what, int line) {
    if (!v || v->kind == Kind::kNone) return dflt;
    if (!IsIntLike(*v)) return Err(line, what + " must be an integer, not " + TypeName(*v));
    return AsInt(*v);
  }
  Result<std::string> StrArg(const Value* v, const std::string& what, int line) {
    if (!v) return Err(line, what + " is missing");
    if (v->kind != Kind::kString) return Err(line, what + " must be a string, not " + TypeName(*v));
    return v->s;
  }

  Result<Value> CallFunc(const Value& f, const Args& args, int line) {
    switch (f.func->builtin) {
      case Func::Builtin::kRange: {
        if (args.pos.empty() || args.pos.size() > 3 || !args.kw.empty()) {
          return Err(line, "range() takes 1 to 3 positional arguments");
        }
        int64_t start = 0, stop = 0, step = 1;
        for (const Value& v : args.pos) {
          if (!IsIntLike(v)) return Err(line, "range() arguments must be integers, not " + TypeName(v));
        }
        if (args.pos.size() == 1) {
          stop = AsInt(args.pos[0]);
        } else {
          start = AsInt(args.pos[0]);
          stop = AsInt(args.pos[1]);
          if (args.pos.size() == 3) step = AsInt(args.pos[2]);
        }
        if (step == 0) return Err(line, "range() step must not be zero");
        // As Jinja2's sandbox: at most 100000 items.
        const double count =
            std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step));
        if (count > 100000) return Err(line, "range() is too large (more than 100000 items)");
        std::vector<Value> items;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.push_back(Value::Int(i));
        DAISY_RETURN_IF_ERROR(Charge(items.size(), line));
        return Value::MakeList(std::move(items));
      }
      case Func::Builtin::kNamespace:
      case Func::Builtin::kDict: {
        const bool ns = f.func->builtin == Func::Builtin::kNamespace;
        std::vector<std::pair<std::string, Value>> items;
        if (args.pos.size() > 1) return Err(line, f.func->name + "() takes at most one positional argument");
        if (args.pos.size() == 1) {
          if (args.pos[0].kind != Kind::kDict) return Err(line, f.func->name + "() expects a mapping");
          items = args.pos[0].dict->items;
        }
        for (const auto& kv : args.kw) items.push_back(kv);
        Value v = Value::MakeDict(std::move(items));
        if (ns) {
          if (v.HasNamespace()) return Refuse(line, "a namespace stored inside a namespace");
          v.dict->is_namespace = true;
        }
        return v;
      }
      case Func::Builtin::kRaiseException: {
        std::string msg = args.pos.empty() ? std::string("raise_exception() called") : ToStr(args.pos[0]);
        return InvalidArgument(std::move(msg));
      }
      case Func::Builtin::kStrftimeNow: {
        DAISY_ASSIGN_OR_RETURN(std::string fmt, StrArg(args.Get(0, "format"), "strftime_now() format", line));
        if (fmt.size() > 256) return Err(line, "strftime_now() format is too long");
        std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        char buf[1024];
        size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
        return Value::Str(std::string(buf, n));
      }
      case Func::Builtin::kNone:
        return CallMacro(*f.func->macro, args, line);
    }
    return Err(line, "Bug: unknown builtin");
  }

  Result<Value> CallMacro(const Stmt& m, const Args& args, int line) {
    if (macro_depth_ >= kMaxMacroDepth) {
      return Err(line, "macro calls nest deeper than " + std::to_string(kMaxMacroDepth));
    }
    if (args.pos.size() > m.params.size()) {
      return Err(line, "macro '" + m.text + "' takes " + std::to_string(m.params.size()) + " arguments, " +
                           std::to_string(args.pos.size()) + " given");
    }
    Frame frame;
    for (const auto& kv : args.kw) {
      const auto& k = kv.first;  // a named copy: clang 14 cannot capture structured bindings
      bool known = std::any_of(m.params.begin(), m.params.end(), [&](const auto& p) { return p.first == k; });
      if (!known) return Err(line, "macro '" + m.text + "' has no parameter '" + k + "'");
    }
    // Defaults are evaluated in the caller's scope, before the macro's own begins.
    for (size_t k = 0; k < m.params.size(); ++k) {
      const Value* given = args.Get(k, m.params[k].first);
      if (given) {
        frame[m.params[k].first] = *given;
      } else if (m.params[k].second) {
        DAISY_ASSIGN_OR_RETURN(Value d, Eval(*m.params[k].second));
        frame[m.params[k].first] = std::move(d);
      } else {
        frame[m.params[k].first] = Undefined(m.params[k].first);
      }
    }
    // The body sees the template's globals and its arguments, not the caller's locals.
    std::vector<Frame> saved;
    saved.swap(frames_);
    frames_.push_back(std::move(saved[0]));
    frames_.push_back(std::move(frame));
    std::string buf;
    std::string* saved_out = out_;
    out_ = &buf;
    ++macro_depth_;
    Flow flow = Flow::kNormal;
    Status st = Exec(m.bodies[0], &flow);
    --macro_depth_;
    out_ = saved_out;
    saved[0] = std::move(frames_[0]);
    frames_.swap(saved);
    DAISY_RETURN_IF_ERROR(st);
    return Value::Str(std::move(buf));
  }

  Result<Value> CallMethod(const Value& obj, const std::string& name, const Args& a, int line) {
    if (obj.kind == Kind::kString) {
      const std::string& s = obj.s;
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Value* chars = a.Get(0, "chars");
        if (chars && chars->kind != Kind::kNone && chars->kind != Kind::kString) {
          return Err(line, name + "() argument must be a string or None");
        }
        const std::string* cs = chars && chars->kind == Kind::kString ? &chars->s : nullptr;
        return Value::Str(PyStrip(s, cs, name != "rstrip", name != "lstrip"));
      }
      if (name == "upper") return Value::Str(PyUpper(s));
      if (name == "lower") return Value::Str(PyLower(s));
      if (name == "title") return Value::Str(PyTitle(s));
      if (name == "capitalize") return Value::Str(PyCapitalize(s));
      if (name == "startswith" || name == "endswith") {
        const Value* p = a.Get(0, "prefix");
        if (!p) return Err(line, name + "() takes at least 1 argument");
        auto test = [&](const std::string& x) { return name == "startswith" ? s.starts_with(x) : s.ends_with(x); };
        if (p->kind == Kind::kString) return Value::Bool(test(p->s));
        if (p->kind == Kind::kList) {
          for (const Value& x : p->list->items) {
            if (x.kind != Kind::kString) return Err(line, name + "() tuple items must be strings");
            if (test(x.s)) return Value::Bool(true);
          }
          return Value::Bool(false);
        }
        return Err(line, name + "() argument must be a string or a tuple of strings");
      }
      if (name == "split") {
        const Value* sep = a.Get(0, "sep");
        DAISY_ASSIGN_OR_RETURN(int64_t maxsplit, IntArg(a.Get(1, "maxsplit"), -1, "maxsplit", line));
        std::vector<Value> parts;
        if (!sep || sep->kind == Kind::kNone) {
          // Runs of whitespace separate; no empty strings at either end.
          size_t pos = 0, len = 0;
          while (true) {
            while (pos < s.size() && IsPySpace(s, pos, &len)) pos += len;
            if (pos >= s.size()) break;
            if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
              std::string rest = PyStrip(std::string_view(s).substr(pos), nullptr, false, true);
              parts.push_back(Value::Str(std::move(rest)));
              break;
            }
            size_t end = pos;
            while (end < s.size() && !IsPySpace(s, end, &len)) end += len;
            parts.push_back(Value::Str(s.substr(pos, end - pos)));
            pos = end;
          }
        } else {
          if (sep->kind != Kind::kString) return Err(line, "split() separator must be a string or None");
          if (sep->s.empty()) return Err(line, "split(): empty separator");
          size_t pos = 0;
          while (true) {
            size_t hit = s.find(sep->s, pos);
            if (hit == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit)) {
              parts.push_back(Value::Str(s.substr(pos)));
              break;
            }
            parts.push_back(Value::Str(s.substr(pos, hit - pos)));
            pos = hit + sep->s.size();
          }
        }
        DAISY_RETURN_IF_ERROR(Charge(parts.size(), line));
        return Value::MakeList(std::move(parts));
      }
      if (name == "splitlines") {
        std::vector<Value> parts;
        for (auto& l : SplitLines(s)) parts.push_back(Value::Str(std::move(l)));
        DAISY_RETURN_IF_ERROR(Charge(parts.size(), line));
        return Value::MakeList(std::move(parts));
      }
      if (name == "replace") {
        DAISY_ASSIGN_OR_RETURN(std::string old, StrArg(a.Get(0, "old"), "replace() old", line));
        DAISY_ASSIGN_OR_RETURN(std::string repl, StrArg(a.Get(1, "new"), "replace() new", line));
        DAISY_ASSIGN_OR_RETURN(int64_t count, IntArg(a.Get(2, "count"), -1, "replace() count", line));
        std::string r = PyReplace(s, old, repl, count);
        DAISY_RETURN_IF_ERROR(Charge(r.size(), line));
        return Value::Str(std::move(r));
      }
      if (name == "find" || name == "count") {
        DAISY_ASSIGN_OR_RETURN(std::string sub, StrArg(a.Get(0, "sub"), name + "() argument", line));
        if (name == "find") {
          size_t hit = s.find(sub);
          if (hit == std::string::npos) return Value::Int(-1);
          int64_t cp = 0;
          for (const auto& [p, l] : CodePoints(std::string_view(s).substr(0, hit))) {
            (void)p;
            (void)l;
            ++cp;
          }
          return Value::Int(cp);
        }
        if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePoints(s).size()) + 1);
        int64_t n = 0;
        for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size())) ++n;
        return Value::Int(n);
      }
      if (name == "join") {
        const Value* seq = a.Get(0, "iterable");
        if (!seq) return Err(line, "join() takes exactly one argument");
        DAISY_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*seq, line));
        std::string r;
        for (size_t k = 0; k < items.size(); ++k) {
          if (items[k].kind != Kind::kString) {
            return Err(line,
                       "join(): sequence item " + std::to_string(k) + ": expected str, found " + TypeName(items[k]));
          }
          if (k) r += s;
          r += items[k].s;
        }
        DAISY_RETURN_IF_ERROR(Charge(r.size(), line));
        return Value::Str(std::move(r));
      }
      return Refuse(line, "method '" + name + "' on a string");
    }
    if (obj.kind == Kind::kDict) {
      const Dict& d = *obj.dict;
      if (name == "items" || name == "keys" || name == "values") {
        DAISY_RETURN_IF_ERROR(Charge(d.items.size(), line));
        std::vector<Value> out;
        for (const auto& [k, v] : d.items) {
          if (name == "items") {
            out.push_back(Value::MakeList({Value::Str(k), v}));
          } else {
            out.push_back(name == "keys" ? Value::Str(k) : v);
          }
        }
        return Value::MakeList(std::move(out));
      }
      if (name == "get") {
        const Value* key = a.Get(0, "key");
        if (!key) return Err(line, "get() takes at least 1 argument");
        if (key->kind == Kind::kString) {
          if (const Value* v = d.Find(key->s)) return *v;
        }
        const Value* dflt = a.Get(1, "default");
        return dflt ? *dflt : Value::None();
      }
      return Refuse(line, "method '" + name + "' on a " + TypeName(obj));
    }
    if (obj.IsUndefined()) {
      return Err(line, (obj.s.empty() ? std::string("a value") : "'" + obj.s + "'") + " is undefined; cannot call ." +
                           name + "()");
    }
    return Refuse(line, "method '" + name + "' on a " + TypeName(obj));
  }

  // ---- Tests ----

  Result<bool> ApplyTest(const std::string& name, const Value& v, const std::vector<Value>& args, int line) {
    auto arg = [&](size_t k) -> Result<Value> {
      if (k >= args.size()) return Err(line, "test '" + name + "' needs an argument");
      return args[k];
    };
    if (name == "defined") return !v.IsUndefined();
    if (name == "undefined") return v.IsUndefined();
    if (name == "none") return v.kind == Kind::kNone;
    if (name == "string") return v.kind == Kind::kString;
    if (name == "mapping") return v.kind == Kind::kDict;
    if (name == "iterable") {
      return v.kind == Kind::kList || v.kind == Kind::kDict || v.kind == Kind::kString || v.IsUndefined();
    }
    if (name == "sequence") {
      return v.kind == Kind::kList || v.kind == Kind::kDict || v.kind == Kind::kString || v.IsUndefined();
    }
    if (name == "number") return v.IsNumber();
    if (name == "integer") return v.kind == Kind::kInt;
    if (name == "float") return v.kind == Kind::kFloat;
    if (name == "boolean") return v.kind == Kind::kBool;
    if (name == "true") return v.kind == Kind::kBool && v.b;
    if (name == "false") return v.kind == Kind::kBool && !v.b;
    if (name == "callable") return v.kind == Kind::kFunc;
    if (name == "lower") return v.kind == Kind::kString && PyLower(v.s) == v.s && PyUpper(v.s) != v.s;
    if (name == "upper") return v.kind == Kind::kString && PyUpper(v.s) == v.s && PyLower(v.s) != v.s;
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (!IsIntLike(v)) return Err(line, "test '" + name + "' needs an integer, not " + TypeName(v));
      int64_t d = 2;
      if (name == "divisibleby") {
        DAISY_ASSIGN_OR_RETURN(Value n, arg(0));
        if (!IsIntLike(n) || AsInt(n) == 0) return Err(line, "divisibleby needs a non-zero integer");
        d = AsInt(n);
      }
      if (d == -1) return true;
      const int64_t r = AsInt(v) % d;
      return name == "odd" ? r != 0 : r == 0;
    }
    if (name == "eq" || name == "equalto" || name == "ne" || name == "lt" || name == "lessthan" || name == "gt" ||
        name == "greaterthan" || name == "le" || name == "ge" || name == "in") {
      DAISY_ASSIGN_OR_RETURN(Value other, arg(0));
      static const std::pair<const char*, const char*> kOps[] = {
          {"eq", "=="}, {"equalto", "=="},    {"ne", "!="}, {"lt", "<"},  {"lessthan", "<"},
          {"gt", ">"},  {"greaterthan", ">"}, {"le", "<="}, {"ge", ">="}, {"in", "in"}};
      for (const auto& [t, op] : kOps) {
        if (name == t) return Compare(op, v, other, line);
      }
    }
    if (name == "sameas") {
      DAISY_ASSIGN_OR_RETURN(Value other, arg(0));
      if (v.kind != other.kind) return false;
      if (v.kind == Kind::kList) return v.list == other.list;
      if (v.kind == Kind::kDict) return v.dict == other.dict;
      if (v.kind == Kind::kFunc) return v.func == other.func;
      return Equal(v, other);
    }
    return Refuse(line, "test '" + name + "'");
  }

  // ---- Filters ----

  using Kwargs = std::vector<std::pair<std::string, Value>>;

  Result<Value> AttrPath(const Value& item, const std::string& path) {
    Value cur = item;
    size_t start = 0;
    while (true) {
      size_t dot = path.find('.', start);
      std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      bool numeric =
          !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (numeric && part.size() < 18) {
        DAISY_ASSIGN_OR_RETURN(cur, GetItem(cur, Value::Int(std::stoll(part))));
      } else {
        cur = GetAttr(cur, part, nullptr);
      }
      if (dot == std::string::npos) return cur;
      start = dot + 1;
    }
  }

  Result<Value> ApplyFilter(const std::string& name, Value v, const std::vector<Value>& pos, const Kwargs& kw,
                            int line) {
    Args a{pos, kw};
    auto as_str = [&] { return v.kind == Kind::kString ? v.s : ToStr(v); };
    if (name == "safe") return v;
    if (name == "string") return Value::Str(as_str());
    if (name == "default" || name == "d") {
      const Value* dflt = a.Get(0, "default_value");
      const Value* boolean = a.Get(1, "boolean");
      const bool use = v.IsUndefined() || (boolean && Truthy(*boolean) && !Truthy(v));
      if (!use) return v;
      return dflt ? *dflt : Value::Str("");
    }
    if (name == "trim") {
      const Value* chars = a.Get(0, "chars");
      const std::string* cs = chars && chars->kind == Kind::kString ? &chars->s : nullptr;
      return Value::Str(PyStrip(as_str(), cs, true, true));
    }
    if (name == "upper") return Value::Str(PyUpper(as_str()));
    if (name == "lower") return Value::Str(PyLower(as_str()));
    if (name == "title") return Value::Str(PyTitle(as_str()));
    if (name == "capitalize") return Value::Str(PyCapitalize(as_str()));
    if (name == "e" || name == "escape") {
      std::string out;
      for (char c : as_str()) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return Value::Str(std::move(out));
    }
    if (name == "replace") {
      DAISY_ASSIGN_OR_RETURN(std::string old, StrArg(a.Get(0, "old"), "replace old", line));
      DAISY_ASSIGN_OR_RETURN(std::string repl, StrArg(a.Get(1, "new"), "replace new", line));
      DAISY_ASSIGN_OR_RETURN(int64_t count, IntArg(a.Get(2, "count"), -1, "replace count", line));
      std::string r = PyReplace(as_str(), old, repl, count);
      DAISY_RETURN_IF_ERROR(Charge(r.size(), line));
      return Value::Str(std::move(r));
    }
    if (name == "indent") {
      const Value* width = a.Get(0, "width");
      std::string ind = width && width->kind == Kind::kString ? width->s : std::string();
      if (!width || width->kind != Kind::kString) {
        DAISY_ASSIGN_OR_RETURN(int64_t w, IntArg(width, 4, "indent width", line));
        if (w < 0 || w > 1024) return Err(line, "indent width out of range");
        ind.assign(static_cast<size_t>(w), ' ');
      }
      const Value* first = a.Get(1, "first");
      const Value* blank = a.Get(2, "blank");
      std::vector<std::string> lines = SplitLines(as_str() + "\n");
      std::string out;
      if (blank && Truthy(*blank)) {
        for (size_t k = 0; k < lines.size(); ++k) {
          if (k) out += "\n" + ind;
          out += lines[k];
        }
      } else if (!lines.empty()) {
        out = lines[0];
        for (size_t k = 1; k < lines.size(); ++k) out += "\n" + (lines[k].empty() ? lines[k] : ind + lines[k]);
      }
      if (first && Truthy(*first)) out = ind + out;
      DAISY_RETURN_IF_ERROR(Charge(out.size(), line));
      return Value::Str(std::move(out));
    }
    if (name == "length" || name == "count") {
      switch (v.kind) {
        case Kind::kUndefined:
          return Value::Int(0);
        case Kind::kString:
          return Value::Int(static_cast<int64_t>(CodePoints(v.s).size()));
        case Kind::kList:
          return Value::Int(static_cast<int64_t>(v.list->items.size()));
        case Kind::kDict:
          return Value::Int(static_cast<int64_t>(v.dict->items.size()));
        default:
          return Err(line, "object of type '" + TypeName(v) + "' has no len()");
      }
    }
    if (name == "tojson") {
      for (const auto& [k, x] : kw) {
        if (k != "indent" && k != "sort_keys") return Refuse(line, "tojson argument '" + k + "'");
      }
      DAISY_ASSIGN_OR_RETURN(int64_t indent, IntArg(a.Get(0, "indent"), -1, "tojson indent", line));
      if (indent > 64) return Err(line, "tojson indent out of range");
      const Value* sort = a.Get(1, "sort_keys");
      auto r = ToJson(v, static_cast<int>(std::max<int64_t>(indent, -1)), sort && Truthy(*sort));
      if (!r.ok()) return Err(line, r.status().message());
      DAISY_RETURN_IF_ERROR(Charge(r->size(), line));
      return Value::Str(std::move(r).value());
    }
    if (name == "abs") {
      if (v.kind == Kind::kFloat) return Value::Float(std::fabs(v.f));
      if (IsIntLike(v)) {
        if (AsInt(v) == INT64_MIN) return Err(line, "integer overflow");
        return Value::Int(std::llabs(AsInt(v)));
      }
      return Err(line, "bad operand type for abs(): '" + TypeName(v) + "'");
    }
    if (name == "int" || name == "float") {
      const Value* dflt = a.Get(0, "default");
      Value fallback = dflt ? *dflt : (name == "int" ? Value::Int(0) : Value::Float(0));
      if (v.IsNumber())
        return name == "int" ? (v.kind == Kind::kFloat ? (std::isfinite(v.f) && std::fabs(v.f) < 9.2e18
                                                              ? Value::Int(static_cast<int64_t>(v.f))
                                                              : fallback)
                                                       : Value::Int(AsInt(v)))
                             : Value::Float(AsDouble(v));
      if (v.kind == Kind::kString) {
        std::string t = PyStrip(v.s, nullptr, true, true);
        try {
          size_t used = 0;
          if (name == "int") {
            long long x = std::stoll(t, &used, 10);
            if (used == t.size()) return Value::Int(x);
            double d = std::stod(t, &used);
            if (used == t.size() && std::isfinite(d) && std::fabs(d) < 9.2e18)
              return Value::Int(static_cast<int64_t>(d));
          } else {
            double d = std::stod(t, &used);
            if (used == t.size()) return Value::Float(d);
          }
        } catch (...) {
        }
      }
      return fallback;
    }
    // Sequence filters.
    if (name == "first" || name == "last") {
      if (v.IsUndefined()) return Undefined("");
      DAISY_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, line));
      if (items.empty()) return Undefined("");
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") {
      DAISY_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, line));
      return Value::MakeList(std::move(items));
    }
    if (name == "reverse") {
      if (v.kind == Kind::kString) {
        auto cps = CodePoints(v.s);
        std::string r;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) r += std::string_view(v.s).substr(it->first, it->second);
        return Value::Str(std::move(r));
      }
      DAISY_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, line));
      std::reverse(items.begin(), items.end());
      return Value::MakeList(std::move(items));
    }
    if (name == "items") {
      if (v.IsUndefined()) return Value::MakeList({});
      if (v.kind != Kind::kDict) return Err(line, "items filter needs a mapping, not " + TypeName(v));
      return CallMethod(v, "items", Args{}, line);
    }
    if (name == "join") {
      const Value* sep = a.Get(0, "d");
      const Value* attr = a.Get(1, "attribute");
      DAISY_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, line));
      std::string out;
      const std::string sep_s = sep ? ToStr(*sep) : "";
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += sep_s;
        if (attr) {
          DAISY_ASSIGN_OR_RETURN(Value x, AttrPath(items[k], ToStr(*attr)));
          out += ToStr(x);
        } else {
          out += ToStr(items[k]);
        }
        DAISY_RETURN_IF_ERROR(Charge(0, line));
      }
      DAISY_RETURN_IF_ERROR(Charge(out.size(), line));
      return Value::Str(std::move(out));
    }
    if (name == "unique" || name == "sort") {
      DAISY_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, line));
      const Value* attr = a.Get(name == "sort" ? 2 : 1, "attribute");
      const Value* case_sensitive = a.Get(name == "sort" ? 1 : 0, "case_sensitive");
      const bool cs = case_sensitive && Truthy(*case_sensitive);
      auto key = [&](const Value& x) -> Result<Value> {
        Value k = x;
        if (attr) {
          DAISY_ASSIGN_OR_RETURN(k, AttrPath(x, ToStr(*attr)));
        }
        if (!cs && k.kind == Kind::kString) k.s = PyLower(k.s);
        return k;
      };
      std::vector<Value> keys;
      for (const Value& x : items) {
        DAISY_ASSIGN_OR_RETURN(Value k, key(x));
        keys.push_back(std::move(k));
      }
      DAISY_RETURN_IF_ERROR(Charge(items.size() * 8, line));
      if (name == "unique") {
        std::vector<Value> out, seen;
        for (size_t k = 0; k < items.size(); ++k) {
          if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return Equal(s, keys[k]); })) continue;
          seen.push_back(keys[k]);
          out.push_back(items[k]);
        }
        return Value::MakeList(std::move(out));
      }
      const Value* reverse = a.Get(0, "reverse");
      std::vector<size_t> order(items.size());
      for (size_t k = 0; k < order.size(); ++k) order[k] = k;
      Status st;
      std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
        if (!st.ok()) return false;
        auto r = Less(keys[x], keys[y], "<", line);
        if (!r.ok()) {
          st = r.status();
          return false;
        }
        return *r;
      });
      DAISY_RETURN_IF_ERROR(st);
      if (reverse && Truthy(*reverse)) std::reverse(order.begin(), order.end());
      std::vector<Value> out;
      out.reserve(order.size());
      for (size_t k : order) out.push_back(items[k]);
      return Value::MakeList(std::move(out));
    }
    if (name == "map") {
      DAISY_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, line));
      std::vector<Value> out;
      const Value* attr = nullptr;
      for (const auto& [k, x] : kw) {
        if (k == "attribute") attr = &x;
      }
      if (attr) {
        const Value* dflt = nullptr;
        for (const auto& [k, x] : kw) {
          if (k == "default") dflt = &x;
        }
        for (const Value& item : items) {
          DAISY_ASSIGN_OR_RETURN(Value x, AttrPath(item, ToStr(*attr)));
          out.push_back(x.IsUndefined() && dflt ? *dflt : x);
        }
        return Value::MakeList(std::move(out));
      }
      if (pos.empty() || pos[0].kind != Kind::kString) return Err(line, "map needs a filter name or attribute=");
      const std::string filter = pos[0].s;
      static const char* const kMappable[] = {"abs",    "capitalize", "count",  "d",       "default", "e",
                                              "escape", "first",      "float",  "int",     "join",    "last",
                                              "length", "list",       "lower",  "replace", "reverse", "safe",
                                              "string", "title",      "tojson", "trim",    "upper",   "items"};
      if (std::none_of(std::begin(kMappable), std::end(kMappable), [&](const char* f) { return filter == f; })) {
        return Refuse(line, "filter '" + filter + "' inside map");
      }
      std::vector<Value> rest(pos.begin() + 1, pos.end());
      for (const Value& item : items) {
        DAISY_ASSIGN_OR_RETURN(Value x, ApplyFilter(filter, item, rest, kw, line));
        out.push_back(std::move(x));
      }
      return Value::MakeList(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name.ends_with("attr");
      const bool keep_if = name.starts_with("select");
      DAISY_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v, line));
      size_t k = 0;
      std::string attr;
      if (by_attr) {
        if (pos.empty() || pos[0].kind != Kind::kString) return Err(line, name + " needs an attribute name");
        attr = pos[0].s;
        k = 1;
      }
      std::string test;
      if (k < pos.size()) {
        if (pos[k].kind != Kind::kString) return Err(line, name + " needs a test name");
        test = pos[k].s;
        ++k;
      }
      std::vector<Value> test_args(pos.begin() + static_cast<ptrdiff_t>(std::min(k, pos.size())), pos.end());
      std::vector<Value> out;
      for (const Value& item : items) {
        Value x = item;
        if (by_attr) {
          DAISY_ASSIGN_OR_RETURN(x, AttrPath(item, attr));
        }
        bool r = false;
        if (test.empty()) {
          r = Truthy(x);
        } else {
          DAISY_ASSIGN_OR_RETURN(r, ApplyTest(test, x, test_args, line));
        }
        if (r == keep_if) out.push_back(item);
      }
      return Value::MakeList(std::move(out));
    }
    return Refuse(line, "filter '" + name + "'");
  }

  std::vector<Frame> frames_;
  std::string* out_ = nullptr;
  uint64_t work_ = 0;
  int macro_depth_ = 0;
};

}  // namespace

Result<std::string> Render(const Program& program, const Value& context) {
  Renderer r(context);
  return r.Run(program);
}

}  // namespace daisy::jinja
