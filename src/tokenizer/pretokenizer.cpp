#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "common/error.h"

namespace strata::tokenizer {

namespace {

// The split patterns, as llama.cpp (llama-vocab.cpp) uses them for each tokenizer.ggml.pre. The
// case-insensitive contractions "(?i:'s|...)" of the original tokenizer.json patterns are spelled
// out as character classes there; we keep that spelling so both engines split identically.
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen3.5: letters may carry combining marks (\p{M}).
constexpr const char* kQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Llama 3: digits in groups of up to three.
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

// DeepSeek LLM (V1/V2): explicit letter ranges (the tokenizer.json of the model spells them out).
constexpr const char* kDeepseekLlmLetters =
    "\\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF"
    "\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03F5"
    "\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA"
    "\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45"
    "\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE"
    "\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC"
    "\u2102\u2107\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139"
    "\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3"
    "\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06"
    "\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3"
    "\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF"
    "\U0001E900-\U0001E943]+";
constexpr const char* kDeepseekLlmPunct =
    "\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+";
constexpr const char* kDeepseekLlmCjk = "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+";

// DeepSeek V3: digits in groups of up to three, CJK runs, then a letters/punctuation pattern.
constexpr const char* kDeepseekV3Cjk = "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+";
constexpr const char* kDeepseekV3Main =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-4o / o200k (gpt-oss, Llama 4): PCRE2 has the Unicode classes the original pattern uses, so
// it is used as written in tokenizer.json.
constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Kimi K2 (tokenization_kimi.py's pat_str): o200k with Han runs split off. Its class intersection
// "[...&&[^\p{Han}]]" (Rust regex syntax) is written for PCRE2 as a negative lookahead per character.
#define KIMI_UPPER R"((?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]))"
#define KIMI_LOWER R"((?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}]))"
#define KIMI_CONTRACTION R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
constexpr const char* kKimiK2 =
    R"([\p{Han}]+|[^\r\n\p{L}\p{N}]?)" KIMI_UPPER "*" KIMI_LOWER "+" KIMI_CONTRACTION
    R"(|[^\r\n\p{L}\p{N}]?)" KIMI_UPPER "+" KIMI_LOWER "*" KIMI_CONTRACTION
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
#undef KIMI_UPPER
#undef KIMI_LOWER
#undef KIMI_CONTRACTION

struct Family {
  std::vector<const char*> patterns;
  bool ignore_merges = false;
  bool default_add_bos = false;
};

// tokenizer.ggml.pre -> family. Aliases follow llama.cpp's mapping of the same names.
const std::map<std::string, Family, std::less<>>& families() {
  static const std::map<std::string, Family, std::less<>> m = [] {
    std::map<std::string, Family, std::less<>> r;
    const Family qwen2{{kQwen2}};
    const Family llama3{{kLlama3}, /*ignore_merges=*/true, /*default_add_bos=*/true};
    const Family deepseek_llm{{"[\r\n]", kDeepseekLlmLetters, kDeepseekLlmPunct, "\\s+$",
                               kDeepseekLlmCjk, "\\p{N}+"}};
    const Family deepseek_v3{{"\\p{N}{1,3}", kDeepseekV3Cjk, kDeepseekV3Main}};
    const Family gpt4o{{kGpt4o}};
    for (const char* n : {"qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", "grok-2"}) r[n] = qwen2;
    r["qwen35"] = Family{{kQwen35}};
    for (const char* n : {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"}) r[n] = llama3;
    for (const char* n : {"dbrx", "smaug-bpe"}) r[n] = Family{{kLlama3}};
    r["deepseek-llm"] = deepseek_llm;
    for (const char* n : {"deepseek-v3", "hunyuan-dense"}) r[n] = deepseek_v3;
    r["deepseek-coder"] = Family{{"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+",
                                  "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+", "\\p{N}"}};
    for (const char* n : {"gpt-4o", "llama4", "minimax-m2"}) r[n] = gpt4o;
    r["kimi-k2"] = Family{{kKimiK2}};
    for (const char* n : {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                          "jina-v2-de", "mpt", "olmo", "jais", "trillion"})
      r[n] = Family{{kGpt2}};
    r["default"] = Family{{"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"}};
    return r;
  }();
  return m;
}

// Per-thread PCRE2 scratch: match data (one pair: only the whole match is used) and a JIT stack
// larger than the 32 KiB default so that long runs of one class never fail for lack of stack.
struct MatchScratch {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* mctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchScratch() {
    if (!md || !mctx || !jit_stack) throw std::bad_alloc();
    pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(mctx);
    pcre2_match_data_free(md);
  }
};
MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof buf);
  return n < 0 ? fmt::format("PCRE2 error {}", code) : std::string(reinterpret_cast<char*>(buf));
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  explicit Regex(const char* pattern) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    // UTF + UCP: \s \p{..} are Unicode-aware; MATCH_INVALID_UTF: ill-formed input is searched
    // (never matched) instead of rejected; DOLLAR_ENDONLY: '$' is the end of the piece as in
    // ECMAScript, not "before a final newline".
    const uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED, opts, &err,
                         &err_off, nullptr);
    if (!code)
      fail("pre-tokenizer regex does not compile at offset {}: {}", err_off, pcre2_message(err));
    // Without JIT (e.g. an architecture PCRE2 has no JIT for) the interpreter gives the same result.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  }
  ~Regex() { pcre2_code_free(code); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
};

PreTokenizer::PreTokenizer(std::string_view name) : name_(name) {
  const auto& fam = families();
  auto it = fam.find(name);
  if (it == fam.end()) {
    std::string known;
    for (const auto& [n, f] : fam) known += (known.empty() ? "" : ", ") + n;
    fail("unsupported pre-tokenizer tokenizer.ggml.pre = '{}' (supported: {})", name, known);
  }
  ignore_merges_ = it->second.ignore_merges;
  default_add_bos_ = it->second.default_add_bos;
  // Compiled regexes are immutable and shared between tokenizers of the same family.
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Regex>, std::less<>> cache;
  std::lock_guard lock(mu);
  for (const char* p : it->second.patterns) {
    auto& slot = cache[p];
    if (!slot) slot = std::make_shared<const Regex>(p);
    regexes_.push_back(slot);
  }
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

std::vector<std::string> PreTokenizer::supported_names() {
  std::vector<std::string> r;
  for (const auto& [n, f] : families()) r.push_back(n);
  return r;
}

bool PreTokenizer::is_supported(std::string_view name) { return families().count(name) > 0; }

void PreTokenizer::split(std::string_view text, std::vector<Piece>& out) const {
  const size_t first = out.size();
  if (text.empty()) return;
  if (text.size() > UINT32_MAX) fail("text of {} bytes is too long to tokenize", text.size());
  out.push_back({0, static_cast<uint32_t>(text.size())});
  MatchScratch& s = scratch();
  std::vector<Piece> next;
  for (const auto& re : regexes_) {
    next.clear();
    for (size_t k = first; k < out.size(); ++k) {
      const Piece chunk = out[k];
      // Each chunk is its own subject: lookaheads and '$' do not see past it (as in llama.cpp).
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + chunk.offset);
      const PCRE2_SIZE len = chunk.length;
      PCRE2_SIZE pos = 0, last = 0;
      while (pos < len) {
        const int rc = pcre2_match(re->code, subject, len, pos, 0, s.md, s.mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) fail("pre-tokenizer '{}': regex match failed: {}", name_, pcre2_message(rc));
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.md);
        const PCRE2_SIZE ms = ov[0], me = ov[1];
        if (ms > last) next.push_back({chunk.offset + uint32_t(last), uint32_t(ms - last)});
        if (me > ms) {
          next.push_back({chunk.offset + uint32_t(ms), uint32_t(me - ms)});
          last = pos = me;
        } else {
          // An empty match (none of our patterns has one) adds nothing; step over one character.
          last = ms;
          pos = ms + 1;
          while (pos < len && (subject[pos] & 0xC0) == 0x80) ++pos;
        }
      }
      if (last < len) next.push_back({chunk.offset + uint32_t(last), uint32_t(len - last)});
    }
    out.resize(first);
    out.insert(out.end(), next.begin(), next.end());
  }
}

}  // namespace strata::tokenizer
