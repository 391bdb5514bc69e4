// `strata inspect`'s content: architecture, hyper-parameters, tokenizer, tensors, totals, experts.
#include "gguf/summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>

namespace strata::gguf {

using nlohmann::json;

std::string_view file_type_name(uint32_t id) {
  // llama.cpp's llama_ftype (include/llama.h); retired ids are absent.
  static const std::map<uint32_t, std::string_view> names = {
      {0, "F32"},      {1, "F16"},     {2, "Q4_0"},    {3, "Q4_1"},    {7, "Q8_0"},     {8, "Q5_0"},
      {9, "Q5_1"},     {10, "Q2_K"},   {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"},  {14, "Q4_K_S"},
      {15, "Q4_K_M"},  {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"},   {19, "IQ2_XXS"}, {20, "IQ2_XS"},
      {21, "Q2_K_S"},  {22, "IQ3_XS"}, {23, "IQ3_XXS"}, {24, "IQ1_S"}, {25, "IQ4_NL"},  {26, "IQ3_S"},
      {27, "IQ3_M"},   {28, "IQ2_S"},  {29, "IQ2_M"},  {30, "IQ4_XS"}, {31, "IQ1_M"},   {32, "BF16"},
      {36, "TQ1_0"},   {37, "TQ2_0"},  {38, "MXFP4_MOE"},
  };
  auto it = names.find(id);
  return it == names.end() ? std::string_view{} : it->second;
}

namespace {

// f32 values print as the shortest decimal that reads back as the same float (1e-06, not
// 9.99999997e-07).
json float_json(double f, bool is_f32) {
  if (!is_f32) return f;
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, static_cast<float>(f));
  if (ec != std::errc{}) return f;
  double d = f;
  std::from_chars(buf, end, d);
  return d;
}

const Value* find_typed(const File& f, const std::string& key, ValueType t) {
  const Value* v = f.find(key);
  return v && v->type == t ? v : nullptr;
}

// Parses "blk.<N>.ffn_<x>_exps.<y>" -> N; -1 for other names.
long expert_layer(const std::string& name) {
  if (!name.starts_with("blk.")) return -1;
  size_t i = 4, j = i;
  while (j < name.size() && j - i < 9 && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return -1;
  const std::string_view rest = std::string_view(name).substr(j + 1);
  if (!rest.starts_with("ffn_")) return -1;
  const size_t e = rest.find("_exps.");
  if (e == std::string_view::npos || e <= 4) return -1;
  return std::stol(name.substr(i, j - i));
}

std::string human_bytes(uint64_t b) {
  if (b < 1024) return fmt::format("{} B", b);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b) / 1024;
  int u = 0;
  while (v >= 1024 && u < 3) v /= 1024, ++u;
  return fmt::format("{:.2f} {}", v, units[u]);
}

std::string human_count(uint64_t n) {
  if (n < 1000) return std::to_string(n);
  if (n < 1000000) return fmt::format("{:.2f} K", n / 1e3);
  if (n < 1000000000) return fmt::format("{:.2f} M", n / 1e6);
  return fmt::format("{:.2f} B", n / 1e9);
}

// Scalars and short arrays in one line for the text view.
std::string short_value(const json& v, size_t max_chars = 60) {
  const std::string raw = v.is_string() ? v.get<std::string>() : dump_json(v, -1);
  // Control bytes from the file never reach the terminal as such (no escape-sequence injection).
  std::string s;
  for (char c : raw) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n' || c == '\r' || c == '\t') s += ' ';
    else if (u < 0x20 || u == 0x7f) s += fmt::format("\\x{:02x}", u);
    else s += c;
  }
  if (s.size() > max_chars) {
    size_t cut = max_chars - 3;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // whole UTF-8 chars
    s = s.substr(0, cut) + "...";
  }
  return s;
}

template <typename... A>
void add_line(std::string& o, fmt::format_string<A...> f, A&&... a) {
  o += fmt::format(f, std::forward<A>(a)...);
  o += '\n';
}

}  // namespace

json value_to_json(const Value& v, size_t max_elems) {
  switch (v.type) {
    case ValueType::UINT8: case ValueType::UINT16: case ValueType::UINT32: case ValueType::UINT64:
      return v.num.u;
    case ValueType::INT8: case ValueType::INT16: case ValueType::INT32: case ValueType::INT64:
      return v.num.i;
    case ValueType::FLOAT32: return float_json(v.num.f, true);
    case ValueType::FLOAT64: return v.num.f;
    case ValueType::BOOL: return v.num.b;
    case ValueType::STRING: return v.str;
    case ValueType::ARRAY: {
      json a = json::array();
      const size_t n = max_elems ? std::min(max_elems, v.arr.size()) : v.arr.size();
      for (size_t i = 0; i < n; ++i) a.push_back(value_to_json(v.arr[i], max_elems));
      return a;
    }
  }
  return nullptr;
}

std::string dump_json(const json& j, int indent) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

json summarize(const File& f) {
  json s;
  s["schema"] = kInspectSchema;
  s["file"] = {{"path", f.path()},
               {"size", f.file_size()},
               {"gguf_version", f.version()},
               {"alignment", f.alignment()},
               {"data_offset", f.data_offset()},
               {"metadata_count", f.metadata().size()},
               {"tensor_count", f.tensors().size()}};

  const Value* arch = find_typed(f, "general.architecture", ValueType::STRING);
  s["architecture"] = arch ? json(arch->str) : json(nullptr);
  const Value* name = find_typed(f, "general.name", ValueType::STRING);
  s["name"] = name ? json(name->str) : json(nullptr);
  s["file_type"] = nullptr;
  if (const Value* ft = find_typed(f, "general.file_type", ValueType::UINT32)) {
    const auto n = file_type_name(static_cast<uint32_t>(ft->num.u));
    s["file_type"] = {{"id", ft->num.u}, {"name", n.empty() ? json(nullptr) : json(std::string(n))}};
  }

  // Hyper-parameters: every "<arch>.*" key, the prefix dropped ("block_count", "attention.head_count").
  json hp = json::object();
  if (arch) {
    const std::string prefix = arch->str + ".";
    for (const KeyValue& kv : f.metadata())
      if (kv.key.starts_with(prefix) && kv.key.size() > prefix.size())
        hp[kv.key.substr(prefix.size())] = value_to_json(kv.value, 1024);
  }
  s["hyperparameters"] = hp;

  // Tokenizer summary.
  json tok = nullptr;
  bool any_tok = false;
  for (const KeyValue& kv : f.metadata()) any_tok = any_tok || kv.key.starts_with("tokenizer.");
  if (any_tok) {
    tok = json::object();
    auto str = [&](const char* k) -> json {
      const Value* v = find_typed(f, k, ValueType::STRING);
      return v ? json(v->str) : json(nullptr);
    };
    auto arr_len = [&](const char* k) -> json {
      const Value* v = find_typed(f, k, ValueType::ARRAY);
      return v ? json(v->arr.size()) : json(nullptr);
    };
    const Value* tokens = f.find("tokenizer.ggml.tokens");
    const bool string_tokens = tokens && tokens->type == ValueType::ARRAY && tokens->elem_type == ValueType::STRING;
    tok["model"] = str("tokenizer.ggml.model");
    tok["pre"] = str("tokenizer.ggml.pre");
    tok["vocab_size"] = arr_len("tokenizer.ggml.tokens");
    tok["merges"] = arr_len("tokenizer.ggml.merges");
    for (const char* which : {"bos", "eos", "eot", "padding", "unknown"}) {
      const std::string key = fmt::format("tokenizer.ggml.{}_token_id", which);
      const Value* id = f.find(key);
      json entry = nullptr;
      if (id && id->type != ValueType::ARRAY && id->type != ValueType::STRING && id->type != ValueType::BOOL) {
        const bool is_signed = id->type == ValueType::INT8 || id->type == ValueType::INT16 ||
                               id->type == ValueType::INT32 || id->type == ValueType::INT64;
        entry = {{"id", is_signed ? json(id->num.i) : json(id->num.u)}, {"text", nullptr}};
        if (string_tokens && (is_signed ? id->num.i >= 0 : true)) {
          const uint64_t i = is_signed ? static_cast<uint64_t>(id->num.i) : id->num.u;
          if (i < tokens->arr.size()) entry["text"] = tokens->arr[i].str;
        }
      }
      tok[std::string(which) + "_token"] = entry;
    }
    for (const char* k : {"add_bos_token", "add_eos_token"}) {
      const Value* v = find_typed(f, std::string("tokenizer.ggml.") + k, ValueType::BOOL);
      tok[k] = v ? json(v->num.b) : json(nullptr);
    }
    const Value* tmpl = find_typed(f, "tokenizer.chat_template", ValueType::STRING);
    tok["has_chat_template"] = tmpl != nullptr;
    tok["chat_template_bytes"] = tmpl ? json(tmpl->str.size()) : json(nullptr);
  }
  s["tokenizer"] = tok;

  // All metadata: type and value; arrays give their length and at most 8 leading elements.
  json md = json::array();
  for (const KeyValue& kv : f.metadata()) {
    json e = {{"key", kv.key}, {"type", describe_type(kv.value)}, {"offset", kv.offset}};
    if (kv.value.type == ValueType::ARRAY) {
      e["count"] = kv.value.arr.size();
      e["head"] = value_to_json(kv.value, 8);
    } else {
      e["value"] = value_to_json(kv.value);
    }
    md.push_back(std::move(e));
  }
  s["metadata"] = md;

  // Tensors, totals by type, experts per layer.
  json tensors = json::array();
  struct Tot { uint64_t tensors = 0, elements = 0, bytes = 0; };
  std::map<std::string, Tot> by_type;
  Tot all;
  std::map<long, std::pair<uint64_t, json>> layers;  // layer -> (bytes, tensor names)
  uint64_t n_experts_seen = 0;
  for (const TensorInfo& t : f.tensors()) {
    const std::string type(type_name(t.type));
    json shape = json::array();
    for (uint32_t d = 0; d < t.n_dims; ++d) shape.push_back(t.ne[d]);
    tensors.push_back({{"name", t.name}, {"type", type}, {"shape", shape}, {"elements", t.n_elements()},
                       {"bytes", t.nbytes}, {"offset", t.offset}});
    for (Tot* x : {&by_type[type], &all}) {
      x->tensors += 1;
      x->elements += t.n_elements();
      x->bytes += t.nbytes;
    }
    if (long l = expert_layer(t.name); l >= 0) {
      auto& [bytes, names] = layers[l];
      bytes += t.nbytes;
      if (names.is_null()) names = json::array();
      names.push_back(t.name);
      if (t.n_dims >= 2) n_experts_seen = std::max(n_experts_seen, t.ne[t.n_dims - 1]);
    }
  }
  s["tensors"] = tensors;
  std::vector<std::pair<std::string, Tot>> sorted(by_type.begin(), by_type.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.second.bytes > b.second.bytes; });
  json totals = json::array();
  for (auto& [type, t] : sorted)
    totals.push_back({{"type", type}, {"tensors", t.tensors}, {"elements", t.elements}, {"bytes", t.bytes}});
  s["totals_by_type"] = totals;
  s["totals"] = {{"tensors", all.tensors}, {"elements", all.elements}, {"bytes", all.bytes}};

