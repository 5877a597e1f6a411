# Shared by the GPU-machine scripts (gpu_check.sh, perf_check.sh, gpu_final.sh, tp_check.sh): source it.
# use_wheels: install the wheels carried in .whl/ (what the lent machine lacks) into /tmp/site, set PYTHONPATH.
# step TITLE: a section header with the time.  wait_health PORT [SECONDS]: until GET /health answers 200.
use_wheels() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || return 1
    export PYTHONPATH=$PWD:/tmp/site
  else
    export PYTHONPATH=$PWD
  fi
}
step() { echo; echo "=== $1 ($(date +%T))"; }
wait_health() {
  python3 - "$1" "${2:-120}" <<'PY'
import sys, time, httpx
port, limit = sys.argv[1], float(sys.argv[2])
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    try:
        if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(0.5)
sys.exit(f"no /health on port {port} within {limit:g}s")
PY
}
