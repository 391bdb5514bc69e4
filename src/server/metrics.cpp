#include "server/metrics.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace strata::server {

uint64_t process_rss_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long size = 0, resident = 0;
  int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  if (n != 2) return 0;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

namespace {
const char* kOutcomeNames[] = {"ok", "client_error", "rejected", "server_error", "cancelled"};
const ApiKind kKinds[] = {ApiKind::ChatCompletions, ApiKind::Completions, ApiKind::AnthropicMessages};

double hit_rate(const BackendStats& bs) {
  return bs.expert_cache_lookups ? double(bs.expert_cache_hits) / double(bs.expert_cache_lookups) : 0.0;
}

// Prometheus label values escape backslash, quote and newline.
std::string label(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') { o += "\\n"; continue; }
    o += c;
  }
  return o;
}
}  // namespace

std::string Metrics::render_prometheus(const BackendInfo& info, const BackendStats& bs,
                                       const SchedulerSnapshot& s) const {
  std::string o;
  auto metric = [&](const char* name, const char* type, const char* help) {
    o += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  auto value = [&](const char* name, double v) { o += fmt::format("{} {}\n", name, v); };

  metric("strata_requests_total", "counter", "Generation requests by endpoint and outcome.");
  for (size_t k = 0; k < 3; ++k)
    for (size_t oc = 0; oc < kOutcomes; ++oc)
      o += fmt::format("strata_requests_total{{endpoint=\"{}\",outcome=\"{}\"}} {}\n",
                       api_kind_name(kKinds[k]), kOutcomeNames[oc], requests_[k][oc].load());
  metric("strata_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.");
  value("strata_prompt_tokens_total", double(prompt_tokens.load()));
  metric("strata_prompt_tokens_evaluated_total", "counter", "Prompt tokens run through the model.");
  value("strata_prompt_tokens_evaluated_total", double(prompt_tokens_evaluated.load()));
  metric("strata_prompt_tokens_reused_total", "counter", "Prompt tokens whose KV was reused.");
  value("strata_prompt_tokens_reused_total", double(prompt_tokens_reused.load()));
  metric("strata_generated_tokens_total", "counter", "Tokens generated.");
  value("strata_generated_tokens_total", double(generated_tokens.load()));
  metric("strata_decode_steps_total", "counter", "Batched decode steps.");
  value("strata_decode_steps_total", double(decode_steps.load()));
  metric("strata_decode_batch_tokens_total", "counter", "Sum of decode batch sizes.");
  value("strata_decode_batch_tokens_total", double(decode_batch_tokens.load()));
  metric("strata_client_disconnects_total", "counter", "Requests cancelled by a client disconnect.");
  value("strata_client_disconnects_total", double(disconnects.load()));
  metric("strata_parked_evictions_total", "counter", "Parked conversations evicted (LRU).");
  value("strata_parked_evictions_total", double(parked_evictions.load()));
  metric("strata_unauthorized_total", "counter", "Requests refused for a missing or wrong API key.");
  value("strata_unauthorized_total", double(http_unauthorized.load()));

  metric("strata_decode_tokens_per_second", "gauge", "Generated tokens per second (last 10 s).");
  value("strata_decode_tokens_per_second", s.decode_tok_s);
  metric("strata_prefill_tokens_per_second", "gauge", "Prompt tokens evaluated per second (last 10 s).");
  value("strata_prefill_tokens_per_second", s.prefill_tok_s);
  metric("strata_queue_depth", "gauge", "Requests waiting for a sequence.");
  value("strata_queue_depth", double(s.queue_depth));
  metric("strata_queue_capacity", "gauge", "Most requests that may wait (--max-queue).");
  value("strata_queue_capacity", double(s.max_queue));
  metric("strata_sequences_running", "gauge", "Sequences generating.");
  value("strata_sequences_running", double(s.running));
  metric("strata_sequences_parallel", "gauge", "Most sequences generating at once (--parallel).");
  value("strata_sequences_parallel", double(s.parallel));
  metric("strata_sequences_parked", "gauge", "Idle conversations kept for reuse.");
  value("strata_sequences_parked", double(s.parked));
  metric("strata_kv_bytes", "gauge", "KV memory held by sequences.");
  o += fmt::format("strata_kv_bytes{{state=\"running\"}} {}\n", s.kv_bytes_running);
  o += fmt::format("strata_kv_bytes{{state=\"parked\"}} {}\n", s.kv_bytes_parked);
  metric("strata_kv_parked_budget_bytes", "gauge", "Memory budget for parked conversations.");
  value("strata_kv_parked_budget_bytes", double(s.kv_budget_parked));
  metric("strata_kv_tokens", "gauge", "Tokens held in KV by all sequences.");
  value("strata_kv_tokens", double(s.tokens_in_kv));
  metric("strata_expert_cache_bytes", "gauge", "Expert cache capacity (0: no expert cache, e.g. CPU).");
  value("strata_expert_cache_bytes", double(bs.expert_cache_bytes));
  metric("strata_expert_cache_used_bytes", "gauge", "Expert cache bytes holding experts.");
  value("strata_expert_cache_used_bytes", double(bs.expert_cache_used));
  metric("strata_expert_cache_hits_total", "counter", "Expert lookups served by the cache.");
  value("strata_expert_cache_hits_total", double(bs.expert_cache_hits));
  metric("strata_expert_cache_lookups_total", "counter", "Expert lookups.");
  value("strata_expert_cache_lookups_total", double(bs.expert_cache_lookups));
  metric("strata_expert_cache_direct_total", "counter",
         "Expert lookups that missed the cache and were read by the GPU from host memory (--decode-direct).");
  value("strata_expert_cache_direct_total", double(bs.expert_cache_direct));
  metric("strata_expert_cache_hit_rate", "gauge", "Hits / lookups (0 when there are none).");
  value("strata_expert_cache_hit_rate", hit_rate(bs));
  metric("strata_process_resident_bytes", "gauge", "Resident memory of the server process.");
  value("strata_process_resident_bytes", double(process_rss_bytes()));
  metric("strata_scheduler_heartbeat_age_seconds", "gauge", "Time since the scheduler loop last ran.");
  value("strata_scheduler_heartbeat_age_seconds", s.heartbeat_age_s);
  metric("strata_uptime_seconds", "gauge", "Seconds since the server started.");
  value("strata_uptime_seconds",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  metric("strata_model_info", "gauge", "The model served (value 1).");
  o += fmt::format("strata_model_info{{model=\"{}\",device=\"{}\",n_ctx=\"{}\"}} 1\n",
                   label(info.model_id), label(info.device), info.n_ctx);
  return o;
}

nlohmann::json Metrics::stats_json(const BackendInfo& info, const BackendStats& bs,
                                   const SchedulerSnapshot& s) const {
  uint64_t req = 0;
  for (auto& k : requests_)
    for (auto& c : k) req += c.load();
  return {
      {"model", info.model_id},
      {"device", info.device},
      {"n_ctx", info.n_ctx},
      {"requests_total", req},
      {"generated_tokens_total", generated_tokens.load()},
      {"prompt_tokens_total", prompt_tokens.load()},
      {"prompt_tokens_reused_total", prompt_tokens_reused.load()},
      {"decode_tok_s", s.decode_tok_s},
      {"prefill_tok_s", s.prefill_tok_s},
      {"queue_depth", s.queue_depth},
      {"running", s.running},
      {"parallel", s.parallel},
      {"parked", s.parked},
      {"kv_bytes_running", s.kv_bytes_running},
      {"kv_bytes_parked", s.kv_bytes_parked},
      {"kv_budget_parked", s.kv_budget_parked},
      {"expert_cache_bytes", bs.expert_cache_bytes},
      {"expert_cache_used", bs.expert_cache_used},
      {"expert_cache_hit_rate", hit_rate(bs)},
      {"expert_cache_direct", bs.expert_cache_direct},
      {"weights_bytes", bs.weights_bytes},
      {"rss_bytes", process_rss_bytes()},
      {"heartbeat_age_s", s.heartbeat_age_s},
      {"draining", s.draining},
  };
}

}  // namespace strata::server
