#!/usr/bin/env bash
# Device check: one run on a machine with one NVIDIA GPU (an H200), under 8 minutes in all, each
# part under `timeout`. Measures:
#   (a) throughput and MFU in bf16 of the reference model (benchmarks/throughput.py's
#       'reference' workload: 2 layers, d_model 128, V 4096, B 16, C 128) as an ensemble of
#       E = 64 (one vmapped program) vs a sequential loop of 64 single models (one update per
#       call; and with 10 updates scanned per call). MFU against the bf16 matmul peak measured
#       here (8192² products) and against the nominal dense bf16 peak (989 TFLOP/s, H100/H200).
#   (b) compile time: the E = 64 program's compile in a fresh process with an empty JAX
#       persistent compilation cache vs with the cache (a) filled; and per sweep group, the
#       start-up (status.json timings.setup_s) of the sweeps in (c), cold vs warm cache.
#   (d) the study's largest exp1 cell (benchmarks/memory_check.py): the memory setting chosen,
#       predicted bytes per device against the measured peak, tokens/s and MFU.
#   (c) a 4-group tiny sweep (configs/default.py:tiny, B 8/16/32/64, E 4, Markov-chain data:
#       nothing to download) by benchmarks/sweep_overhead.py: 1 worker vs 4 independent workers
#       sharing the GPU (XLA_PYTHON_CLIENT_MEM_FRACTION 0.225 each), each with an empty cache,
#       then both again with the 1-worker sweep's cache (a rerun): wall time each.
# Usage, from the repository root:
#   bash benchmarks/device_check.sh --preflight  # here, first: every program below compiled for
#                                                # an H200 by XLA:GPU without a GPU
#                                                # (benchmarks/device_preflight.py), into
#                                                # $OUT/preflight.json; exit 1 if one fails
#   bash benchmarks/device_check.sh              # on the GPU machine
#   bash benchmarks/device_check.sh --cpu-smoke  # here: every part at a tiny size, 2 groups, <= 2 workers
# With the device tool: run `bash benchmarks/device_check.sh` with carry [".whl",
# "device_check_out/preflight.json"] (the wheel of ml-collections, the one package missing
# there: `mkdir -p .whl && pip download --no-deps -d .whl ml-collections==1.1.0`; the
# pre-flight's results, whose setting part (d) trains at: PREFLIGHT names another file),
# timeout_s 540.
# Setup it does: ml_collections from ${IHSWEEP_WHEELS:-.whl} (pip --no-index) if it cannot be
# imported; the project with `pip install --no-deps -e .` if it is not installed (PYTHONPATH
# otherwise). Environment: PYTHON (default: .venv/bin/python with --cpu-smoke if there, else
# python3), OUT (results folder; default ./device_check_out), DC_BUDGET_S (seconds for all
# parts, default 470), PREFLIGHT (the pre-flight's JSON that part (d) reads; default
# device_check_out/preflight.json, whatever OUT is).
# Output: a results table on stdout; $OUT/device_check.json (every number), device_check.log
# (this script's whole output), sweep_logs.tar.gz (the sweeps' worker logs and status files).
# A part that fails or runs out of time is reported as such and the others still run.
set -uo pipefail
smoke=0 preflight=0
for a in "$@"; do
  case "$a" in
    --cpu-smoke) smoke=1 ;;
    --preflight) preflight=1 ;;
    *) echo "usage: $0 [--cpu-smoke | --preflight]" >&2; exit 2 ;;
  esac
done
if (( smoke && preflight )); then  # the pre-flight compiles for an H200; it has no smoke size
  echo "$0: --preflight and --cpu-smoke are not allowed together: one of them (usage: $0 [--cpu-smoke | --preflight])" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
