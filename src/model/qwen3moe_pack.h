#pragma once
// Builds a qwen3moe GGUF from a training script's raw export (tools/train_demo/train.py): a JSON
// manifest (hparams, gpt2-style vocabulary, tensor table) plus raw little-endian blobs next to it.
// The metadata is laid out as in real Qwen3-MoE GGUFs (convert_hf_to_gguf.py): general.*, qwen3moe.*,
// tokenizer.ggml.* with <|endoftext|> as BOS/padding, <|im_end|> as EOS, no BOS added, and a ChatML
// chat template. Every field is validated; a bad manifest or blob is a strata::Error.
#include <string>

#include "gguf/writer.h"

namespace strata {

struct RawPackOptions {
  std::string name = "strata-demo-moe";  // general.name
  std::string license;                    // general.license (omitted when empty)
};

// manifest_path: the manifest.json; blob files are looked up in its directory.
gguf::Writer pack_qwen3moe_raw(const std::string& manifest_path, const RawPackOptions& opt = {});

// The ChatML template written to tokenizer.chat_template (Qwen's turn markup, no tool calls).
extern const char* const kChatMlTemplate;

}  // namespace strata
