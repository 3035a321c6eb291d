#!/usr/bin/env bash
# A REPORT, not a gate (issue 18 item 6): mutmut over runs/domain/ against
# the unit tests (tests/unit, no database). mutmut is not in the project's
# lock: this script builds its own venv in /tmp from the hashed locks plus
# mutmut==3.8.1, works on a copy of the tree, and prints per-file counts.
#   bash tests/mutants/mutmut_domain.sh      (~10 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
VENV=${MUTMUT_VENV:-/tmp/agentrt-mutmut-venv}
WORK=$(mktemp -d /tmp/agentrt-mutmut-XXXX)
if [ ! -x "$VENV/bin/mutmut" ]; then
  python3.11 -m venv "$VENV"
  "$VENV/bin/pip" install -q --require-hashes -r requirements.txt
  "$VENV/bin/pip" install -q --no-deps -r requirements-dev.txt
  "$VENV/bin/pip" install -q mutmut==3.8.1
fi
git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C "$WORK"
cat > "$WORK/setup.cfg" <<'CFG'
[mutmut]
paths_to_mutate = runs/domain/
tests_dir = tests/unit/
also_copy =
    tests/
    runs/
    approvals/
    checkpoints/
    maintenance/
    agentrt_site/
    demo/
    templates/
    manage.py
    pytest.ini
pytest_add_cli_args_test_selection = tests/unit/
CFG
cd "$WORK"
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/agentrt}  # conftest checks it; unit tests use no table
"$VENV/bin/mutmut" run --max-children "${MUTMUT_CHILDREN:-2}" >/dev/null 2>&1 || true
mkdir -p "$ROOT/artifacts"
"$VENV/bin/mutmut" results --all true > "$ROOT/artifacts/mutmut_domain.txt" 2>/dev/null || true
printf "%-18s %6s %7s %9s %8s %8s\n" file total killed survived notests timeout
awk -F: '{split($1,a,"."); f=a[3]; st=$2; gsub(/ /,"",st); c[f]++; s[f" "st]++}
  END {for (f in c) printf "%-18s %6d %7d %9d %8d %8d\n", f".py", c[f], s[f" killed"], s[f" survived"], s[f" notests"], s[f" timeout"]}' \
  "$ROOT/artifacts/mutmut_domain.txt" | sort
echo "per-mutant results: artifacts/mutmut_domain.txt; the mutated copy: $WORK (mutmut show NAME there)"
