#!/usr/bin/env bash
# Side by side on one GGUF file: llama.cpp's llama-bench (mainline and ik_llama.cpp, from
# ../shared/anchors) and kvlm bench, same tests, threads and depths, one repetition of each
# engine in turn, so that a machine whose speed drifts shifts all of them alike. Prints one table:
# medians, the ratios, and each engine's share of this machine's measured bandwidth (kvlm bench
# --probe's triad, and its read-only pass) for the decode rows. The probe runs before every
# repetition, and a share is the median over repetitions of that repetition's decode bytes/s over
# its own probe: a shared machine's bandwidth drifts by half within minutes, and one probe at the
# start put decode at 150% of a triad measured in a slower moment.
#
#   scripts/bench-vs-llamacpp.sh MODEL.gguf [-p 512] [-n 32] [-d 0,2048] [-t 2] [-r 3] [--kv f16|bf16|q8]
#                                [--isa auto|avx2] [--kvlm build/kvlm] [--anchors ../shared/anchors]
#                                [--json OUT.json] [-q]
#
# Progress (one line per engine run) goes to stderr; -q silences it.
# --kv q8 compares kvlm's int8 cache with llama.cpp's q8_0 (both 8 bits a value plus a scale).
# --isa avx2 compares the AVX2 paths on a machine that has more: kvlm runs with KVLM_CPU=avx2, and
# llama.cpp from a temporary copy of its folder without the CPU variants above haswell, so its
# runtime dispatch loads libggml-cpu-haswell.so (ik_llama.cpp is an AVX2 build either way). The
# footer names the variant llama.cpp loaded and the kernel features kvlm ran with.
# An engine whose binary is missing is left out with a message; kvlm must be there.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
exec python3 - "$here" "$@" <<'PY'
import json, os, re, statistics, subprocess, sys

root = sys.argv[1]
args = sys.argv[2:]
usage = ("usage: scripts/bench-vs-llamacpp.sh MODEL.gguf [-p N] [-n N] [-d D1,D2] [-t T] [-r R] "
         "[--kv f16|bf16|q8] [--isa auto|avx2] [--kvlm PATH] [--anchors DIR] [--json OUT] [-q]")
opts = {"-p": "512", "-n": "32", "-d": "0", "-t": str(min(os.cpu_count() or 1, 2)), "-r": "3", "--kv": "f16",
        "--isa": "auto", "--kvlm": os.path.join(root, "build", "kvlm"), "--anchors": None, "--json": None}
model = None
quiet = False
i = 0
while i < len(args):
    a = args[i]
    if a in ("-h", "--help"):
        print(usage)
        sys.exit(0)
    if a in ("-q", "--quiet"):
        quiet = True
        i += 1
        continue
    if a in opts:
        if i + 1 >= len(args):
            sys.exit(f"bench-vs-llamacpp: {a} needs a value\n{usage}")
        opts[a] = args[i + 1]
        i += 2
        continue
    if a.startswith("-") or model is not None:
        sys.exit(f"bench-vs-llamacpp: unknown argument '{a}'\n{usage}")
    model = a
    i += 1
if model is None:
    sys.exit(usage)
if not os.path.isfile(model):
    sys.exit(f"bench-vs-llamacpp: no model file '{model}'")
for k in ("-p", "-n", "-t", "-r"):
    if not opts[k].isdigit():
        sys.exit(f"bench-vs-llamacpp: {k} takes a whole number, got '{opts[k]}'")
depths = opts["-d"].split(",")
if not all(d.isdigit() for d in depths):
    sys.exit(f"bench-vs-llamacpp: -d takes whole numbers separated by commas, got '{opts['-d']}'")
# llama-bench's caches: f16, bf16 and the q types (no f32).
kv_map = {"f16": ("f16", "f16"), "bf16": ("bf16", "bf16"), "q8": ("int8", "q8_0")}
if opts["--kv"] not in kv_map:
    sys.exit(f"bench-vs-llamacpp: --kv '{opts['--kv']}' is not one of: {', '.join(kv_map)}")
kvlm_kv, llama_kv = kv_map[opts["--kv"]]
if opts["--isa"] not in ("auto", "avx2"):
    sys.exit(f"bench-vs-llamacpp: --isa '{opts['--isa']}' is not one of: auto, avx2")
reps = int(opts["-r"])
if reps < 1:
    sys.exit("bench-vs-llamacpp: -r must be at least 1")

