// Tokenizer speed on the real Qwen2/3 vocabulary (151,936 tokens, 151,387 merges):
//   BM_LoadVocab      Tokenizer::from_gguf, against BM_OpenVocabFile (the GGUF parse alone) as baseline
//   BM_Tokenize       ~4 KB of mixed text (the llama.cpp test strings, repeated), against
//   BM_TokenizeReference  the same text through the plain reference BPE (tests/) as baseline
//   BM_StreamDecode   the ids of that text through StreamDecoder, one at a time
// Needs ../shared/fixtures (or STRATA_FIXTURES_DIR); reports an error and exits when it is missing.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "../tests/tokenizer_reference_bpe.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

using namespace strata;
using namespace strata::tokenizer;

namespace {

std::string vocab_path() {
  const char* env = std::getenv("STRATA_FIXTURES_DIR");
  return std::string(env ? env : "../shared/fixtures") + "/vocab/ggml-vocab-qwen2.gguf";
}

std::string sample_text() {
  std::ifstream in(vocab_path() + ".inp", std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string one = ss.str(), all;
  while (all.size() < 4096) all += one;
  return all.substr(0, 4096);
}

struct Fixture {
  gguf::File file = gguf::File::open(vocab_path());
  Tokenizer tok = Tokenizer::from_gguf(file);
  std::string text = sample_text();
};
Fixture& fixture() {
  static Fixture f;
  return f;
}

void BM_OpenVocabFile(benchmark::State& st) {
  for (auto _ : st) benchmark::DoNotOptimize(gguf::File::open(vocab_path()));
}
void BM_LoadVocab(benchmark::State& st) {
  for (auto _ : st) benchmark::DoNotOptimize(Tokenizer::from_gguf(gguf::File::open(vocab_path())));
}
void BM_Tokenize(benchmark::State& st) {
  auto& f = fixture();
  size_t n = 0;
  for (auto _ : st) n = f.tok.tokenize(f.text).size();
  st.SetBytesProcessed(int64_t(st.iterations()) * f.text.size());
  st.counters["tokens"] = double(n);
}
void BM_TokenizeReference(benchmark::State& st) {
  auto& f = fixture();
  reference::ReferenceBpe ref(f.file, f.tok);
  for (auto _ : st) benchmark::DoNotOptimize(ref.encode(f.text));
  st.SetBytesProcessed(int64_t(st.iterations()) * f.text.size());
}
void BM_StreamDecode(benchmark::State& st) {
  auto& f = fixture();
  const auto ids = f.tok.tokenize(f.text);
  for (auto _ : st) {
    StreamDecoder dec(f.tok);
    size_t bytes = 0;
    for (TokenId id : ids) bytes += dec.push(id).size();
    benchmark::DoNotOptimize(bytes + dec.flush().size());
  }
  st.SetItemsProcessed(int64_t(st.iterations()) * ids.size());
}

}  // namespace

BENCHMARK(BM_OpenVocabFile)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoadVocab)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Tokenize)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TokenizeReference)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_StreamDecode)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
