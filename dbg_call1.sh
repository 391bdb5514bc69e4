#!/usr/bin/env bash
set -uo pipefail
bash scripts/device-quick.sh
S=/tmp/b/strata; nxt=/tmp/next.gguf
$S mkmodel -o $nxt --preset qwen3-next-80b-a3b --layers 12 --repeat-layers --format Q4_K --vocab-from .carry/fix/vocab/ggml-vocab-qwen2.gguf > /dev/null
for a in "100% -p 512 -n 64" "25% -p 512 -n 32"; do set -- $a
  timeout 90 $S bench -m $nxt --backend cuda --expert-cache $1 --adapt-every 0 ${@:2} 2>&1 | grep -v '^$' >> /tmp/r/next.txt; done
grep -E "^tg|^pp|host work|stream" /tmp/r/next.txt
tar -C /tmp -czf $OUT/results.tgz r
