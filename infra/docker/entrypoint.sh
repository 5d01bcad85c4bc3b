#!/bin/sh
# The xylent image's one entrypoint: which service this container is comes from its
# first argument, so the Prefect server, the MLflow server and the worker all run the
# versions the project was installed with (no package is fetched at container start).
#
#   prefect-server            Prefect API + UI on :4200 (PREFECT_API_DATABASE_CONNECTION_URL)
#   mlflow-server             MLflow tracking server on :5000 proxying artifacts
#                             (MLFLOW_BACKEND_STORE_URI, MLFLOW_ARTIFACTS_DESTINATION);
#                             MLFLOW_ALLOWED_HOSTS: names the team opens it by, added to
#                             mlflow, loopback and private addresses (MLflow refuses any
#                             other Host header with 403, against DNS rebinding);
#                             MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true: MLflow's GenAI
#                             job runner, off by default
#   deploy                    register prefect.yaml's deployments (and the work pool), then exit
#   worker [ARGS]             a process worker on pool $XYLENT_POOL (default xylent)
#   xylent ARGS | ANY COMMAND run it as given (e.g. `xylent run pipeline --spec ...`)
set -eu

: "${XYLENT_HOME:=$(cd "$(dirname "$0")/../.." && pwd)}"
: "${XYLENT_POOL:=xylent}"
: "${WAIT_TIMEOUT_S:=120}"
export XYLENT_HOME

# Wait until URL answers 2xx (the service this one needs is still starting), or give up
# naming it: a container that exits is restarted; one that hangs is not.
wait_for() {
    python - "$1" "$WAIT_TIMEOUT_S" <<'PY'
import sys, time, urllib.request
url, limit = sys.argv[1], float(sys.argv[2])
deadline, last = time.time() + limit, None
while True:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            if r.status < 300:
                break
    except Exception as exc:
        last = exc
    if time.time() > deadline:
        sys.exit(f"entrypoint: {url} did not answer within {limit:.0f} s ({last}); is that service up?")
    time.sleep(1)
PY
}

need() {
    eval "value=\${$1:-}"
    if [ -z "$value" ]; then
        echo "entrypoint: $2 needs $1 set (see infra/docker-compose.yml)" >&2
        exit 2
    fi
}

# hosts, origins: MLflow's --allowed-hosts and --cors-allowed-origins for the names given (a name
# as name and name:*; name:port and patterns as given); globbing off: 10.* is a pattern, not files
allowed_hosts() {
    hosts="" origins=""
    set -f
    for name in "$@"; do
        case "$name" in
            *\**|*:*[!\]]) forms="$name" ;;
            "["*"]") forms="$name [[]${name#[}:*" ;;  # fnmatch reads [::1] as a class: MLflow's escape
            *) forms="$name $name:*" ;;
        esac
        for form in $forms; do
            hosts="${hosts:+$hosts,}$form"
            origins="${origins:+$origins,}http://$form,https://$form"
        done
    done
    set +f
}

service="${1:-worker}"
[ $# -gt 0 ] && shift

case "$service" in
    prefect-server)
        exec prefect server start --host 0.0.0.0 --port 4200 "$@"
        ;;
    mlflow-server)
        need MLFLOW_BACKEND_STORE_URI mlflow-server
        need MLFLOW_ARTIFACTS_DESTINATION mlflow-server
        # MLflow's --allowed-hosts replaces its default (loopback and private addresses), which refuses
        # http://mlflow:5000, the name every other container uses; a name given without a port must
        # match with any port too (the Host header carries it), and the UI's own POSTs carry an Origin
        # that MLflow checks apart: each name is allowed as name, name:* and http(s)://name[:*]
        set -f
        # shellcheck disable=SC2046  # the comma-separated list, split into words on purpose
        allowed_hosts mlflow localhost 127.0.0.1 "[::1]" 0.0.0.0 "10.*" "192.168.*" \
            $(for i in $(seq 16 31); do printf '172.%s.* ' "$i"; done) "fc00:*" "fd00:*" \
            $(echo "${MLFLOW_ALLOWED_HOSTS:-}" | tr ',' ' ')
        set +f
        # MLflow's job runner (its GenAI scorers, prompt optimisation and evaluation: nothing xylent
        # submits) starts seven worker processes that each import MLflow: about 2 GB, and 45 s of CPU
        # on a 2-core host before the first request. Off unless the team sets it.
        export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"
        exec mlflow server --host "${MLFLOW_HOST:-0.0.0.0}" --port "${MLFLOW_PORT:-5000}" --workers 1 \
            --allowed-hosts "$hosts" --cors-allowed-origins "$origins" \
            --backend-store-uri "$MLFLOW_BACKEND_STORE_URI" \
            --artifacts-destination "$MLFLOW_ARTIFACTS_DESTINATION" --serve-artifacts "$@"
        ;;
    deploy|worker)
        need PREFECT_API_URL "$service"
        wait_for "$PREFECT_API_URL/health"
        # an existing pool is fine: every worker container runs this
        prefect work-pool create "$XYLENT_POOL" --type process >/dev/null 2>&1 || true
        if [ "$service" = deploy ]; then
            cd "$XYLENT_HOME"
            exec prefect --no-prompt deploy --all "$@"
        fi
        # xylent's worker: Prefect's, with SIGINT restored (a worker started with SIGINT ignored, as
        # a shell's background job is, did not stop on SIGTERM)
        exec xylent worker --pool "$XYLENT_POOL" "$@"
        ;;
    *)
        exec "$service" "$@"
        ;;
esac
