#!/bin/sh
# The xylent image's one entrypoint: which service this container is comes from its
# first argument, so the Prefect server, the MLflow server and the worker all run the
# versions the project was installed with (no package is fetched at container start).
#
#   prefect-server            Prefect API + UI on :4200 (PREFECT_API_DATABASE_CONNECTION_URL)
#   mlflow-server             MLflow tracking server on :5000 proxying artifacts
#                             (MLFLOW_BACKEND_STORE_URI, MLFLOW_ARTIFACTS_DESTINATION);
#                             MLFLOW_ALLOWED_HOSTS: the Host headers it answers (MLflow
#                             refuses any other with 403, against DNS rebinding)
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

service="${1:-worker}"
[ $# -gt 0 ] && shift

case "$service" in
    prefect-server)
        exec prefect server start --host 0.0.0.0 --port 4200 "$@"
        ;;
    mlflow-server)
        need MLFLOW_BACKEND_STORE_URI mlflow-server
        need MLFLOW_ARTIFACTS_DESTINATION mlflow-server
        # the compose service name and loopback by default: MLflow's own default (localhost and private
        # IPs) refuses http://mlflow:5000, the name every other container uses; add the names a team
        # opens the UI by (MLFLOW_ALLOWED_HOSTS=mlflow.example.com,...), each name:* for any port
        exec mlflow server --host "${MLFLOW_HOST:-0.0.0.0}" --port "${MLFLOW_PORT:-5000}" --workers 1 \
            --allowed-hosts "${MLFLOW_ALLOWED_HOSTS:-mlflow,mlflow:*,localhost,localhost:*,127.0.0.1,127.0.0.1:*}" \
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
        exec prefect worker start --pool "$XYLENT_POOL" "$@"
        ;;
    *)
        exec "$service" "$@"
        ;;
esac
