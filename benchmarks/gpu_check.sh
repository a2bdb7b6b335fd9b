#!/usr/bin/env bash
# The GPU check in one shot, for a lent GPU machine that has a copy of this working tree and no network:
# installs nothing, uses this checkout through PYTHONPATH, and first says what the machine's Python can
# import (a missing package is a line here, not a traceback later). The table goes to $OUT/gpu_check.md
# ($OUT: the folder that comes back; /tmp without one) with the log beside it; the exit status is
# gpu_check.py's (0 all passed, 1 a check failed, 2 bad arguments or no CUDA device, 124 past the limit).
#
#   bash benchmarks/gpu_check.sh [gpu_check.py flags]     # PYTHON=... to choose the interpreter
#
# The limit (GPU_CHECK_LIMIT_S, default 540 s) stays under a 600 s command limit, so the table written so
# far still comes back when a run is cut short.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if command -v nvidia-smi >/dev/null; then nvidia-smi -L | head -4; else echo "no nvidia-smi on PATH"; fi
"$PY" -c "import torch; print(torch.cuda.is_available())"
"$PY" - <<'EOF'
import importlib.util, sys
import torch
name = f": {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"{torch.cuda.device_count()} device(s){name}")
missing = [m for m in ("numpy", "scipy", "pymetis", "zmq", "cryptography", "psutil", "tqdm", "torch_geometric")
           if importlib.util.find_spec(m) is None]
print("missing: " + ", ".join(missing) + " (torch_geometric alone: add --no-pyg)" if missing else "every package found")
EOF
timeout "${GPU_CHECK_LIMIT_S:-540}" "$PY" benchmarks/gpu_check.py --device cuda --markdown "$OUT/gpu_check.md" "$@" \
  2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