def avx2_only_copy(bench):
    """llama-bench in a temporary copy of its folder holding no CPU variant above haswell: ggml
    loads the best variant found beside the binary, so this one can only pick haswell (or x64)."""
    import atexit, shutil, tempfile
    src = os.path.dirname(bench)
    if not os.path.isfile(os.path.join(src, "libggml-cpu-haswell.so")):
        sys.exit(f"bench-vs-llamacpp: --isa avx2 needs {src}/libggml-cpu-haswell.so")
    dst = tempfile.mkdtemp(prefix="bench-vs-llamacpp-")
    atexit.register(shutil.rmtree, dst, ignore_errors=True)
    for f in os.listdir(src):
        if f.startswith("libggml-cpu-") and f not in ("libggml-cpu-haswell.so", "libggml-cpu-x64.so"):
            continue
        shutil.copy2(os.path.join(src, f), dst)
    return os.path.join(dst, os.path.basename(bench))

kvlm = opts["--kvlm"]
if not os.access(kvlm, os.X_OK):
    sys.exit(f"bench-vs-llamacpp: no kvlm binary at {kvlm} (build it, or give --kvlm)")
anchors = opts["--anchors"] or os.environ.get("KVLM_SHARED") and os.path.join(os.environ["KVLM_SHARED"], "anchors")
if not anchors:
    anchors = os.path.join(root, "..", "shared", "anchors")
kvlm_env = dict(os.environ)
if opts["--isa"] == "avx2":
    kvlm_env["KVLM_CPU"] = "avx2"
engines = []  # (name, command without -r)
common = ["-m", model, "-p", opts["-p"], "-n", opts["-n"], "-t", opts["-t"]]
deep = any(int(d) > 0 for d in depths)
# ik_llama.cpp's llama-bench has no -d: it runs the depth-0 tests only.
for name, rel, extra, takes_depth in (("llama.cpp", "llama.cpp/llama-bench", ["-fa", "1"], True),
                                      ("ik_llama.cpp", "ik_llama.cpp/llama-bench", ["-fa", "1", "-rtr", "1"], False)):
    path = os.path.join(anchors, rel)
    if not os.access(path, os.X_OK):
        print(f"note: {name} left out: no {path}", file=sys.stderr)
        continue
    if name == "llama.cpp" and opts["--isa"] == "avx2":
        path = avx2_only_copy(path)
    depth = ["-d", opts["-d"]] if takes_depth else []
    if deep and not takes_depth:
        if "0" not in depths:
            print(f"note: {name} left out: its llama-bench has no -d, and no depth 0 was asked", file=sys.stderr)
            continue
        print(f"note: {name}'s llama-bench has no -d: depth 0 only", file=sys.stderr)
    engines.append((name, [path] + common + depth + extra + ["-ctk", llama_kv, "-ctv", llama_kv, "-o", "json"]))
engines.append(("kvlm", [kvlm, "bench"] + common + ["-d", opts["-d"], "--kv-type", kvlm_kv, "--no-probe", "--json"]))

ran_with = {}  # engine -> the CPU variant or kernel features it reported

def run(cmd, fatal=True, env=None, engine=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        message = f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}"
        if fatal:
            sys.exit(f"bench-vs-llamacpp: {message}")
        print(f"note: {message}", file=sys.stderr)
        return None
    loaded = re.search(r"loaded CPU backend from (\S+)", r.stderr)
    if loaded and engine:
        ran_with.setdefault(engine, os.path.basename(loaded.group(1)))
    return json.loads(r.stdout)

def test_name(p, n, d):
    name = f"pp{p}" if p > 0 else f"tg{n}"
    return name if d == 0 else f"{name} @ d{d}"

samples = {}      # (engine, test) -> [t/s], one per repetition
traffic = {}      # test -> decode bytes per token (kvlm's count)
order = []
probes = []       # kvlm bench --probe before each repetition
for rep in range(reps):
    if not quiet:
        print(f"rep {rep + 1}/{reps}: bandwidth probe", file=sys.stderr, flush=True)
    probes.append(run([kvlm, "bench", "--probe", "--json", "-t", opts["-t"]], env=kvlm_env))
    for name, cmd in list(engines):
        if not quiet:
            print(f"rep {rep + 1}/{reps}: {name}", file=sys.stderr, flush=True)
        # An anchor that cannot run this file (llama.cpp refuses some shapes) is left out, said so.
        out = run(cmd + ["-r", "1"], fatal=name == "kvlm", env=kvlm_env if name == "kvlm" else None, engine=name)
        if out is None:
            engines.remove((name, cmd))
            print(f"note: {name} left out of the table", file=sys.stderr)
            continue
        rows = out["rows"] if name == "kvlm" else out
        if name == "kvlm":
            features = re.search(r"kernel features: ([^;]*)", out.get("machine", ""))
            ran_with.setdefault("kvlm", f"kernel features {features.group(1)}" if features else "?")
        for row in rows:
            if name == "kvlm":
                test = row["test"]
                if row["kind"] == "tg":
                    traffic[test] = row["bytes_per_token"]
                values = row["samples_tps"]
            else:
                test = test_name(row["n_prompt"], row["n_gen"], row.get("n_depth", 0))
                values = row["samples_ts"]
            if test not in order:
                order.append(test)
            if len(values) != 1:
                sys.exit(f"bench-vs-llamacpp: {name} gave {len(values)} samples for {test} with -r 1")
            samples.setdefault((name, test), []).append((rep, values[0]))