  json experts = nullptr;
  if (!layers.empty()) {
    uint64_t n_exp = n_experts_seen;
    if (arch) {
      const Value* ec = f.find(arch->str + ".expert_count");
      if (ec && ec->type == ValueType::UINT32 && ec->num.u > 0) n_exp = ec->num.u;
    }
    json used = nullptr;
    if (arch) {
      const Value* eu = f.find(arch->str + ".expert_used_count");
      if (eu && eu->type == ValueType::UINT32) used = eu->num.u;
    }
    uint64_t total = 0;
    json ls = json::array();
    for (auto& [l, entry] : layers) {
      total += entry.first;
      ls.push_back({{"layer", l},
                    {"bytes", entry.first},
                    {"bytes_per_expert", n_exp ? json(entry.first / n_exp) : json(nullptr)},
                    {"tensors", entry.second}});
    }
    experts = {{"count", n_exp ? json(n_exp) : json(nullptr)},
               {"used", used},
               {"bytes", total},
               {"share_of_tensor_bytes", all.bytes ? static_cast<double>(total) / all.bytes : 0.0},
               {"layers", ls}};
  }
  s["experts"] = experts;
  return s;
}

std::string render_text(const json& s) {
  std::string o;
  const json& file = s["file"];
  add_line(o, "file          {} ({}, {} bytes)", file["path"].get<std::string>(), human_bytes(file["size"]),
       file["size"].get<uint64_t>());
  add_line(o, "format        GGUF v{}, alignment {}, {} metadata keys, {} tensors, data at offset {}",
       file["gguf_version"].get<uint32_t>(), file["alignment"].get<uint64_t>(), file["metadata_count"].get<uint64_t>(),
       file["tensor_count"].get<uint64_t>(), file["data_offset"].get<uint64_t>());
  add_line(o, "architecture  {}", s["architecture"].is_null() ? "(none)" : s["architecture"].get<std::string>());
  if (!s["name"].is_null()) add_line(o, "name          {}", short_value(s["name"]));
  if (!s["file_type"].is_null()) {
    const json& ft = s["file_type"];
    add_line(o, "file type     {} ({})", ft["name"].is_null() ? "unknown" : ft["name"].get<std::string>(),
         ft["id"].get<uint64_t>());
  }
  const json& tot = s["totals"];
  add_line(o, "weights       {} parameters, {}", human_count(tot["elements"]), human_bytes(tot["bytes"]));

  if (!s["hyperparameters"].empty()) {
    add_line(o, "\nhyper-parameters ({}.*)", s["architecture"].get<std::string>());
    for (auto& [k, v] : s["hyperparameters"].items()) add_line(o, "  {:<40} {}", k, short_value(v));
  }
  if (!s["tokenizer"].is_null()) {
    const json& t = s["tokenizer"];
    auto opt = [](const json& v) { return v.is_null() ? std::string("-") : short_value(v); };
    add_line(o, "\ntokenizer");
    add_line(o, "  model {}, pre {}, {} tokens, {} merges", opt(t["model"]), opt(t["pre"]), opt(t["vocab_size"]),
         opt(t["merges"]));
    for (const char* which : {"bos", "eos", "eot", "padding", "unknown"}) {
      const json& e = t[std::string(which) + "_token"];
      if (!e.is_null())
        add_line(o, "  {:<8} {} {}", which, opt(e["id"]), e["text"].is_null() ? "" : dump_json(e["text"], -1));
    }
    add_line(o, "  add bos {}, add eos {}", opt(t["add_bos_token"]), opt(t["add_eos_token"]));
    add_line(o, "  chat template: {}", t["has_chat_template"].get<bool>()
                                    ? fmt::format("yes ({} bytes)", t["chat_template_bytes"].get<uint64_t>())
                                    : std::string("no"));
  }

  // The remaining keys (general.*, tokenizer.*, ...): type and a one-line value.
  const std::string arch_prefix = s["architecture"].is_null() ? "" : s["architecture"].get<std::string>() + ".";
  bool header = false;
  for (const json& m : s["metadata"]) {
    const std::string key = m["key"];
    if (!arch_prefix.empty() && key.starts_with(arch_prefix)) continue;
    if (!header) add_line(o, "\nother metadata");
    header = true;
    const std::string value = m.contains("count")
                                  ? fmt::format("[{}] {}", m["count"].get<uint64_t>(), short_value(m["head"], 50))
                                  : short_value(m["value"]);
    add_line(o, "  {:<40} {:<16} {}", short_value(m["key"], 40), m["type"].get<std::string>(), value);
  }

  if (!s["tensors"].empty()) {
    size_t w = 4;
    for (const json& t : s["tensors"]) w = std::max(w, t["name"].get<std::string>().size());
    w = std::min<size_t>(w, 64);
    add_line(o, "\ntensors");
    add_line(o, "  {:<{}}  {:<8} {:<24} {:>12}", "name", w, "type", "shape", "bytes");
    for (const json& t : s["tensors"]) {
      std::string shape;
      for (const json& d : t["shape"]) shape += (shape.empty() ? "" : " x ") + std::to_string(d.get<uint64_t>());
      add_line(o, "  {:<{}}  {:<8} {:<24} {:>12}", short_value(t["name"], 64), w, t["type"].get<std::string>(), shape,
           t["bytes"].get<uint64_t>());
    }
    add_line(o, "\ntotals by type");
    add_line(o, "  {:<8} {:>8} {:>14} {:>14} {:>12}", "type", "tensors", "elements", "bytes", "");
    for (const json& t : s["totals_by_type"])
      add_line(o, "  {:<8} {:>8} {:>14} {:>14} {:>12}", t["type"].get<std::string>(), t["tensors"].get<uint64_t>(),
           t["elements"].get<uint64_t>(), t["bytes"].get<uint64_t>(), human_bytes(t["bytes"]));
    add_line(o, "  {:<8} {:>8} {:>14} {:>14} {:>12}", "all", tot["tensors"].get<uint64_t>(), tot["elements"].get<uint64_t>(),
         tot["bytes"].get<uint64_t>(), human_bytes(tot["bytes"]));
  }
  if (!s["experts"].is_null()) {
    const json& e = s["experts"];
    add_line(o, "\nexperts       {} per layer, {} used per token; {} in expert tensors ({:.1f}% of the weights)",
         e["count"].is_null() ? "?" : std::to_string(e["count"].get<uint64_t>()),
         e["used"].is_null() ? "?" : std::to_string(e["used"].get<uint64_t>()), human_bytes(e["bytes"]),
         100.0 * e["share_of_tensor_bytes"].get<double>());
    add_line(o, "  {:>5} {:>14} {:>12} {:>14}", "layer", "bytes", "", "per expert");
    for (const json& l : e["layers"])
      add_line(o, "  {:>5} {:>14} {:>12} {:>14}", l["layer"].get<long>(), l["bytes"].get<uint64_t>(),
           human_bytes(l["bytes"]),
           l["bytes_per_expert"].is_null() ? std::string("-") : std::to_string(l["bytes_per_expert"].get<uint64_t>()));
  }
  return o;
}

}  // namespace strata::gguf
