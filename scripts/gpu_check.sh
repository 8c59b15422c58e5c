#!/usr/bin/env bash
# The whole GPU check in one command, for a machine with an NVIDIA GPU
# and no internet (at most 8 minutes on one H100):
#   1. checks that torch sees CUDA (else says what to do and stops);
#   2. installs the project (pip install --no-deps -e ., no download; builds the CPU kernels,
#      which the cross-device test compares against);
#   3. the device's own checks first, short and named: tests/devices/test_cross_device.py
#      (every op family x layout x dtype x dim on the device against the same call on the
#      CPU: values, masks, gradients) and tests/kernels/test_no_host_sync.py (no family
#      syncs with the host, under torch.cuda.set_sync_debug_mode("error"));
#   4. the device-generic tests on CUDA: pytest -m device_generic --device cuda;
#   5. benchmarks on CUDA: python -m benchmarks.gpu --device cuda, which writes
#      benchmarks/RESULTS-cuda.md (GPU model, torch version, test counts, every ratio to
#      the fastest raw kernel, and the rows of layouts/kernels/_device_table.py it measured;
#      ms.attention, the strided masked linear and the density crossover of sparse products);
#   6. python -m benchmarks.bench_training --device cuda (the pruned MLP and optimizer rows).
# Logs, the JUnit XML and RESULTS-cuda.md go to $OUT when it is set (the device tool's
# folder that comes back), else to benchmarks/out/.
#
#   bash scripts/gpu_check.sh                # the whole run
#   TEST_TIMEOUT=200 BENCH_TIMEOUT=150 bash scripts/gpu_check.sh
#   SKIP_TESTS=1 bash scripts/gpu_check.sh   # benchmarks only (a rerun)
#   bash scripts/gpu_check.sh --dry-run      # the script's own dry run, on a CPU machine:
#                                            # DEVICE=cpu QUICK=1 NO_INSTALL=1, the device
#                                            # checks and tests/devices only
#
# Without pytest/hypothesis on the machine, put their wheels in .gpu-wheels/ first (here:
# pip download --no-deps -d .gpu-wheels pytest hypothesis pluggy iniconfig packaging
# sortedcontainers attrs) and carry that folder; the script installs them offline.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--dry-run" ]; then
    export DEVICE=cpu QUICK=1 NO_INSTALL=1 TESTS=${TESTS:-tests/devices}
    export TEST_TIMEOUT=${TEST_TIMEOUT:-600} BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}
    export OUT=${OUT:-benchmarks/out/dry-run}
fi
START=$(date +%s)
LOGS=${OUT:-benchmarks/out}
mkdir -p "$LOGS"
DEVICE=${DEVICE:-cuda}
TESTS=${TESTS:-tests}
TEST_TIMEOUT=${TEST_TIMEOUT:-250}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-170}
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

# 3-4. tests on CUDA -----------------------------------------------------------------------
if [ -z "${SKIP_TESTS:-}" ]; then
    if ! python -c "import pytest, hypothesis" 2>/dev/null && [ -d .gpu-wheels ]; then
        python -m pip install --quiet --no-index --find-links .gpu-wheels pytest hypothesis \
            >> "$LOGS/install.log" 2>&1
    fi
    if python -c "import pytest, hypothesis" 2>/dev/null; then
        log "the device checks: cross-device and host syncs (--device $DEVICE)"
        timeout -s INT -k 20 "$TEST_TIMEOUT" python -m pytest tests/devices/test_cross_device.py \
            tests/kernels/test_no_host_sync.py --device "$DEVICE" -p no:randomly -q -rfE \
            --tb=short --junitxml="$LOGS/device-checks.xml" > "$LOGS/device-checks.log" 2>&1
        log "device checks exit status $? (log: $LOGS/device-checks.log)"
        tail -n 15 "$LOGS/device-checks.log"
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

# 5. benchmarks on CUDA ------------------------------------------------------------------
RESULTS=benchmarks/RESULTS-$DEVICE.md
log "python -m benchmarks.gpu --device $DEVICE ${QUICK:+--quick }(timeout ${BENCH_TIMEOUT}s)"
timeout -s INT -k 20 "$BENCH_TIMEOUT" python -m benchmarks.gpu --device "$DEVICE" \
    ${QUICK:+--quick} --tests "$LOGS/cuda-tests.xml" --out "$RESULTS" > "$LOGS/bench.log" 2>&1
status=$?
cat "$LOGS/bench.log"
cp "$RESULTS" "$LOGS/" 2>/dev/null || true

# 6. the training rows on the device: pruned MLP steps (CSR and strided, 90% and 99%
#    masked) and optimizer steps against W * M / torch.optim --------------------------------
TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-120}
log "python -m benchmarks.bench_training --device $DEVICE (timeout ${TRAIN_TIMEOUT}s)"
timeout -s INT -k 20 "$TRAIN_TIMEOUT" python -m benchmarks.bench_training --device "$DEVICE" \
    ${QUICK:+--quick} > "$LOGS/bench_training.log" 2>&1
cat "$LOGS/bench_training.log"
log "benchmarks exit status $status; done in $(( $(date +%s) - START ))s"
exit $status
