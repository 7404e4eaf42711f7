# Sourced by scripts/test.sh: `ensure_helm` builds helm (from its Go module)
# into .services/tools/ (git-ignored), once, and puts it on PATH; the chart's
# checks (`check_chart`, below) lint and render with it. No
# cluster is needed: helm renders offline.

HELM_VERSION=v4.3.2

ensure_helm() {
    local dir; dir="$(pwd -P)/.services/tools/helm-$HELM_VERSION"
    if [ ! -x "$dir/helm" ]; then
        command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"
        if ! command -v go >/dev/null; then
            echo "installing golang-go (to build helm)" >&2
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null
        fi
        echo "building helm $HELM_VERSION into $dir" >&2
        mkdir -p "$dir"
        # -trimpath and no debug symbols: a smaller link, the slow part on
        # two cores.
        GOBIN="$dir" GOFLAGS=-buildvcs=false \
            go install -trimpath -ldflags='-s -w' "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
    fi
    PATH="$dir:$PATH"
}

# kubernetes-validate (PyPI): the Kubernetes JSON schemas, offline.
KUBERNETES_VALIDATE_VERSION=1.37.0

ensure_chart_tools() {
    ensure_helm
    local venv; venv="$(pwd -P)/.services/tools/chart-venv"
    if ! "$venv/bin/python" -c "import kubernetes_validate" 2>/dev/null; then
        echo "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION into $venv" >&2
        python3 -m venv "$venv" >&2 || {
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
            python3 -m venv "$venv" >&2
        }
        "$venv/bin/pip" install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" >&2
    fi
    CHART_PYTHON="$venv/bin/python"
}

# The chart, offline: `helm lint --strict` and `helm template` with each
# values file under its ci/ (the KEDA and Prometheus operator APIs offered,
# so their objects render), every rendered object validated, and every
# container's environment checked by `docstream settings` (the binary $1).
check_chart() {
    local bin="$1" chart=deploy/helm/docstream out; out="$(mktemp -d)"
    local apis=(--api-versions keda.sh/v1alpha1 --api-versions monitoring.coreos.com/v1)
    local values rc=0
    for values in "$chart"/ci/*-values.yaml; do
        local name; name="$(basename "$values" -values.yaml)"
        helm lint --strict "$chart" -f "$values" >"$out/$name.lint" 2>&1 || {
            cat "$out/$name.lint" >&2; rc=1; continue; }
        helm template docstream "$chart" -f "$values" "${apis[@]}" >"$out/$name.yaml" || { rc=1; continue; }
    done
    # A release without its required values is refused, saying which.
    if helm template docstream "$chart" >/dev/null 2>"$out/refused"; then
        echo "the chart rendered without secrets.databaseUrl" >&2; rc=1
    elif ! grep -q "secrets.databaseUrl.secretName is required" "$out/refused"; then
        cat "$out/refused" >&2; rc=1
    fi
    "$CHART_PYTHON" scripts/lib/chart_check.py "$bin" "$out"/*.yaml || rc=1
    rm -rf "$out"
    return $rc
}