out=${OUT:-./device_check_out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
if (( preflight )); then
  exec "${PYTHON:-.venv/bin/python}" benchmarks/device_preflight.py --out "$out/preflight.json"
fi
planned=${PREFLIGHT:-device_check_out/preflight.json}  # where --preflight writes it by default
work=$(mktemp -d "${TMPDIR:-/tmp}/ihsweep-device-check.XXXXXX")
exec > >(tee "$out/device_check.log") 2>&1
if [[ -z "${PYTHON:-}" ]]; then
  if (( smoke )) && [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
py=$PYTHON
# The caps below fit the GPU's 8 minutes; a CPU smoke run (a CI test on 2 shared cores, beside
# other tests) gets 4× each and 4× the budget: it checks that every part runs, not how fast.
scale=$(( smoke ? 4 : 1 ))
budget=${DC_BUDGET_S:-$(( 470 * scale ))}
export PYTHONUNBUFFERED=1
echo "=== device check $(date '+%F %T'), $( ((smoke)) && echo 'CPU smoke' || echo 'GPU'), python $py, budget ${budget} s"

# --- setup ----------------------------------------------------------------------------------
wheels=${IHSWEEP_WHEELS:-.whl}
if ! "$py" -c "import ml_collections" 2>/dev/null; then
  echo "setup: ml_collections from $wheels"
  if ! "$py" -m pip install -q --no-index --find-links "$wheels" ml_collections; then
    "$py" -m pip install -q --no-index --no-deps --target "$work/site" "$wheels"/ml_collections-*.whl
    export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
if ! "$py" -m pip show -q ihsweep >/dev/null 2>&1; then
  echo "setup: pip install --no-deps -e ."
  "$py" -m pip install -q --no-deps --no-index --no-build-isolation -e . \
    || echo "setup: the editable install failed; the checkout is on PYTHONPATH instead"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export IHSWEEP="$py -m ihsweep.cli"
if (( smoke )); then
  export JAX_PLATFORMS=cpu
  # compile fast, as the tests do (tests/conftest.py CPU_COMPILE_FLAGS)
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_backend_optimization_level=0"
else
  nvidia-smi -L 2>&1 | head -4
fi
"$py" -c "import jax, ml_collections, ihsweep; print('jax', jax.__version__, jax.devices())" \
  || { echo "setup failed: jax, ml_collections or ihsweep cannot be imported"; exit 1; }

left() {  # seconds this part may take: its cap (× scale), or what is left of the budget
  local rest=$(( budget - SECONDS )) cap=$(( $1 * scale ))
  echo $(( cap < rest ? cap : rest ))
}
part() {  # part NAME CAP command...: runs it under timeout, its status into $work/NAME.rc
  local name=$1 cap; cap=$(left "$2"); shift 2
  if (( cap < 15 )); then
    echo "--- $name: skipped (budget spent)" >&2; echo skipped > "$work/$name.rc"; return
  fi
  echo "--- $name (at most ${cap} s)" >&2
  local t0=$SECONDS
  timeout -k 10 "$cap" "$@"
  local rc=$?
  echo "$rc" > "$work/$name.rc"
  echo "--- $name: status $rc$( ((rc == 124)) && echo ' (timed out)') after $(( SECONDS - t0 )) s" >&2
}

# --- (a) and (b): throughput, MFU and compile time of the reference ensemble -----------------
# One empty persistent cache for (a); (b) compiles the same E = 64 program in a new process
# with it. Every program is cached, however fast it compiled.
export DC_SMOKE=$smoke DC_WORK=$work
THROUGHPUT=$(cat <<'EOF'
import json, os, sys, time
sys.path.insert(0, "benchmarks")
import jax
import jax.numpy as jnp
import throughput
from ihsweep.compute.model import ModelConfig

smoke, warm = os.environ["DC_SMOKE"] == "1", sys.argv[1] == "warm"
# The reference workload in bf16: throughput.py builds every model through ModelConfig.
throughput.ModelConfig = lambda **kw: ModelConfig(**{**kw, "dtype": "bfloat16"})
workload, E = ("tiny", 4) if smoke else ("reference", 64)


def bf16_peak_gflops(n: int, reps: int = 3, chain: int = 10) -> float:
  """Best bf16 GFLOP/s of `chain` back-to-back n×n products (2n³ FLOPs each)."""
  f = jax.jit(lambda a, b: a @ b)
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.bfloat16)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.bfloat16)
  f(a, b).block_until_ready()
  best = 0.0
  for _ in range(reps):
    t = time.perf_counter()
    outs = [f(a, b) for _ in range(chain)]
    jax.block_until_ready(outs)
    best = max(best, chain * 2 * n**3 / (time.perf_counter() - t) / 1e9)
  return best


kind = jax.devices()[0].device_kind
nominal = 989.4e3 if any(h in kind for h in ("H100", "H200")) else None  # GFLOP/s, dense bf16
if warm:  # (b): the ensemble program only, compiled against the cache (a) filled
  r = throughput.run_mode("ensemble", workload, E, 2 if smoke else 10, 2 if smoke else 10, 1,
                          1.0)
  json.dump({"compile_s_warm": r["compile_s"]}, open(os.path.join(os.environ["DC_WORK"],
                                                                  "b.json"), "w"))
  print("E =", E, "ensemble program: compile_s with a warm cache", r["compile_s"])
  sys.exit(0)
peak = bf16_peak_gflops(256 if smoke else 8192)
print(f"{kind}: bf16 matmul peak {peak / 1e3:.1f} TFLOP/s")
results = []
for mode, updates, k in (("ensemble", 50, 10), ("sequential", 10, 1),
                         ("sequential_scan", 10, 10)):
  if smoke:
    updates, k = 2, min(k, 2)
  r = throughput.run_mode(mode, workload, E, updates, k, 1 if smoke else 3, peak)
  r["mfu_nominal"] = round(r["model_flops_per_s"] / (nominal * 1e9), 4) if nominal else None
  results.append(r)
  print(json.dumps(r))
json.dump({"device": kind, "backend": jax.default_backend(), "workload": workload, "dtype":
           "bfloat16", "bf16_peak_gflops": round(peak, 1), "nominal_bf16_gflops": nominal,
           "results": results}, open(os.path.join(os.environ["DC_WORK"], "a.json"), "w"))
EOF
)
export JAX_COMPILATION_CACHE_DIR=$work/cache_throughput
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
part a_throughput 100 "$py" -c "$THROUGHPUT" cold
part b_compile_warm 40 "$py" -c "$THROUGHPUT" warm
unset JAX_COMPILATION_CACHE_DIR JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS \
  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES

