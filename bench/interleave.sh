#!/usr/bin/env bash
# Peers and agentrt interleaved, for a machine whose speed drifts: ROUNDS x
# (DBOS -> agentrt --single -> LangGraph -> agentrt --single), then one batch
# run and the in-process split. Never run anything else meanwhile (2 cores).
# Each slot reports the same statistic: over BENCH_REPEATS loops of 200 steps,
# the median of each loop's median step (agentrt: --single --repeats).
# Usage: bash bench/interleave.sh [outdir]     (env: ROUNDS=3, BENCH_PY, PEERS)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-/tmp/agentrt-interleave}
ROUNDS=${ROUNDS:-3}
PEERS=${PEERS:-$ROOT/../shared/bench/peers}
PY=${BENCH_PY:-/tmp/bench-venv/bin/python}
export BENCH_DSN=${BENCH_DSN:-postgresql://postgres:postgres@127.0.0.1:5432/bench} BENCH_TRACE=0 BENCH_REPEATS=${BENCH_REPEATS:-5}
mkdir -p "$OUT"
ckpt() { "$PY" -c "import os, psycopg; psycopg.connect(os.environ['BENCH_DSN'], autocommit=True).execute('CHECKPOINT')" || true; sleep 5; }
# Each peer starts on an empty database, as bench/steps.py does for agentrt.
fresh() { "$PY" -c "
import os, psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
name = conninfo_to_dict(os.environ['BENCH_DSN'])['dbname']
with psycopg.connect(make_conninfo(os.environ['BENCH_DSN'], dbname='postgres'), autocommit=True) as c:
    c.execute(f'DROP DATABASE IF EXISTS {name} WITH (FORCE)'); c.execute(f'CREATE DATABASE {name}')"; }
ours() { (cd "$ROOT" && .venv/bin/python bench/steps.py "$@"); }
for r in $(seq "$ROUNDS"); do
  fresh; ckpt; (cd "$PEERS" && "$PY" dbos_steps.py > "$OUT/dbos_$r.json" 2> "$OUT/dbos_$r.log")
  ckpt; ours --single --repeats "$BENCH_REPEATS" > "$OUT/ours_a_$r.txt" 2>&1
  fresh; ckpt; (cd "$PEERS" && "$PY" langgraph_steps.py > "$OUT/lg_$r.json" 2> "$OUT/lg_$r.log")
  ckpt; ours --single --repeats "$BENCH_REPEATS" > "$OUT/ours_b_$r.txt" 2>&1
done
ckpt; ours --runs 20 --steps 50 > "$OUT/ours_batch.txt" 2>&1
ckpt; (cd "$ROOT" && .venv/bin/python bench/profile_run.py --steps 200 --no-cprofile > "$OUT/ours_profile.txt" 2>&1)
"$ROOT/.venv/bin/python" - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def ours(path):
    for line in open(path):
        if line.startswith("{"):
            res = json.loads(line)["results"]
            return (res.get("per_run_step_ms") or res["per_step_ms"])["median"]
dbos, lg, mine = [], [], []
for r in range(1, rounds + 1):
    d = json.load(open(f"{out}/dbos_{r}.json"))["results"]["loop_wf"]["median_step_ms"]["median"]
    g = json.load(open(f"{out}/lg_{r}.json"))["results"]["sync"]["loop"]["median_node_gap_ms"]["median"]
    a, b = ours(f"{out}/ours_a_{r}.txt"), ours(f"{out}/ours_b_{r}.txt")
    dbos.append(d); lg.append(g); mine += [a, b]
    print(f"round {r}: DBOS {d:.2f} ms | agentrt {a:.2f} / {b:.2f} ms | LangGraph sync {g:.2f} ms")
m = statistics.median
print(f"median: DBOS {m(dbos):.2f} | agentrt {m(mine):.2f} | LangGraph sync {m(lg):.2f} | "
      f"agentrt/DBOS {m(mine) / m(dbos):.2f} | agentrt/LangGraph {m(mine) / m(lg):.2f}")
PY
