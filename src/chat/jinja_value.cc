// Values of the Jinja subset with Python's semantics: truthiness, str(), repr(), ==,
// json.dumps (as transformers' tojson calls it), and the str methods templates use.
#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "jinja.h"

namespace daisy::jinja {

Value Value::MakeList(std::vector<Value> items) {
  Value v = Value::Of(Kind::kList);
  v.list = std::make_shared<List>();
  int depth = 0;
  for (const Value& x : items) {
    depth = std::max(depth, x.Depth());
    v.list->has_namespace = v.list->has_namespace || x.HasNamespace();
  }
  v.list->depth = depth + 1;
  v.list->items = std::move(items);
  return v;
}

Value Value::MakeDict(std::vector<std::pair<std::string, Value>> items, bool is_namespace) {
  Value v = Value::Of(Kind::kDict);
  v.dict = std::make_shared<Dict>();
  v.dict->is_namespace = is_namespace;
  for (auto& item : items) v.dict->Set(item.first, std::move(item.second));
  return v;
}

bool Value::HasNamespace() const {
  if (kind == Kind::kList) return list->has_namespace;
  if (kind == Kind::kDict) return dict->is_namespace || dict->has_namespace;
  return false;
}

int Value::Depth() const {
  if (kind == Kind::kList) return list->depth;
  if (kind == Kind::kDict) return dict->depth;
  return 0;
}

const Value* Dict::Find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &items[it->second].second;
}

void Dict::Set(const std::string& key, Value v) {
  depth = std::max(depth, v.Depth() + 1);
  has_namespace = has_namespace || v.HasNamespace();
  auto [it, added] = index_.emplace(key, items.size());
  if (!added) {
    items[it->second].second = std::move(v);
    return;
  }
  items.emplace_back(key, std::move(v));
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.b;
    case Value::Kind::kInt:
      return v.i != 0;
    case Value::Kind::kFloat:
      return v.f != 0;
    case Value::Kind::kString:
      return !v.s.empty();
    case Value::Kind::kList:
      return !v.list->items.empty();
    case Value::Kind::kDict:
      return !v.dict->items.empty();
    case Value::Kind::kFunc:
      return true;
  }
  return false;
}

namespace {

// float.__repr__: the shortest string that reads back, with ".0" on integral values.
std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, f);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) {
    if (std::fabs(f) >= 1e16) {  // Python's repr switches to exponent form here
      auto r2 = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
      s.assign(buf, r2.ptr);
    } else {
      s += ".0";
    }
  }
  return s;
}

void JsonEscape(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void PyReprString(std::string& out, std::string_view s) {
  const bool dq = s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos;
  const char q = dq ? '"' : '\'';
  out += q;
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += q;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
}

void ReprInto(std::string& out, const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString:
      PyReprString(out, v.s);
      return;
    case Value::Kind::kList: {
      out += '[';
      bool first = true;
      for (const Value& x : v.list->items) {
        if (!first) out += ", ";
        first = false;
        ReprInto(out, x);
      }
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict->is_namespace) out += "<Namespace ";
      out += '{';
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        PyReprString(out, k);
        out += ": ";
        ReprInto(out, x);
      }
      out += '}';
      if (v.dict->is_namespace) out += '>';
      return;
    }
    default:
      out += ToStr(v);
  }
}

Status JsonInto(std::string& out, const Value& v, int indent, bool sort_keys, int level) {
  auto newline = [&](int lvl) {
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(lvl), ' ');
  };
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return InvalidArgument("tojson: cannot serialize an undefined value");
    case Value::Kind::kFunc:
      return InvalidArgument("tojson: cannot serialize a function");
    case Value::Kind::kNone:
      out += "null";
      return Status::Ok();
    case Value::Kind::kBool:
      out += v.b ? "true" : "false";
      return Status::Ok();
    case Value::Kind::kInt:
      out += std::to_string(v.i);
      return Status::Ok();
    case Value::Kind::kFloat:
      if (std::isnan(v.f)) {
        out += "NaN";
      } else if (std::isinf(v.f)) {
        out += v.f > 0 ? "Infinity" : "-Infinity";
      } else {
        out += FloatRepr(v.f);
      }
      return Status::Ok();
    case Value::Kind::kString:
      JsonEscape(out, v.s);
      return Status::Ok();
    case Value::Kind::kList: {
      if (v.list->items.empty()) {
        out += "[]";
        return Status::Ok();
      }
      out += '[';
      bool first = true;
      for (const Value& x : v.list->items) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(level + 1);
        DAISY_RETURN_IF_ERROR(JsonInto(out, x, indent, sort_keys, level + 1));
      }
      if (indent >= 0) newline(level);
      out += ']';
      return Status::Ok();
    }
    case Value::Kind::kDict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return Status::Ok();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(level + 1);
        JsonEscape(out, kv->first);
        out += ": ";
        DAISY_RETURN_IF_ERROR(JsonInto(out, kv->second, indent, sort_keys, level + 1));
      }
      if (indent >= 0) newline(level);
      out += '}';
      return Status::Ok();
    }
  }
  return Status::Ok();
}

Result<Value> FromJson(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth)
    return InvalidArgument("the template's context nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::Str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) {
        DAISY_ASSIGN_OR_RETURN(Value v, FromJson(x, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<std::string, Value>> items;
      items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        DAISY_ASSIGN_OR_RETURN(Value v, FromJson(it.value(), depth + 1));
        items.emplace_back(it.key(), std::move(v));
      }
      return Value::MakeDict(std::move(items));
    }
    default:
      return InvalidArgument("the template's context holds a value JSON cannot carry");
  }
}

