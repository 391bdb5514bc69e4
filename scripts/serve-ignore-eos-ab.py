#!/usr/bin/env python3
"""A/B of a strata server's decode throughput with `ignore_eos` requests (stdlib only: runs on the device box).
For each arm (its environment) and round: starts `strata serve` on a free port, sends N concurrent
/v1/completions requests (ignore_eos, max_tokens M, temperature 0.8, seeds 1..N), and prints the generated
tokens a second over the wall time from the first request to the last answer. Arms alternate by round.
Usage: serve-ignore-eos-ab.py STRATA MODEL "SERVE ARGS" N M ROUNDS NAME=VAR=VALUE[,VAR=VALUE] ...
An arm's settings may also name request fields (req.FIELD=JSON, e.g. req.top_k=40, req.temperature=0), its
concurrency (n=K: K requests and --parallel K instead of N), and mix=1: request i's temperature 0.5 + 0.1 i
(samplers with different parameters in one batch).
"""
import json, os, re, subprocess, sys, threading, time, urllib.request

strata, model, serve_args, n, m, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
arms = []
for a in sys.argv[7:]:
    name, _, sw = a.partition("=")
    env = dict(kv.split("=", 1) for kv in sw.split(",") if kv and kv != "-")
    req = {k[4:]: json.loads(v) for k, v in env.items() if k.startswith("req.")}
    k = int(env.get("n", n))
    if env.get("mix") == "1":
        req["mix"] = True
    env = {key: v for key, v in env.items() if not key.startswith("req.") and key not in ("n", "mix")}
    arms.append((name, env, req, k))

def one_run(env, req, n):
    e = dict(os.environ, **env)
    p = subprocess.Popen([strata, "serve", "-m", model, "--port", "0", "--parallel", str(n)] + serve_args.split(),
                         env=e, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    port = None
    t_end = time.time() + 120
    while port is None and time.time() < t_end:
        line = p.stderr.readline()
        if not line:
            break
        mm = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if mm:
            port = int(mm.group(1))
    if port is None:
        p.kill()
        return None
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    tokens = [0] * n
    def ask(i):
        fields = {"prompt": "Once upon a time", "max_tokens": m, "temperature": 0.8, "seed": i + 1, "ignore_eos": True}
        fields.update({key: v for key, v in req.items() if key != "mix"})
        if req.get("mix"):
            fields["temperature"] = 0.5 + 0.1 * i
        body = json.dumps(fields).encode()
        rq = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(rq, timeout=300) as r:
            tokens[i] = json.load(r)["usage"]["completion_tokens"]
    # one warm-up request (graph capture, first-touch), then the timed batch
    ask(0)
    th = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
    t0 = time.time()
    for t in th: t.start()
    for t in th: t.join()
    wall = time.time() - t0
    p.terminate()
    p.wait(timeout=30)
    return sum(tokens) / wall, sum(tokens)

results = {a[0]: [] for a in arms}
for r in range(rounds):
    for name, env, req, k in arms:
        got = one_run(env, req, k)
        results[name].append(got[0] if got else float("nan"))
        print(f"round {r + 1} {name}: " + (f"{got[0]:.1f} tok/s ({got[1]} tokens)" if got else "failed"), flush=True)
for name, *_ in arms:
    v = sorted(x for x in results[name] if x == x)
    print(f"{name}: median {v[len(v) // 2]:.1f} tok/s of {', '.join(f'{x:.1f}' for x in results[name])}" if v else f"{name}: failed")
