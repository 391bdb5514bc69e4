// Jinja tokenizer: data / tag begin / expression tokens / tag end, following jinja2 3.1 lexer.py.
#include "tokenizer/jinja/lexer.h"

#include <algorithm>
#include <charconv>

#include "tokenizer/jinja/value.h"

namespace strata::jinja {
namespace {

// Python's regex \s and str.strip() on str: Unicode whitespace, not only ASCII.
// Byte length of the whitespace code point starting at s[p], or 0.
size_t ws_at(std::string_view s, size_t p) {
  auto c = static_cast<uint8_t>(s[p]);
  if (c < 0x80) return py_isspace(c) ? 1 : 0;
  size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
  if (len == 1 || p + len > s.size()) return 0;
  auto cps = utf8_decode(s.substr(p, len));
  return cps.size() == 1 && py_isspace(cps[0]) ? len : 0;
}
// Length of `text` without its trailing whitespace.
size_t rstrip_len(std::string_view text) {
  size_t e = text.size();
  while (e > 0) {
    size_t b = e - 1;
    while (b > 0 && (static_cast<uint8_t>(text[b]) & 0xC0) == 0x80) --b;
    if (ws_at(text, b) != e - b) break;
    e = b;
  }
  return e;
}
bool all_ws(std::string_view text) { return rstrip_len(text) == 0; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {
    line_starts_.push_back(0);
    for (size_t k = 0; k < src_.size(); ++k)
      if (src_[k] == '\n') line_starts_.push_back(k + 1);
  }

  std::vector<Token> run() {
    const size_t n = src_.size();
    bool line_starting = true;
    while (pos_ < n) {
      size_t k = pos_;
      while (true) {
        k = src_.find('{', k);
        if (k == std::string::npos || k + 1 >= n) {
          k = std::string::npos;
          break;
        }
        char c = src_[k + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++k;
      }
      if (k == std::string::npos) {
        emit_data(pos_, src_.substr(pos_));
        pos_ = n;
        break;
      }
      const char kind = src_[k + 1];
      size_t after = k + 2;
      char sign = 0;
      if (after < n && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      std::string text = src_.substr(pos_, k - pos_);
      if (sign == '-') {
        text.resize(rstrip_len(text));
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks: blocks and comments, not variables
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            all_ws(std::string_view(text).substr(l_pos)))
          text.resize(l_pos);
      }
      emit_data(pos_, std::move(text));
      size_t raw_end = kind == '%' ? match_raw_begin(after) : std::string::npos;
      if (raw_end != std::string::npos) {
        pos_ = raw_end;
        line_starting = lex_raw_body();
      } else if (kind == '#') {
        pos_ = after;
        line_starting = lex_comment(k);
      } else {
        push(kind == '{' ? Tok::VarBegin : Tok::BlockBegin, k, "");
        pos_ = after;
        line_starting = lex_tag(kind == '%', k);
      }
    }
    push(Tok::Eof, n, "");
    return std::move(out_);
  }

 private:
  std::string src_;
  size_t pos_ = 0;
  std::vector<size_t> line_starts_;
  std::vector<Token> out_;
  mutable size_t cur_pos_ = 0;  // where(): cursor over the source
  mutable int cur_line_ = 1, cur_col_ = 1;

  [[noreturn]] void fail(size_t at, const std::string& msg) const {
    auto [line, col] = where(at);
    throw TemplateError("template line " + std::to_string(line) + " col " + std::to_string(col) + ": " + msg);
  }
  // Line and column (in code points) of byte offset `at`. Tokens come in increasing order, so the
  // common case advances a cursor (linear overall, even for one very long line).
  std::pair<int, int> where(size_t at) const {
    if (at >= cur_pos_) {
      for (; cur_pos_ < at && cur_pos_ < src_.size(); ++cur_pos_) {
        char c = src_[cur_pos_];
        if (c == '\n') {
          ++cur_line_;
          cur_col_ = 1;
        } else if ((static_cast<uint8_t>(c) & 0xC0) != 0x80) {
          ++cur_col_;
        }
      }
      if (at == cur_pos_) return {cur_line_, cur_col_};
    }
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), at);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    size_t start = line_starts_[line - 1];
    return {static_cast<int>(line), static_cast<int>(utf8_length(std::string_view(src_).substr(start, at - start)) + 1)};
  }
  void push(Tok t, size_t at, std::string text) {
    Token tok;
    tok.type = t;
    tok.text = std::move(text);
    auto [line, col] = where(at);
    tok.line = line;
    tok.col = col;
    out_.push_back(std::move(tok));
  }
  void emit_data(size_t at, std::string text) {
    if (!text.empty()) push(Tok::Data, at, std::move(text));
  }
  size_t skip_ws(size_t p) const {
    while (p < src_.size()) {
      size_t n = ws_at(src_, p);
      if (n == 0) break;
      p += n;
    }
    return p;
  }
  // After "{%" (+ sign): `\s*raw\s*(-%}\s*|%})`; returns the end of the match or npos.
  size_t match_raw_begin(size_t p) const {
    p = skip_ws(p);
    if (src_.compare(p, 3, "raw") != 0) return std::string::npos;
    p = skip_ws(p + 3);
    if (src_.compare(p, 3, "-%}") == 0) return skip_ws(p + 3);
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return std::string::npos;
  }
  // Raw text up to `{%(-|+)?\s*endraw\s*(+%}|-%}\s*|%}\n?)`. Returns line_starting.
  bool lex_raw_body() {
    size_t p = pos_;
    while (true) {
      size_t k = src_.find("{%", p);
      if (k == std::string::npos) fail(pos_, "missing end of raw directive");
      size_t q = k + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = skip_ws(q);
      if (src_.compare(q, 6, "endraw") != 0) {
        p = k + 2;
        continue;
      }
      q = skip_ws(q + 6);
      size_t end;
      if (src_.compare(q, 3, "+%}") == 0) {
        end = q + 3;
      } else if (src_.compare(q, 3, "-%}") == 0) {
        end = skip_ws(q + 3);
      } else if (src_.compare(q, 2, "%}") == 0) {
        end = q + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;
      } else {
        p = k + 2;
        continue;
      }
      std::string text = src_.substr(pos_, k - pos_);
      if (sign == '-') {
        text.resize(rstrip_len(text));
      } else if (sign != '+') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 && l_pos < text.size() && all_ws(std::string_view(text).substr(l_pos)))
          text.resize(l_pos);
      }
      emit_data(pos_, std::move(text));
      pos_ = end;
      return src_[end - 1] == '\n';
    }
  }
  // Comment body up to `+#}`, `-#}\s*` or `#}\n?`. Returns line_starting.
  bool lex_comment(size_t begin) {
    size_t e = src_.find("#}", pos_);
    if (e == std::string::npos) fail(begin, "missing end of comment tag");
    size_t end = e + 2;
    if (e > pos_ && src_[e - 1] == '-') {
      end = skip_ws(end);
    } else if (e > pos_ && src_[e - 1] == '+') {
      // keep what follows
    } else if (end < src_.size() && src_[end] == '\n') {
      ++end;  // trim_blocks
    }
    pos_ = end;
    return src_[end - 1] == '\n';
  }

  // Expression tokens up to the closing tag (only when brackets are balanced). Returns line_starting.
  bool lex_tag(bool block, size_t begin) {
    std::vector<char> balance;
    const size_t n = src_.size();
    while (true) {
      if (pos_ >= n) fail(begin, block ? "unexpected end of template: missing '%}'" : "unexpected end of template: missing '}}'");
      if (balance.empty()) {
        if (block) {
          if (src_.compare(pos_, 3, "+%}") == 0) {
            push(Tok::BlockEnd, pos_, "");
            pos_ += 3;
            return false;
          }
          if (src_.compare(pos_, 3, "-%}") == 0) {
            push(Tok::BlockEnd, pos_, "");
            size_t start = pos_;
            pos_ = skip_ws(pos_ + 3);
            return src_[pos_ - 1] == '\n' && pos_ > start + 3;
          }
          if (src_.compare(pos_, 2, "%}") == 0) {
            push(Tok::BlockEnd, pos_, "");
            pos_ += 2;
            if (pos_ < n && src_[pos_] == '\n') {
              ++pos_;
              return true;
            }
            return false;
          }
        } else {
          if (src_.compare(pos_, 3, "-}}") == 0) {
            push(Tok::VarEnd, pos_, "");
            size_t start = pos_;
            pos_ = skip_ws(pos_ + 3);
            return src_[pos_ - 1] == '\n' && pos_ > start + 3;
          }
          if (src_.compare(pos_, 2, "}}") == 0) {
            push(Tok::VarEnd, pos_, "");
            pos_ += 2;
            return false;
          }
        }
      }
      char c = src_[pos_];
      if (ws_at(src_, pos_)) {
        pos_ = skip_ws(pos_);
        continue;
      }
      if (is_digit(c)) {
        lex_number();
        continue;
      }
      if (is_name_start(c)) {
        size_t e = pos_;
        while (e < n && is_name_char(src_[e])) ++e;
        push(Tok::Name, pos_, src_.substr(pos_, e - pos_));
        pos_ = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        lex_string();
        continue;
      }
      static const char* two[] = {"//", "**", "==", "!=", ">=", "<="};
      bool matched = false;
      for (const char* op : two)
        if (src_.compare(pos_, 2, op) == 0) {
          push(Tok::Op, pos_, op);
          pos_ += 2;
          matched = true;
          break;
        }
      if (matched) continue;
      if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) != std::string_view::npos) {
        if (c == '(' || c == '[' || c == '{') {
          if (balance.size() >= 256) fail(pos_, "brackets nested too deeply");
          balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
        } else if (c == ')' || c == ']' || c == '}') {
          if (balance.empty()) fail(pos_, std::string("unexpected '") + c + "'");
          if (balance.back() != c)
            fail(pos_, std::string("unexpected '") + c + "', expected '" + balance.back() + "'");
          balance.pop_back();
        }
        push(Tok::Op, pos_, std::string(1, c));
        ++pos_;
        continue;
      }
      fail(pos_, "unexpected char " + py_str_repr(src_.substr(pos_, 1)));
    }
  }

  void lex_number() {
    const size_t n = src_.size();
    size_t p = pos_;
    auto digits = [&](size_t q, auto pred) {  // (_?d)+ style run starting with a digit; returns end
      size_t e = q;
      while (e < n && (pred(src_[e]) || (src_[e] == '_' && e + 1 < n && pred(src_[e + 1]) && e > q))) ++e;
      return e;
    };
    // float: (\d+_)*\d+ ( (\.(\d+_)*\d+)? e[+-]?(\d+_)*\d+ | \.(\d+_)*\d+ ), not right after a '.'
    bool after_dot = p > 0 && src_[p - 1] == '.';
    if (!after_dot) {
      size_t e = digits(p, is_digit);
      size_t q = e;
      bool has_frac = false;
      if (q + 1 < n && src_[q] == '.' && is_digit(src_[q + 1])) {
        q = digits(q + 1, is_digit);
        has_frac = true;
      }
      bool has_exp = false;
      if (q < n && (src_[q] == 'e' || src_[q] == 'E')) {
        size_t r = q + 1;
        if (r < n && (src_[r] == '+' || src_[r] == '-')) ++r;
        if (r < n && is_digit(src_[r])) {
          q = digits(r, is_digit);
          has_exp = true;
        }
      }
      if (has_frac || has_exp) {
        std::string lit;
        for (size_t k = p; k < q; ++k)
          if (src_[k] != '_') lit += src_[k];
        Token t;
        t.type = Tok::Float;
        t.text = lit;
        t.fval = std::strtod(lit.c_str(), nullptr);
        auto [line, col] = where(p);
        t.line = line, t.col = col;
        out_.push_back(t);
        pos_ = q;
        return;
      }
    }
    int base = 10;
    size_t q = p, start = p;
    char c1 = p + 1 < n ? static_cast<char>(src_[p + 1] | 0x20) : 0;
    auto is_hex = [](char c) { return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); };
    auto is_oct = [](char c) { return c >= '0' && c <= '7'; };
    auto is_bin = [](char c) { return c == '0' || c == '1'; };
    auto prefixed = [&](auto pred) {  // 0x(_?h)+
      size_t e = p + 2;
      size_t last = e;
      while (e < n) {
        if (src_[e] == '_' && e + 1 < n && pred(src_[e + 1])) e += 2, last = e;
        else if (pred(src_[e])) ++e, last = e;
        else break;
      }
      return last;
    };
    if (src_[p] == '0' && c1 == 'x' && p + 2 < n && (is_hex(src_[p + 2]) || src_[p + 2] == '_')) {
      base = 16, start = p + 2, q = prefixed(is_hex);
    } else if (src_[p] == '0' && c1 == 'o' && p + 2 < n && (is_oct(src_[p + 2]) || src_[p + 2] == '_')) {
      base = 8, start = p + 2, q = prefixed(is_oct);
    } else if (src_[p] == '0' && c1 == 'b' && p + 2 < n && (is_bin(src_[p + 2]) || src_[p + 2] == '_')) {
      base = 2, start = p + 2, q = prefixed(is_bin);
    } else if (src_[p] == '0') {
      q = p + 1;  // 0(_?0)*
      while (q < n && (src_[q] == '0' || (src_[q] == '_' && q + 1 < n && src_[q + 1] == '0'))) q += src_[q] == '_' ? 2 : 1;
    } else {
      q = digits(p, is_digit);
    }
    if (q <= start) fail(p, "invalid integer literal");
    std::string lit;
    for (size_t k = start; k < q; ++k)
      if (src_[k] != '_') lit += src_[k];
    int64_t v = 0;
    auto r = std::from_chars(lit.data(), lit.data() + lit.size(), v, base);
    if (r.ec != std::errc() || r.ptr != lit.data() + lit.size()) fail(p, "integer literal too large: " + lit);
    Token t;
    t.type = Tok::Int;
    t.text = src_.substr(p, q - p);
    t.ival = v;
    auto [line, col] = where(p);
    t.line = line, t.col = col;
    out_.push_back(t);
    pos_ = q;
  }

  void lex_string() {
    const size_t n = src_.size();
    char quote = src_[pos_];
    size_t p = pos_ + 1;
    while (p < n && src_[p] != quote) p += src_[p] == '\\' ? 2 : 1;
    if (p >= n) fail(pos_, std::string("unexpected char ") + (quote == '"' ? "'\"'" : "\"'\""));
    std::string body = src_.substr(pos_ + 1, p - pos_ - 1);
    push(Tok::String, pos_, unescape(body, pos_));
    pos_ = p + 1;
  }

  // Python's "unicode-escape" decoding, as jinja2 applies it to string literals.
  std::string unescape(const std::string& s, size_t at) const {
    std::string out;
    for (size_t k = 0; k < s.size(); ++k) {
      char c = s[k];
      if (c != '\\' || k + 1 >= s.size()) {
        out += c;
        continue;
      }
      char e = s[++k];
      auto hex = [&](int count) -> uint32_t {
        uint32_t v = 0;
        for (int d = 1; d <= count; ++d) {
          if (k + d >= s.size()) fail(at, "truncated escape in string literal");
          char h = s[k + d];
          int x = is_digit(h) ? h - '0' : ((h | 0x20) >= 'a' && (h | 0x20) <= 'f') ? (h | 0x20) - 'a' + 10 : -1;
          if (x < 0) fail(at, "truncated escape in string literal");
          v = v * 16 + static_cast<uint32_t>(x);
        }
        k += count;
        return v;
      };
      auto put = [&](uint32_t cp) {
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail(at, "invalid code point in string literal");
        utf8_append(out, cp);
      };
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': put(hex(2)); break;
        case 'u': put(hex(4)); break;
        case 'U': put(hex(8)); break;
        case 'N': fail(at, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int d = 0; d < 2 && k + 1 < s.size() && s[k + 1] >= '0' && s[k + 1] <= '7'; ++d)
              v = v * 8 + static_cast<uint32_t>(s[++k] - '0');
            put(v);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    return out;
  }
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  if (!utf8_valid(source)) throw TemplateError("template is not valid UTF-8");
  std::string src;
  src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      src += source[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();  // keep_trailing_newline=False
  return Lexer(std::move(src)).run();
}

}  // namespace strata::jinja
