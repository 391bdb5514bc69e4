#!/usr/bin/env python3
"""Trains strata's demo model: a small qwen3moe (the architecture of Qwen3-30B-A3B) on the corpus made by
make_corpus.sh, with a byte-level BPE tokenizer trained on the same text.

  PYTHONUNBUFFERED=1 python3 train.py --corpus DIR --out DIR [--minutes 5]

Writes to --out:
  manifest.json   hparams, GGUF tokenizer (tokens, types, merges), tensor table (GGUF names, ne order,
                  dtype, blob file + offset), held-out token ids, held-out perplexity per chunk, expert
                  usage on the held-out text, training log summary
  weights.N.bin   raw little-endian tensor data (f16 matrices, f32 norms and router), <= 15 MB each
The C++ side (`strata pack-raw`, src/cli/pack_raw.cpp) turns that into the F16 GGUF.

The model matches llama.cpp's / strata's qwen3moe graph exactly: RMSNorm (eps below) on the residual
before attention and MoE, per-head RMSNorm of Q and K before NeoX RoPE, GQA (query head h reads KV
head h / (n_head / n_head_kv)), causal softmax attention scaled by 1/sqrt(head_dim), router softmax over
all experts -> top-k -> weights renormalised to sum 1, SwiGLU experts down(silu(gate x) * up x),
final RMSNorm, tied output (token_embd used as output, as llama.cpp does when output.weight is absent).
"""
import argparse
import json
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# Qwen2's pre-tokenizer regex (tokenizer.json of Qwen2/Qwen3; llama.cpp pre "qwen2").
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

HP = dict(n_vocab=8192, n_embd=256, n_layer=6, n_head=6, n_head_kv=2, head_dim=64, n_expert=16,
          n_expert_used=2, n_ff_exp=256, rope_base=10000.0, rms_eps=1e-6, n_ctx=512)


def train_tokenizer(train_path, vocab_size):
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIALS), min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([train_path], trainer)
    return tok


def gguf_vocab(tok):
    """tokens / types / merges as GGUF gpt2-style arrays; specials appended as control tokens."""
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    tokens = [None] * len(vocab)
    for s, i in vocab.items():
        tokens[i] = s
    assert all(t is not None for t in tokens)
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    types = [1] * len(tokens) + [3] * len(SPECIALS)
    return tokens + SPECIALS, types, merges


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.w = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.w.float()).to(x.dtype)


