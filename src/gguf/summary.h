#pragma once
// What `strata inspect` shows about a GGUF file, as one JSON document (the stable, scriptable form;
// field names are documented in README.md under `strata inspect`) and as text rendered from it.
#include <nlohmann/json.hpp>
#include <string>

#include "gguf/gguf.h"

namespace strata::gguf {

inline constexpr const char* kInspectSchema = "strata-inspect/1";

// llama.cpp's name for a general.file_type id ("Q4_K_M" for 15); empty when unknown.
std::string_view file_type_name(uint32_t id);

// A metadata value as JSON: numbers, bools, strings (invalid UTF-8 is replaced when dumped), arrays.
// Arrays longer than max_elems keep their first max_elems elements (0: no limit).
nlohmann::json value_to_json(const Value& v, size_t max_elems = 0);

nlohmann::json summarize(const File& f);
std::string render_text(const nlohmann::json& summary);
// JSON text that never throws on invalid UTF-8 from the file (bytes are replaced by U+FFFD).
std::string dump_json(const nlohmann::json& j, int indent = 2);

}  // namespace strata::gguf
