#!/usr/bin/env bash
# The whole GPU check of issue 33 in one command, for a machine with an NVIDIA GPU and no
# internet (at most 8 minutes on one H100):
#   1. checks that torch sees CUDA (else says what to do and stops);
#   2. installs the project (pip install --no-deps -e ., no download);
#   3. runs the device-generic tests on CUDA: pytest -m device_generic --device cuda;
#   4. benchmarks on CUDA: python -m benchmarks.gpu --device cuda, which writes
#      benchmarks/RESULTS-cuda.md (GPU model, torch version, test counts, every ratio).
# Logs, the JUnit XML and RESULTS-cuda.md go to $OUT when it is set (the device tool's
# folder that comes back), else to benchmarks/out/.
#
#   bash scripts/gpu_check.sh                # the whole run
#   TEST_TIMEOUT=200 BENCH_TIMEOUT=150 bash scripts/gpu_check.sh
#   SKIP_TESTS=1 bash scripts/gpu_check.sh   # benchmarks only (a rerun)
#   DEVICE=cpu QUICK=1 NO_INSTALL=1 TESTS=tests/devices/test_devices.py bash scripts/gpu_check.sh
#                                            # the script's own dry run, on a CPU machine
#
# Without pytest/hypothesis on the machine, put their wheels in .gpu-wheels/ first (here:
# pip download --no-deps -d .gpu-wheels pytest hypothesis pluggy iniconfig packaging
# sortedcontainers attrs) and carry that folder; the script installs them offline.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
LOGS=${OUT:-benchmarks/out}
mkdir -p "$LOGS"
DEVICE=${DEVICE:-cuda}
TESTS=${TESTS:-tests}
TEST_TIMEOUT=${TEST_TIMEOUT:-250}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-170}
# The CUDA paths never call the C kernels; this keeps a first-use compile (tens of seconds)
# out of the few CPU steps the tests take.
export MASKED_SPARSE_NATIVE=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log() { echo "[gpu_check $(( $(date +%s) - START ))s] $*"; }

# 1. CUDA --------------------------------------------------------------------------------
if [ "$DEVICE" = cuda ]; then
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$LOGS/nvidia-smi.txt"
if ! python -c "import torch, sys; print('torch', torch.__version__, 'CUDA', torch.version.cuda,
'available', torch.cuda.is_available()); sys.exit(0 if torch.cuda.is_available() else 1)"; then
    cat <<'EOF'
[gpu_check] torch does not see CUDA here. Either this python's torch is a CPU build
(torch.version.cuda is None: install a CUDA build of torch from a local wheel, e.g.
`pip install --no-index --find-links <dir> torch`), or the driver / GPU is missing
(nvidia-smi above fails: run on the GPU machine). Nothing was run.
EOF
    exit 2
fi
fi

# 2. install -----------------------------------------------------------------------------
if [ -n "${NO_INSTALL:-}" ]; then
    log "not installed (NO_INSTALL): running from the checkout"
elif python -m pip install --quiet --no-deps --no-build-isolation -e . > "$LOGS/install.log" 2>&1; then
    log "installed (pip install --no-deps -e .)"
else
    log "pip install -e . failed (see install.log); running from the checkout (PYTHONPATH)"
fi
python -m masked_sparse > /dev/null || { log "python -m masked_sparse fails: stop"; exit 3; }

# 3. tests on CUDA -----------------------------------------------------------------------
if [ -z "${SKIP_TESTS:-}" ]; then
    if ! python -c "import pytest, hypothesis" 2>/dev/null && [ -d .gpu-wheels ]; then
        python -m pip install --quiet --no-index --find-links .gpu-wheels pytest hypothesis \
            >> "$LOGS/install.log" 2>&1
    fi
    if python -c "import pytest, hypothesis" 2>/dev/null; then
        log "pytest $TESTS -m device_generic --device $DEVICE (timeout ${TEST_TIMEOUT}s)"
        # SIGINT first: pytest stops like a Ctrl-C and still writes its summary and XML.
        timeout -s INT -k 20 "$TEST_TIMEOUT" python -m pytest $TESTS -m device_generic \
            --device "$DEVICE" -p no:randomly -rfE --tb=short --continue-on-collection-errors \
            --junitxml="$LOGS/cuda-tests.xml" > "$LOGS/cuda-tests.log" 2>&1
        log "pytest exit status $? (log: $LOGS/cuda-tests.log)"
        tail -n 40 "$LOGS/cuda-tests.log"
    else
        log "pytest / hypothesis are not installed and there is no .gpu-wheels/: tests skipped"
    fi
fi

# 4. benchmarks on CUDA ------------------------------------------------------------------
RESULTS=benchmarks/RESULTS-$DEVICE.md
log "python -m benchmarks.gpu --device $DEVICE ${QUICK:+--quick }(timeout ${BENCH_TIMEOUT}s)"
timeout -s INT -k 20 "$BENCH_TIMEOUT" python -m benchmarks.gpu --device "$DEVICE" \
    ${QUICK:+--quick} --tests "$LOGS/cuda-tests.xml" --out "$RESULTS" > "$LOGS/bench.log" 2>&1
status=$?
cat "$LOGS/bench.log"
cp "$RESULTS" "$LOGS/" 2>/dev/null || true
log "benchmarks exit status $status; done in $(( $(date +%s) - START ))s"
exit $status