def rope_neox(x, cos, sin):  # x [B, H, T, D]; rotates pairs (i, i + D/2)
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d].float(), x[..., d:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


class Block(nn.Module):
    def __init__(self, hp, dropout):
        super().__init__()
        E, H, Hk, D, X, Fd = hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim"], hp["n_expert"], hp["n_ff_exp"]
        self.H, self.Hk, self.D, self.k = H, Hk, D, hp["n_expert_used"]
        self.attn_norm = RMSNorm(E, hp["rms_eps"])
        self.wq = nn.Linear(E, H * D, bias=False)
        self.wk = nn.Linear(E, Hk * D, bias=False)
        self.wv = nn.Linear(E, Hk * D, bias=False)
        self.wo = nn.Linear(H * D, E, bias=False)
        self.q_norm = RMSNorm(D, hp["rms_eps"])
        self.k_norm = RMSNorm(D, hp["rms_eps"])
        self.ffn_norm = RMSNorm(E, hp["rms_eps"])
        self.router = nn.Linear(E, X, bias=False)
        s = 1.0 / math.sqrt(E)
        self.gate = nn.Parameter(torch.randn(X, Fd, E) * s)   # GGUF ffn_gate_exps ne [E, F, X]
        self.up = nn.Parameter(torch.randn(X, Fd, E) * s)     # GGUF ffn_up_exps   ne [E, F, X]
        self.down = nn.Parameter(torch.randn(X, E, Fd) / math.sqrt(Fd))  # ffn_down_exps ne [F, E, X]
        self.drop = nn.Dropout(dropout)

    def forward(self, x, cos, sin, stats=None):
        B, T, E = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(B, T, self.H, self.D)
        k = self.wk(h).view(B, T, self.Hk, self.D)
        v = self.wv(h).view(B, T, self.Hk, self.D).transpose(1, 2)
        q = rope_neox(self.q_norm(q).transpose(1, 2), cos, sin)
        k = rope_neox(self.k_norm(k).transpose(1, 2), cos, sin)
        rep = self.H // self.Hk
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.wo(a.transpose(1, 2).reshape(B, T, self.H * self.D)))

        h = self.ffn_norm(x).reshape(B * T, E)
        logits = self.router(h).float()                       # [N, X]
        probs = logits.softmax(-1)
        topv, topi = probs.topk(self.k, dim=-1)
        topv = topv / topv.sum(-1, keepdim=True)
        # dense over experts with zero weight for unselected ones: exact, and fast at this size
        wfull = torch.zeros_like(probs).scatter(-1, topi, topv)   # [N, X]
        g = torch.einsum("ne,xfe->nxf", h, self.gate.to(h.dtype))
        u = torch.einsum("ne,xfe->nxf", h, self.up.to(h.dtype))
        act = F.silu(g) * u * wfull.to(h.dtype).unsqueeze(-1)
        y = torch.einsum("nxf,xef->ne", act, self.down.to(h.dtype))
        x = x + self.drop(y.view(B, T, E))
        # Switch-style load-balancing loss: X * sum_i f_i * P_i (f: share of routed slots, P: mean prob)
        X = probs.shape[-1]
        frac = torch.zeros(X, device=x.device).scatter_add(0, topi.reshape(-1),
                                                           torch.ones(topi.numel(), device=x.device))
        frac = frac / topi.numel()
        aux = X * (frac * probs.mean(0)).sum()
        if stats is not None:
            stats.append(torch.bincount(topi.reshape(-1), minlength=X).cpu())
        return x, aux


class Model(nn.Module):
    def __init__(self, hp, dropout=0.0):
        super().__init__()
        self.hp = hp
        self.embd = nn.Embedding(hp["n_vocab"], hp["n_embd"])
        nn.init.normal_(self.embd.weight, std=0.02)
        self.blocks = nn.ModuleList([Block(hp, dropout) for _ in range(hp["n_layer"])])
        self.out_norm = RMSNorm(hp["n_embd"], hp["rms_eps"])
        D = hp["head_dim"]
        inv = hp["rope_base"] ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = torch.arange(hp["n_ctx"], dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, ids, stats=None):
        T = ids.shape[1]
        x = self.embd(ids)
        aux = 0.0
        for b in self.blocks:
            x, a = b(x, self.cos[:T], self.sin[:T], stats)
            aux = aux + a
        x = self.out_norm(x)
        return F.linear(x, self.embd.weight.to(x.dtype)), aux / len(self.blocks)


def chunk_nll(model, ids, ctx, dev, stats=None):
    """Non-overlapping chunks of ctx tokens, each from an empty context; every position after the first
    of a chunk is scored. Returns per-chunk (sum of NLL in nats, count). f32 math, no autocast."""
    out = []
    n_chunks = len(ids) // ctx
    t = torch.tensor(ids[: n_chunks * ctx], device=dev).view(n_chunks, ctx)
    with torch.no_grad():
        for i in range(0, n_chunks, 16):
            x = t[i:i + 16]
            logits, _ = model(x, stats)
            lp = logits[:, :-1].float().log_softmax(-1)
            nll = -lp.gather(-1, x[:, 1:, None]).squeeze(-1)
            for r in range(x.shape[0]):
                out.append([float(nll[r].double().sum()), int(nll.shape[1])])
    return out