names = [n for n, _ in engines]
med = {k: statistics.median(t for _, t in v) for k, v in samples.items()}
triad = [p["bandwidth"]["median_gb_s"] for p in probes]
read = [p["bandwidth"]["read_median_gb_s"] for p in probes]

def median_share(name, test, bytes_tok, gb_s):
    """Median over repetitions of decode bytes/s ÷ the bandwidth probed just before."""
    if not bytes_tok or (name, test) not in samples:
        return None
    return statistics.median(bytes_tok * t / 1e9 / gb_s[rep] for rep, t in samples[(name, test)])
header = ["test"] + [f"{n} t/s" for n in names] + [f"kvlm / {n}" for n in names if n != "kvlm"]
header += ["MB/token"] + [f"{n} % BW (triad / read)" for n in names]
lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
table = []
for test in order:
    cells = [test]
    for n in names:
        v = med.get((n, test))
        cells.append(f"{v:.2f}" if v is not None else "–")
    k = med.get(("kvlm", test))
    for n in names:
        if n == "kvlm":
            continue
        v = med.get((n, test))
        cells.append(f"{k / v:.2f}x" if k is not None and v else "–")
    bytes_tok = traffic.get(test)
    cells.append(f"{bytes_tok / 1e6:.1f}" if bytes_tok else "")
    entry = {"test": test, "median_tps": {n: med.get((n, test)) for n in names},
             "samples_tps": {n: [t for _, t in samples.get((n, test), [])] for n in names}, "bytes_per_token": bytes_tok}
    for n in names:
        share = median_share(n, test, bytes_tok, triad)
        read_share = median_share(n, test, bytes_tok, read)
        cells.append(f"{100 * share:.0f}% / {100 * read_share:.0f}%" if share is not None else "")
        entry.setdefault("bandwidth_share", {})[n] = share
        entry.setdefault("read_bandwidth_share", {})[n] = read_share
    lines.append("| " + " | ".join(cells) + " |")
    table.append(entry)
print("\n".join(lines))
threads = int(opts["-t"])
print(f"\n{os.path.basename(model)}, {threads} thread{'' if threads == 1 else 's'}, KV {kvlm_kv} (llama.cpp {llama_kv}), medians of {reps} "
      f"interleaved repetitions")
def spread(values):
    return (f"{values[0]:.1f}" if len(values) == 1 else
            f"median {statistics.median(values):.1f}, {min(values):.1f} to {max(values):.1f}")
gops = [p["matmul"]["median_gops"] for p in probes]
print(f"bandwidth probed before each repetition on {threads} thread{'' if threads == 1 else 's'}: "
      f"triad {spread(triad)} GB/s, read {spread(read)} GB/s; Q8_0 matmul {spread(gops)} GOPS "
      f"({probes[0]['matmul']['rows']} x {probes[0]['matmul']['cols']} weights x {probes[0]['matmul']['tokens']} tokens)")
print("MB/token and % BW count what a decode step reads (kvlm's count: every weight matrix + the KV it attends "
      "over); % BW is the median over repetitions of each one's decode bytes/s as a share of the triad and of the "
      "read-only bandwidth probed just before it; ik_llama.cpp is an AVX2 build")
cpu_paths = {n: ran_with.get(n, "its AVX2 build" if n == "ik_llama.cpp" else "not reported") for n in names}
print(f"CPU paths (--isa {opts['--isa']}): " + "; ".join(f"{n}: {v}" for n, v in cpu_paths.items()))
if opts["--json"]:
    with open(opts["--json"], "w") as f:
        json.dump({"model": model, "threads": int(opts["-t"]), "kv": opts["--kv"], "isa": opts["--isa"],
                   "cpu_paths": cpu_paths, "reps": reps, "probes": probes, "rows": table}, f, indent=2)
PY
