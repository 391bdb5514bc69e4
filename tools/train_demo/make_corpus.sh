#!/usr/bin/env bash
# Builds the demo model's training text from Debian packages, deterministically.
#   tools/train_demo/make_corpus.sh [OUT_DIR]        (default build/demo-corpus, git-ignored)
# Writes OUT_DIR/train.txt and OUT_DIR/heldout.txt (every 100th document, counted over all sources:
# 1% held out). Documents: one Bible chapter, one fortune, one WordNet gloss. Sources and licences:
# tools/train_demo/README.md. Needs apt-get download (Debian 12 bookworm archive) and dpkg -x.
set -euo pipefail
export LC_ALL=C
OUT=${1:-build/demo-corpus}
mkdir -p "$OUT/deb"
OUT=$(cd "$OUT" && pwd)
cd "$OUT/deb"
PKGS="bible-kjv bible-kjv-text fortunes fortunes-min wordnet-base"
for p in $PKGS; do
  ls ${p}_*.deb >/dev/null 2>&1 || apt-get download "$p" >/dev/null
done
rm -rf root && mkdir root
for p in $PKGS; do dpkg -x ${p}_*.deb root; done
R=$OUT/deb/root
FS=$'\f'  # document separator line in docs.txt

{
  # 1) King James Bible (1611, public domain): one document per chapter, verse numbers dropped.
  "$R/usr/bin/bible" -p "$R/usr/lib" -l10000 "gen1:1-rev22:21" |
    awk -v fs="$FS" '
      /^$/ { next }
      /^[^ ]/ { if (n++) print fs; print; print ""; next }
      { sub(/^ +[0-9]+ /, ""); print }
      END { print fs }'
  # 2) fortune cookies (BSD fortune-mod data): one document per fortune; ASCII art files skipped.
  for f in "$R"/usr/share/games/fortunes/*; do
    case "$f" in *.dat|*.u8|*/art|*/ascii-art) continue ;; esac
    awk -v fs="$FS" '
      /^%$/ { if (body != "") print body fs; body = ""; next }
      { gsub(/[\001-\010\013-\037\177]/, ""); body = body $0 "\n" }
      END { if (body != "") print body fs }' "$f"
  done
  # 3) WordNet 3.0 glosses: "word (noun): gloss" one document each.
  for pos in noun verb adj adv; do
    grep -v '^  ' "$R/usr/share/wordnet/data.$pos" |
      awk -v fs="$FS" -v pos="$pos" '{
        i = index($0, " | "); if (!i) next
        w = $5; gsub(/_/, " ", w); sub(/\([a-z]+\)$/, "", w)
        g = substr($0, i + 3); sub(/ +$/, "", g)
        print w " (" pos "): " g; print fs }'
  done
} > "$OUT/docs.txt"

# Split: document k (0-based) goes to heldout.txt when k % 100 == 37, else to train.txt.
awk -v RS="$FS\n" -v train="$OUT/train.txt" -v held="$OUT/heldout.txt" '
  { sub(/\n+$/, ""); if ($0 == "") next
    if (k++ % 100 == 37) print $0 "\n" > held; else print $0 "\n" > train }
  END { printf "documents: %d\n", k > "/dev/stderr" }' "$OUT/docs.txt"
rm -f "$OUT/docs.txt"
wc -c "$OUT/train.txt" "$OUT/heldout.txt"
sha256sum "$OUT/train.txt" "$OUT/heldout.txt"