def ppl(chunks):
    return math.exp(sum(c[0] for c in chunks) / sum(c[1] for c in chunks))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--max-epochs", type=int, default=12)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--aux", type=float, default=0.002)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--smoke", action="store_true", help="1 MB of text, 3 steps: checks the whole path")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(1234)
    dev = "cuda"
    hp = dict(HP)
    t0 = time.time()

    train_path = os.path.join(args.corpus, "train.txt")
    if args.smoke:
        small = os.path.join(args.out, "smoke_train.txt")
        open(small, "w", encoding="utf-8").write(open(train_path, encoding="utf-8").read()[:1000000])
        train_path = small
    tok = train_tokenizer(train_path, hp["n_vocab"])
    tokens, types, merges = gguf_vocab(tok)
    if args.smoke:
        hp["n_vocab"] = len(tokens)
    assert len(tokens) == hp["n_vocab"], len(tokens)
    print(f"tokenizer: {len(tokens)} tokens, {len(merges)} merges, {time.time() - t0:.1f}s")

    docs = open(train_path, encoding="utf-8").read().split("\n\n")
    # a validation split of the training documents (every 200th) picks the best epoch; held-out untouched
    val_docs = [d for i, d in enumerate(docs) if i % 200 == 99]
    trn_docs = [d for i, d in enumerate(docs) if i % 200 != 99]
    enc = lambda ds: [i for e in tok.encode_batch([d + "\n\n" for d in ds]) for i in e.ids]
    train_ids = torch.tensor(enc(trn_docs), dtype=torch.long)
    val_ids = enc(val_docs)
    held_text = open(os.path.join(args.corpus, "heldout.txt"), encoding="utf-8").read()
    held_ids = tok.encode(held_text).ids
    if args.smoke:
        held_ids = held_ids[:2048]
    print(f"tokens: train {len(train_ids)}, val {len(val_ids)}, heldout {len(held_ids)}; "
          f"{time.time() - t0:.1f}s")

    model = Model(hp, args.dropout).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params: {n_params}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95),
                            fused=True)
    ctx, B = hp["n_ctx"], args.batch
    n_seq = (len(train_ids) - 1) // ctx
    steps_per_epoch = n_seq // B
    total_steps = steps_per_epoch * args.max_epochs
    warm = 200
    budget = args.minutes * 60
    train_t0 = time.time()
    best = (float("inf"), None, -1)
    step = 0
    log = []
    stop = False
    for epoch in range(args.max_epochs):
        off = int(torch.randint(0, ctx, (1,)))
        n_ep = (len(train_ids) - 1 - off) // ctx
        seqs = train_ids[off: off + n_ep * ctx].view(n_ep, ctx)
        perm = torch.randperm(n_ep)
        model.train()
        for s in range(0, n_ep - B + 1, B):
            x = seqs[perm[s:s + B]].to(dev, non_blocking=True)
            lr = args.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total_steps))))
            for gparam in opt.param_groups:
                gparam["lr"] = lr
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits, aux = model(x)
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                       x[:, 1:].reshape(-1))
            (loss + args.aux * aux).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step % 100 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} aux {float(aux):.3f} lr {lr:.2e} "
                      f"t {time.time() - train_t0:.0f}s")
            step += 1
            if time.time() - train_t0 > budget or (args.smoke and step >= 3):
                stop = True
                break
        model.eval()
        v = ppl(chunk_nll(model, val_ids, ctx, dev))
        print(f"epoch {epoch} done: step {step}, val ppl {v:.3f}, t {time.time() - train_t0:.0f}s")
        log.append({"epoch": epoch, "step": step, "val_ppl": v, "seconds": time.time() - train_t0})
        if v < best[0]:
            best = (v, {k: t.detach().clone() for k, t in model.state_dict().items()}, epoch)
        if stop:
            break
    train_seconds = time.time() - train_t0
    model.load_state_dict(best[1])
    model.eval()
    print(f"best epoch {best[2]} val ppl {best[0]:.3f}; training {train_seconds:.0f}s")

    # Held-out perplexity: trained f32 weights, then with the matrices rounded to f16 as exported.
    ctx_eval = ctx
    held_f32 = chunk_nll(model, held_ids, ctx_eval, dev)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "router" not in name:
                p.copy_(p.half().float())
    stats = []
    held_f16 = chunk_nll(model, held_ids, ctx_eval, dev, stats)
    L = hp["n_layer"]
    usage = [sum(stats[i] for i in range(l, len(stats), L)).tolist() for l in range(L)]
    print(f"heldout ppl f32 {ppl(held_f32):.4f}  f16-weights {ppl(held_f16):.4f}  "
          f"({len(held_f16)} chunks of {ctx_eval})")
    for l, u in enumerate(usage):
        print(f"layer {l} expert counts {u}")

    # Export: tensors in GGUF names and ne order (ne0 = last torch dim).
    sd = model.state_dict()
    tensors = [("token_embd.weight", sd["embd.weight"], "f16"),
               ("output_norm.weight", sd["out_norm.w"], "f32")]
    for l in range(L):
        p, b = f"blk.{l}.", f"blocks.{l}."
        tensors += [(p + "attn_norm.weight", sd[b + "attn_norm.w"], "f32"),
                    (p + "attn_q.weight", sd[b + "wq.weight"], "f16"),
                    (p + "attn_k.weight", sd[b + "wk.weight"], "f16"),
                    (p + "attn_v.weight", sd[b + "wv.weight"], "f16"),
                    (p + "attn_q_norm.weight", sd[b + "q_norm.w"], "f32"),
                    (p + "attn_k_norm.weight", sd[b + "k_norm.w"], "f32"),
                    (p + "attn_output.weight", sd[b + "wo.weight"], "f16"),
                    (p + "ffn_norm.weight", sd[b + "ffn_norm.w"], "f32"),
                    (p + "ffn_gate_inp.weight", sd[b + "router.weight"], "f32"),
                    (p + "ffn_gate_exps.weight", sd[b + "gate"], "f16"),
                    (p + "ffn_up_exps.weight", sd[b + "up"], "f16"),
                    (p + "ffn_down_exps.weight", sd[b + "down"], "f16")]
    table, blob_i, blob, limit = [], 0, bytearray(), 15 * 1000 * 1000

    def flush():
        nonlocal blob, blob_i
        if blob:
            open(os.path.join(args.out, f"weights.{blob_i}.bin"), "wb").write(bytes(blob))
            blob_i += 1
            blob = bytearray()

    for name, t, dt in tensors:
        data = t.detach().to("cpu", torch.float16 if dt == "f16" else torch.float32).contiguous().numpy().tobytes()
        if len(blob) + len(data) > limit:
            flush()
        table.append({"name": name, "dtype": dt, "ne": list(reversed(t.shape)),
                      "file": f"weights.{blob_i}.bin", "offset": len(blob), "nbytes": len(data)})
        blob += data
    flush()
    manifest = {
        "hparams": hp, "n_params": n_params,
        "tokenizer": {"model": "gpt2", "pre": "qwen2", "tokens": tokens, "token_type": types,
                      "merges": merges, "eos": tokens.index("<|im_end|>"),
                      "endoftext": tokens.index("<|endoftext|>")},
        "tensors": table,
        "heldout": {"ctx": ctx_eval, "ids": held_ids, "chunks_f32": held_f32, "chunks_f16": held_f16,
                    "ppl_f32": ppl(held_f32), "ppl_f16": ppl(held_f16), "expert_counts": usage},
        "training": {"seconds": train_seconds, "steps": step, "batch": B, "ctx": ctx,
                     "train_tokens": len(train_ids), "epochs": log, "best_epoch": best[2],
                     "lr": args.lr, "aux_coef": args.aux, "dropout": args.dropout,
                     "device": torch.cuda.get_device_name(0), "torch": torch.__version__},
    }
    json.dump(manifest, open(os.path.join(args.out, "manifest.json"), "w"))
    print(f"exported {len(table)} tensors in {blob_i} blobs; total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
