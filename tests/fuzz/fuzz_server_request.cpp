// Fuzzes the HTTP request bodies of the generation endpoints: parsing + validation must either
// return a request or throw ApiError (never crash, never another exception), and everything it
// accepts must serialize back through the response writer and the text stream.
// Input: byte 0 picks the endpoint (chat / completions / messages), the rest is the body.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/api_request.h"
#include "server/api_response.h"
#include "server/text_stream.h"

using namespace strata::server;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  ApiKind kind = data[0] % 3 == 0 ? ApiKind::ChatCompletions
                 : data[0] % 3 == 1 ? ApiKind::Completions
                                    : ApiKind::AnthropicMessages;
  std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  GenerationRequest r;
  try {
    r = parse_generation_request(kind, body);
  } catch (const ApiError& e) {
    dump_json(error_body(kind, e));
    return 0;
  }
  // Feed the accepted text through a stop-string stream in small pieces, as tokens would come.
  TextStream ts(r.stop);
  std::string all = r.is_chat && !r.messages.empty() ? r.messages.back().content : r.prompt, out;
  for (size_t i = 0; i < all.size(); i += 3) out += ts.push(all.substr(i, 3));
  out += ts.flush();
  if (!ts.stopped() && out != all) __builtin_trap();  // nothing may be lost without a stop string
  ResponseWriter w(r, "m", 0, "id");
  Usage u{1, 2, 0};
  std::string s = w.stream_begin(u) + w.stream_delta(out) +
                  w.stream_end(ts.stopped() ? FinishReason::StopString : FinishReason::Eos,
                               ts.matched_stop(), u);
  dump_json(w.full(out, FinishReason::Length, "", u));
  return 0;
}
