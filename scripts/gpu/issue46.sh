#!/usr/bin/env bash
# On the GPU machine: issue 46's checks on real SGLang that fit one call of a fresh machine (~6-8 min),
# for a session with little device time: pause and continue on the wire (every mode:
# tests/conformance/test_pause.py through `offpolicy.sh conformance`), then tutorial 10 run whole
# (its lessons are asserted in it; the executed notebook comes back as $OUT/10_off_policy.gpu.ipynb,
# its figures and tables as they came out on the GPU). The performance targets are
# `offpolicy.sh large` (a call of their own).
#   bash scripts/gpu/issue46.sh            # both
#   bash scripts/gpu/issue46.sh tutorial   # tutorial 10 only
source "$(dirname "$0")/common.sh"
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}" RLGEN_DEFAULT_MODEL="$RLGEN_TEST_MODEL"
PART=${1:-all}

tutorial() {  # tutorial 10 through nbclient (the notebooks' folder its working directory), saved executed
  local t0=$SECONDS
  timeout 420 python3 - "$OUT/10_off_policy.gpu.ipynb" > "$OUT/10_off_policy.txt" 2>&1 <<'EOF'
import sys

import nbclient
import nbformat

nb = nbformat.read("notebooks/10_off_policy.ipynb", as_version=4)
client = nbclient.NotebookClient(nb, timeout=400, kernel_name="python3", resources={"metadata": {"path": "notebooks"}})
try:
    client.execute()
    print("tutorial 10: every cell ran, its lessons held")
finally:
    nbformat.write(nb, sys.argv[1])
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                print(out.get("text", "")[-800:])
            elif out.get("output_type") == "error":
                print("ERROR", out.get("ename"), out.get("evalue"))
EOF
  echo "tutorial 10: exit $? in $((SECONDS - t0)) s"; tail -25 "$OUT/10_off_policy.txt"
}

python3 bench/_common.py --for "bash scripts/gpu/issue46.sh $PART" > "$OUT/environment-issue46-$PART.json"
case "$PART" in
  all) bash "$(dirname "$0")/offpolicy.sh" conformance; tutorial ;;
  tutorial) tutorial ;;
  *) echo "usage: bash scripts/gpu/issue46.sh [all|tutorial]" >&2
     exit 2 ;;
esac
ps aux | grep -E "[s]glang.launch_server" | head -5 > "$OUT/leftover-issue46-$PART.txt"
echo "leftover server processes: $(wc -l < "$OUT/leftover-issue46-$PART.txt")"
