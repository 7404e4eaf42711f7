"""Checks the Helm chart's rendered objects offline (scripts/lib/chart.sh).

    chart_check.py DOCSTREAM_BIN RENDERED.yaml...

For every object of every rendered file:
- a Kubernetes object is validated, strictly (no field Kubernetes does not
  know), against the JSON schemas kubernetes-validate bundles, at the oldest
  and the newest Kubernetes the chart supports;
- a custom resource (KEDA's ScaledObject, the Prometheus operator's
  ServiceMonitor and PrometheusRule) against the schema of the fields the
  chart sets, in deploy/helm/docstream/ci/schemas/;
- each docstream container's environment is given to `docstream settings`
  (and nothing else: no variable of this process leaks in), which refuses a
  variable no setting reads and a value that breaks a setting's rules. The
  files its `*_FILE` variables name are made in a temporary folder.

Exits non-zero, naming the object and what is wrong, on the first file that
has a failure (every object of it reported).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

# The chart's kubeVersion is >=1.27; the newest the validator bundles.
KUBERNETES = ["1.27.0", kubernetes_validate.latest_version()]
SCHEMAS = Path(__file__).resolve().parents[2] / "deploy/helm/docstream/ci/schemas"
CUSTOM = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.json",
}
# A Kafka properties file as a secured release mounts one.
PROPERTIES = "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=docstream\n"


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The docstream containers of a Deployment or a Job."""
    if obj.get("kind") not in ("Deployment", "Job"):
        return []
    spec = obj["spec"]["template"]["spec"]
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def settings_check(binary: str, container: dict[str, Any], scratch: Path) -> str | None:
    """`docstream settings` on the container's environment: None when it
    passes, else what it said."""
    env = {"PATH": "/usr/bin:/bin"}
    for var in container.get("env", []):
        name, value = var["name"], var.get("value", "")
        if name.endswith("_FILE"):
            # The mounted secret or properties file, made here.
            path = scratch / name
            content = PROPERTIES if name == "DOCSTREAM_KAFKA_PROPERTIES_FILE" else secret_for(name)
            path.write_text(content)
            value = str(path)
        env[name] = value
    run = subprocess.run([binary, "settings"], env=env, capture_output=True, text=True)
    if run.returncode != 0:
        return run.stderr.strip()
    return None


def secret_for(file_var: str) -> str:
    """A stand-in for the secret a `*_FILE` variable names, valid for it."""
    if file_var == "DATABASE_URL_FILE":
        return "postgres://docstream:secret@postgres:5432/docstream?sslmode=verify-full\n"
    return "a-secret-of-at-least-sixteen-bytes\n"


def check(binary: str, path: Path) -> list[str]:
    failures = []
    objects = [o for o in yaml.safe_load_all(path.read_text()) if o]
    if not objects:
        return [f"{path}: renders nothing"]
    with tempfile.TemporaryDirectory() as scratch:
        for obj in objects:
            name = f"{path.name}: {obj.get('kind')} {obj.get('metadata', {}).get('name')}"
            custom = CUSTOM.get((obj.get("apiVersion"), obj.get("kind")))
            try:
                if custom:
                    schema = json.loads((SCHEMAS / custom).read_text())
                    jsonschema.validate(obj, schema)
                else:
                    for version in KUBERNETES:
                        kubernetes_validate.validate(obj, version, strict=True)
            except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as e:
                failures.append(f"{name}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                failures.append(f"{name}: no schema to check it against ({e})")
            for container in containers(obj):
                said = settings_check(binary, container, Path(scratch))
                if said:
                    failures.append(f"{name}, container {container['name']}: {said}")
    return failures


def main() -> int:
    binary, files = sys.argv[1], [Path(p) for p in sys.argv[2:]]
    failed = False
    for path in files:
        failures = check(binary, path)
        objects = len([o for o in yaml.safe_load_all(path.read_text()) if o])
        print(f"{path.name}: {objects} objects, {len(failures)} failures")
        for failure in failures:
            print(f"  {failure}")
        failed = failed or bool(failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