// Decodes one UTF-8 code point at s[pos]; len 1 and cp -1 for an invalid byte.
int32_t DecodeAt(std::string_view s, size_t pos, size_t* len) {
  utf8proc_int32_t cp = -1;
  utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + pos),
                                        static_cast<utf8proc_ssize_t>(s.size() - pos), &cp);
  if (n <= 0) {
    *len = 1;
    return -1;
  }
  *len = static_cast<size_t>(n);
  return cp;
}

void Encode(std::string& out, int32_t cp) {
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t n = utf8proc_encode_char(cp, buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

template <typename Fn>
std::string MapCodePoints(std::string_view s, Fn fn) {
  std::string out;
  out.reserve(s.size());
  size_t len = 0;
  for (size_t pos = 0; pos < s.size(); pos += len) {
    int32_t cp = DecodeAt(s, pos, &len);
    if (cp < 0) {
      out.append(s.substr(pos, len));
    } else {
      Encode(out, fn(cp));
    }
  }
  return out;
}

bool IsCased(int32_t cp) {
  return utf8proc_toupper(cp) != cp || utf8proc_tolower(cp) != cp || utf8proc_totitle(cp) != cp;
}

}  // namespace

std::string ToStr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.i);
    case Value::Kind::kFloat:
      return FloatRepr(v.f);
    case Value::Kind::kString:
      return v.s;
    case Value::Kind::kFunc:
      return "<function " + v.func->name + ">";
    case Value::Kind::kList:
    case Value::Kind::kDict: {
      std::string out;
      ReprInto(out, v);
      return out;
    }
  }
  return "";
}

std::string Repr(const Value& v) {
  std::string out;
  ReprInto(out, v);
  return out;
}

bool Equal(const Value& a, const Value& b) {
  if (a.IsNumber() && b.IsNumber()) {
    if (a.kind == Value::Kind::kFloat || b.kind == Value::Kind::kFloat) {
      auto as_f = [](const Value& x) {
        return x.kind == Value::Kind::kFloat ? x.f
               : x.kind == Value::Kind::kInt ? static_cast<double>(x.i)
                                             : (x.b ? 1.0 : 0.0);
      };
      return as_f(a) == as_f(b);
    }
    auto as_i = [](const Value& x) { return x.kind == Value::Kind::kInt ? x.i : (x.b ? 1 : 0); };
    return as_i(a) == as_i(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.s == b.s;
    case Value::Kind::kFunc:
      return a.func == b.func;
    case Value::Kind::kList: {
      if (a.list == b.list) return true;
      if (a.list->items.size() != b.list->items.size()) return false;
      for (size_t k = 0; k < a.list->items.size(); ++k) {
        if (!Equal(a.list->items[k], b.list->items[k])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict == b.dict) return true;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, x] : a.dict->items) {
        const Value* y = b.dict->Find(k);
        if (!y || !Equal(x, *y)) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

Result<std::string> ToJson(const Value& v, int indent, bool sort_keys) {
  std::string out;
  DAISY_RETURN_IF_ERROR(JsonInto(out, v, indent, sort_keys, 0));
  return out;
}

Result<Value> FromJsonText(std::string_view json_text) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(json_text, nullptr, false);
  if (j.is_discarded()) return InvalidArgument("the template context is not valid JSON");
  return FromJson(j, 0);
}

std::vector<std::pair<size_t, size_t>> CodePoints(std::string_view s) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t len = 0;
  for (size_t pos = 0; pos < s.size(); pos += len) {
    DecodeAt(s, pos, &len);
    out.emplace_back(pos, len);
  }
  return out;
}

std::string PyUpper(std::string_view s) {
  return MapCodePoints(s, [](int32_t c) { return utf8proc_toupper(c); });
}
std::string PyLower(std::string_view s) {
  return MapCodePoints(s, [](int32_t c) { return utf8proc_tolower(c); });
}

std::string PyTitle(std::string_view s) {
  bool prev_cased = false;
  return MapCodePoints(s, [&](int32_t c) {
    int32_t r = prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c);
    prev_cased = IsCased(c);
    return r;
  });
}

std::string PyCapitalize(std::string_view s) {
  bool first = true;
  return MapCodePoints(s, [&](int32_t c) {
    int32_t r = first ? utf8proc_totitle(c) : utf8proc_tolower(c);
    first = false;
    return r;
  });
}

bool IsPySpace(std::string_view s, size_t pos, size_t* len) {
  int32_t cp = DecodeAt(s, pos, len);
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x1F:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string PyStrip(std::string_view s, const std::string* chars, bool left, bool right) {
  auto cps = CodePoints(s);
  auto strip_it = [&](const std::pair<size_t, size_t>& cp) {
    std::string_view c = s.substr(cp.first, cp.second);
    if (chars == nullptr) {
      size_t len = 0;
      return IsPySpace(s, cp.first, &len);
    }
    for (const auto& [p, l] : CodePoints(*chars)) {
      if (std::string_view(*chars).substr(p, l) == c) return true;
    }
    return false;
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  if (b == e) return "";
  return std::string(s.substr(cps[b].first, cps[e - 1].first + cps[e - 1].second - cps[b].first));
}

}  // namespace daisy::jinja
