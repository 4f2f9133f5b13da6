// The Jinja subset behind ChatTemplate: values, the syntax tree, the lexer/parser and the
// renderer. Internal to the chat module (daisy/chat_template.h is the public surface).
//
// Semantics follow Jinja2 as Python transformers configures it (trim_blocks, lstrip_blocks,
// loopcontrols, its own tojson); docs/TEMPLATES.md lists the subset and what is refused.
// Every limit a hostile template could push (nesting, steps, output and value sizes) is
// bounded and reported as an error, never a crash. Value types; thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "daisy/status.h"

namespace daisy::jinja {

// Limits (docs/TEMPLATES.md).
inline constexpr int kMaxNesting = 128;                  // brackets, blocks, unary chains
inline constexpr int kMaxValueDepth = 256;               // nested lists/dicts
inline constexpr int kMaxMacroDepth = 32;                // macro calls inside macro calls
inline constexpr size_t kMaxOutput = size_t{16} << 20;   // bytes of rendered text
inline constexpr uint64_t kMaxWork = uint64_t{1} << 26;  // steps + bytes/elements produced

struct List;
struct Dict;
struct Stmt;

// A callable: a builtin global (range, namespace, ...) or a macro of the template.
struct Func {
  enum class Builtin : uint8_t { kNone, kRange, kNamespace, kRaiseException, kStrftimeNow, kDict };
  Builtin builtin = Builtin::kNone;
  const Stmt* macro = nullptr;  // owned by the Program, which outlives every render
  std::string name;
};

// A Jinja value. Lists and dicts are shared (a namespace assigned through `set ns.x` is
// seen by every holder, as in Python); nothing else mutates them after construction.
struct Value {
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunc };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<const Func> func;

  static Value Of(Kind k) {
    Value x;
    x.kind = k;
    return x;
  }
  static Value None() { return Of(Kind::kNone); }
  static Value Bool(bool v) {
    Value x = Of(Kind::kBool);
    x.b = v;
    return x;
  }
  static Value Int(int64_t v) {
    Value x = Of(Kind::kInt);
    x.i = v;
    return x;
  }
  static Value Float(double v) {
    Value x = Of(Kind::kFloat);
    x.f = v;
    return x;
  }
  static Value Str(std::string v) {
    Value x = Of(Kind::kString);
    x.s = std::move(v);
    return x;
  }
  static Value MakeList(std::vector<Value> items);
  static Value MakeDict(std::vector<std::pair<std::string, Value>> items, bool is_namespace = false);

  bool IsUndefined() const { return kind == Kind::kUndefined; }
  bool IsNumber() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  // Nesting depth: 0 for a scalar, 1 + the deepest element for a list or dict.
  int Depth() const;
  // True for a namespace or a container holding one. A namespace never stores such a
  // value, so no value can contain itself.
  bool HasNamespace() const;
};

struct List {
  std::vector<Value> items;
  int depth = 1;
  bool has_namespace = false;  // holds a namespace, at any depth
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, as Python dicts
  bool is_namespace = false;
  bool has_namespace = false;  // holds a namespace, at any depth
  int depth = 1;
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value v);

 private:
  std::unordered_map<std::string, size_t> index_;  // key -> position in items
};

// Python semantics: truthiness, str(), repr(), ==, and json.dumps as transformers' tojson.
bool Truthy(const Value& v);
std::string ToStr(const Value& v);
std::string Repr(const Value& v);
bool Equal(const Value& a, const Value& b);
// indent < 0: one line with ", " and ": "; else newline + indent spaces per level.
Result<std::string> ToJson(const Value& v, int indent, bool sort_keys);
// From JSON text (the render context). Objects become dicts, arrays lists.
Result<Value> FromJsonText(std::string_view json_text);

// UTF-8 helpers: the byte spans of each code point (an invalid byte is its own unit).
std::vector<std::pair<size_t, size_t>> CodePoints(std::string_view s);
std::string PyUpper(std::string_view s);
std::string PyLower(std::string_view s);
std::string PyTitle(std::string_view s);
std::string PyCapitalize(std::string_view s);
bool IsPySpace(std::string_view s, size_t pos, size_t* len);  // whitespace code point at pos?
// str.strip / lstrip / rstrip: chars == nullptr strips whitespace (str.isspace).
std::string PyStrip(std::string_view s, const std::string* chars, bool left, bool right);

// ---- Syntax tree -------------------------------------------------------------------------

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind : uint8_t {
    kLiteral,  // literal
    kName,     // name
    kList,     // kids
    kDict,     // kids: key0, value0, key1, value1, ...
    kAttr,     // kids[0].name
    kIndex,    // kids[0][kids[1]]
    kSlice,    // kids[0][kids[1]:kids[2]:kids[3]] (null kids allowed)
    kCall,     // kids[0](args, kwargs)
    kFilter,   // kids[0] | name(args, kwargs)
    kTest,     // kids[0] is [not] name(args)
    kUnary,    // name ("-", "+", "not") kids[0]
    kBinary,   // kids[0] name kids[1]: + - * / // % ** ~ and or
    kCompare,  // kids[0] ops[0] kids[1] ops[1] kids[2] ...: == != < > <= >= in "not in"
    kTernary,  // kids[0] if kids[1] else kids[2] (kids[2] null: undefined)
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  bool negated = false;  // kTest: `is not`
  std::string name;
  Value literal;
  std::vector<ExprPtr> kids;
  std::vector<std::string> ops;                         // kCompare
  std::vector<ExprPtr> args;                            // kCall, kFilter, kTest
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // kCall, kFilter
};

using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind : uint8_t {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // conds[i] -> bodies[i]; bodies.size() == conds.size() + 1 with an else
    kFor,       // for targets in expr [if cond]: bodies[0], else bodies[1]
    kSet,       // set targets = expr; targets = {name, attr} with attr_target
    kSetBlock,  // set targets[0] %} bodies[0] {% endset
    kMacro,     // macro name(params = defaults) bodies[0]
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;  // kText; kMacro: name
  ExprPtr expr;
  ExprPtr cond;  // kFor filter
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  std::vector<std::string> targets;
  bool attr_target = false;
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: name, default (or null)
};

struct Program {
  Body body;
};

// Parses `source` with trim_blocks and lstrip_blocks on. Syntax errors are InvalidArgument,
// constructs outside the subset Unimplemented ("unsupported Jinja construct: ...").
Result<std::unique_ptr<Program>> Parse(std::string_view source);

// Renders `program` with `context` (a dict) as the template's global variables.
// raise_exception(msg) fails with exactly `msg` (InvalidArgument).
Result<std::string> Render(const Program& program, const Value& context);

}  // namespace daisy::jinja