# --- (d) the study's largest exp1 cell (B 128 × C 1024, E 2, d 768, V 50,257, bf16): the memory
# setting ihsweep chooses, its predicted bytes against the measured peak, tokens/s and MFU
# (benchmarks/memory_check.py; --smoke: a tiny cell whose capacity forces accumulation).
# The pre-flight's setting and prediction where its file is here (not in the CPU smoke: its cell
# is another).
plan_args=()
if (( ! smoke )) && [[ -f "$planned" ]]; then plan_args=(--planned "$planned"); fi
if (( ${#plan_args[@]} )); then
  echo "--- (d) at the setting of the pre-flight in $planned"
else
  echo "--- (d) at the setting this GPU chooses (no pre-flight file)"
fi
part d_largest_cell 90 "$py" benchmarks/memory_check.py --json $( ((smoke)) && echo --smoke ) \
  "${plan_args[@]}" > "$work/d.json"

# --- (c) and (b): the tiny sweep, 1 worker vs 4 sharing the GPU, cold and warm caches --------
# The persistent cache with ihsweep's own settings (what a user gets); sweep_overhead.py points
# it at --cache_dir.
if (( smoke )); then  # a 1-layer attention-only model of width 16, 2 groups, 2 workers at most:
  # every code path of the GPU check, at the size a CI test affords on 2 cores
  many=2 warm_workers=1
  sweep=(--config configs/default.py --grid train.batch_size=4,8 --updates 20
         --set model.n_layers=1 --set model.d_mlp=0 --set model.d_model=16 --set model.n_heads=1
         --set model.vocab_size=32 --set model.max_context=16 --set train.context_size=16
         --set ensemble.size=2 --set train.steps_per_call=10 --set eval.every_steps=10
         --set checkpoint.params_schedule=none --cpu_devices 1)
else
  many=4 warm_workers=1,4
  sweep=(--config configs/default.py:tiny --grid train.batch_size=8,16,32,64 --updates 2000
         --set eval.every_steps=200 --gpus 0)
fi
sweep=("${sweep[@]}" --json)
overhead() {  # overhead NAME CAP CACHE WORKERS: one sweep_overhead.py call into $work/NAME.json
  local name=$1 cap; cap=$(left "$2")
  part "$name" "$2" "$py" benchmarks/sweep_overhead.py "${sweep[@]}" --workers "$4" \
    --cache_dir "$work/$3" --workdir "$work/$name" --timeout $(( cap - 15 > 10 ? cap - 15 : 10 )) \
    > "$work/$name.json"
}
echo "--- sweeps: ${sweep[*]}"
overhead c1_one_worker_cold 130 cache_one 1
overhead c2_four_workers_cold 90 cache_four "$many"
overhead c3_warm 100 cache_one "$warm_workers"
for name in c1_one_worker_cold c2_four_workers_cold c3_warm; do
  echo "$name: $(cat "$work/$name.rc" 2>/dev/null)"
done

# --- results ---------------------------------------------------------------------------------
(cd "$work" && tar -czf "$out/sweep_logs.tar.gz" $(ls -d c*/*/logs c*/*/groups/*/status.json \
  c*/*/claims.jsonl 2>/dev/null)) || true
DC_OUT=$out "$py" - <<'EOF'
import glob, json, os

work, out = os.environ["DC_WORK"], os.environ["DC_OUT"]


def load(name):
  try:
    with open(os.path.join(work, name + ".json")) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def rc(name):
  try:
    return open(os.path.join(work, name + ".rc")).read().strip()
  except OSError:
    return "not run"


a, b, d = load("a"), load("b"), load("d")
sweeps = {n: load(n) for n in ("c1_one_worker_cold", "c2_four_workers_cold", "c3_warm")}
result = {"smoke": os.environ["DC_SMOKE"] == "1", "throughput": a, "compile_warm": b,
          "largest_cell": d, "sweeps": sweeps,
          "status": {n: rc(n) for n in ("a_throughput", "b_compile_warm", "d_largest_cell",
                                        *sweeps)}}
with open(os.path.join(out, "device_check.json"), "w") as f:
  json.dump(result, f, indent=1)

print("\n=== results ===")
print("status of each part:", result["status"])
if a:
  print(f"\n(a) {a['device']} ({a['backend']}), workload {a['workload']} in {a['dtype']}; "
        f"bf16 matmul peak measured {a['bf16_peak_gflops'] / 1e3:.1f} TFLOP/s")
  print(f"{'mode':16} {'E':>3} {'tokens/s':>12} {'TFLOP/s':>8} {'MFU':>7} {'MFU nom.':>8} "
        f"{'compile s':>9}")
  for r in a["results"]:
    nom = f"{r['mfu_nominal']:.4f}" if r.get("mfu_nominal") is not None else "-"
    print(f"{r['mode']:16} {r['E']:>3} {r['tokens_per_s']:>12,.0f} "
          f"{r['model_flops_per_s'] / 1e12:>8.2f} {r['mfu']:>7.4f} {nom:>8} {r['compile_s']:>9}")
  by = {r["mode"]: r for r in a["results"]}
  if "ensemble" in by:
    for m in ("sequential", "sequential_scan"):
      if m in by:
        print(f"ensemble / {m}: {by['ensemble']['tokens_per_s'] / by[m]['tokens_per_s']:.1f}x")
print("\n(b) compile time")
if a and b:
  cold = next(r["compile_s"] for r in a["results"] if r["mode"] == "ensemble")
  print(f"E = {a['results'][0]['E']} ensemble program: {cold} s with an empty persistent cache, "
        f"{b['compile_s_warm']} s with it filled")


print("\n(d) the largest exp1 cell")
if d:
  gib = lambda n: "-" if n is None else f"{n / 2**30:.2f} GiB"
  s = d["setting"]
  print(f"{d['device']}: B {d['cell']['batch_size']} x C {d['cell']['context_size']}, E "
        f"{d['cell']['n_models']}: k = {s['gradient_accumulation_steps']}, vmap_chunk "
        f"{s['vmap_chunk']}, remat {s['remat']}, attention {s.get('attention')}; predicted "
        f"{gib(d['predicted_bytes'])} of {gib(d['capacity_bytes'])} (compiled on the GPU), "
        f"measured peak {gib(d['peak_bytes'])}; {d['tokens_per_s']:,.0f} tokens/s, MFU {d['mfu']}")
  if d.get("planned_bytes"):
    print(f"  the pre-flight's prediction without a GPU ({d['planned_from']}): "
          f"{gib(d['planned_bytes'])}; measured peak / it = {d['peak_over_planned']}")


def group_setup(sweep, workers):
  """Per-group start-up (setup_s) of the sweep of `workers` workers in a sweep_overhead run."""
  if not sweep:
    return None
  vals = [g["setup_s"] for g in sweep["groups"] if g["workers"] == workers]
  return None if not vals or None in vals else vals


for label, name, w in (("cold cache, 1 worker", "c1_one_worker_cold", 1),
                       ("warm cache, 1 worker", "c3_warm", 1),
                       ("cold cache, 4 workers", "c2_four_workers_cold", 4),
                       ("warm cache, 4 workers", "c3_warm", 4)):
  if os.environ["DC_SMOKE"] == "1" and w == 4:  # the smoke's sweeps have 2 workers at most
    w = 2 if name == "c2_four_workers_cold" else None
  vals = group_setup(sweeps[name], w) if w else None
  print(f"sweep groups' start-up (setup_s), {label}: "
        + (", ".join(f"{v:.1f}" for v in vals) if vals else "not recorded"))
print(f"\n(c) {'2' if os.environ['DC_SMOKE'] == '1' else '4'}-group tiny sweep")
print(f"{'sweep':24} {'workers':>7} {'wall s':>7} {'groups done':>11} {'Σ setup s':>9} "
      f"{'Σ train s':>9} {'outside s':>9} {'busy':>5} {'exit':>5}")
for name, sweep in sweeps.items():
  for r in (sweep or {}).get("runs", []):
    fmt = lambda v, f: "-" if v is None else format(v, f)
    print(f"{name:24} {r['workers']:>7} {r['wall_s']:>7.1f} "
          f"{str(r['done']) + '/' + str(r['groups']):>11} {fmt(r['setup_s'], '9.1f'):>9} "
          f"{fmt(r['train_s'], '9.1f'):>9} {fmt(r.get('outside_s'), '9.1f'):>9} "
          f"{fmt(r['busy'], '5.2f'):>5} {r['exit_status']!s:>5}")
  for note in (sweep or {}).get("notes", []):
    print("  note:", note[:400])
print("(Σ over groups of status.json timings; outside = workers × wall − Σ group totals: process "
      "start, planning, waiting; busy = Σ train / (workers × wall))")
print(f"\nJSON: {os.path.join(out, 'device_check.json')}")
EOF
rm -rf "$work"
echo "=== device check done in $SECONDS s"
