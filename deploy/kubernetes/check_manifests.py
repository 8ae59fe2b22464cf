"""Checks deploy/kubernetes: every manifest against the Kubernetes schemas that
`kubernetes-validate` bundles (strict: an unknown field fails), the ServiceMonitor
(a CRD: no bundled schema) against the fields of the Prometheus operator's
monitoring.coreos.com/v1 that it uses, and what ties the files together:

- the serve config in the ConfigMap parses as TOML and its drain_seconds is below
  terminationGracePeriodSeconds (with room for the sessions to release);
- requests equal limits, one `nvidia.com/gpu`, and the memory request covers the
  pin ceiling (pinned host memory is counted by the container's cgroup);
- /health is the liveness probe, /ready the readiness probe, on the served port;
- the models volume is mounted read-only from a ReadOnlyMany claim;
- the Service and the ServiceMonitor select the Deployment's pods, by a port name
  the Service has.

Exit 0 when every check passes; 1 with each failure named otherwise.
Usage: python deploy/kubernetes/check_manifests.py [DIR]"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

# The ServiceMonitor fields this repository uses, as the operator's CRD types them
# (prometheus-operator, monitoring.coreos.com/v1, ServiceMonitorSpec / Endpoint).
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "labels": {"type": "object"}},
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}
                    },
                },
                "namespaceSelector": {"type": "object"},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "scheme": {"enum": ["http", "https"]},
                        },
                        "required": ["port", "path"],
                    },
                },
            },
        },
    },
}
# What the process needs beside the pinned memory (tokenizers, HTTP, host activations).
PROCESS_OVERHEAD_BYTES = 2 * 2**30
# How long the sessions get to release both budgets after the drain.
RELEASE_MARGIN_SECONDS = 5
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9}


def quantity_bytes(text: str) -> float:
    """A Kubernetes quantity (`28Gi`) or a stagehand size (`24GiB`) in bytes."""
    match = re.fullmatch(r"([0-9.]+)\s*([KMGT]i?)?B?", str(text).strip())
    if not match:
        raise ValueError(f"not a size: {text!r}")
    number, unit = match.groups()
    return float(number) * UNITS.get(unit or "", 1)


def load(directory: Path) -> dict[str, dict]:
    resources = {}
    for path in sorted(directory.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                resources[f"{document['kind']}/{document.get('metadata', {}).get('name', path.stem)}"] = {
                    "path": path,
                    "body": document,
                }
    return resources


def schema_checks(resources: dict[str, dict], failures: list[str], notes: list[str]) -> None:
    for key, resource in resources.items():
        body = resource["body"]
        if body["kind"] == "ServiceMonitor":
            try:
                jsonschema.validate(body, SERVICE_MONITOR_SCHEMA)
                notes.append(f"{key}: a CRD, checked against the fields it uses (no bundled schema)")
            except jsonschema.ValidationError as error:
                failures.append(f"{key}: {error.message} at {list(error.absolute_path)}")
            continue
        if body["kind"] == "Kustomization":
            listed = set(body.get("resources", []))
            present = {p.name for p in resource["path"].parent.glob("*.yaml")} - {resource["path"].name}
            if listed != present:
                failures.append(f"{key}: lists {sorted(listed)}, the folder has {sorted(present)}")
            notes.append(f"{key}: kustomize's own file (no schema): its list matches the folder")
            continue
        try:
            kubernetes_validate.validate(body, kubernetes_validate.latest_version(), strict=True)
        except kubernetes_validate.ValidationError as error:
            failures.append(f"{key} ({resource['path'].name}): {error.message} at {list(error.path)}")
        except kubernetes_validate.SchemaNotFoundError as error:
            failures.append(f"{key}: no schema: {error}")


def find(resources: dict[str, dict], kind: str) -> dict:
    found = [r["body"] for r in resources.values() if r["body"]["kind"] == kind]
    if len(found) != 1:
        raise LookupError(f"expected one {kind}, found {len(found)}")
    return found[0]


def consistency_checks(resources: dict[str, dict], failures: list[str]) -> None:
    def check(condition: bool, message: str) -> None:
        if not condition:
            failures.append(message)

    deployment = find(resources, "Deployment")
    config_map = find(resources, "ConfigMap")
    service = find(resources, "Service")
    monitor = find(resources, "ServiceMonitor")
    claim = find(resources, "PersistentVolumeClaim")
    serve = tomllib.loads(config_map["data"]["serve.toml"])
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]

    drain = float(serve.get("limits", {}).get("drain_seconds", 30))
    grace = pod.get("terminationGracePeriodSeconds", 30)
    check(grace >= drain + RELEASE_MARGIN_SECONDS,
          f"terminationGracePeriodSeconds {grace} is not above drain_seconds {drain} + {RELEASE_MARGIN_SECONDS}")

    resources_ = container["resources"]
    check(resources_.get("requests") == resources_.get("limits"),
          "requests differ from limits: pinned memory needs Guaranteed QoS")
    requests = resources_.get("requests", {})
    check(str(requests.get("nvidia.com/gpu")) == "1", "a pod asks for one nvidia.com/gpu")
    pin = serve.get("budget", {}).get("pin_ceiling")
    if pin is None:
        failures.append("serve.toml has no [budget] pin_ceiling to size the memory request by")
    else:
        need = quantity_bytes(pin) + PROCESS_OVERHEAD_BYTES
        have = quantity_bytes(requests.get("memory", "0"))
        check(have >= need, f"memory request {requests.get('memory')} is below pin_ceiling {pin} + 2 GiB")

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    bind_port = int(serve["bind"].rsplit(":", 1)[1])
    check(ports.get("http") == bind_port, f"container port http is not serve's bind port {bind_port}")
    check(serve["bind"].startswith("0.0.0.0:"), "serve binds 127.0.0.1 in a pod: bind 0.0.0.0")
    for probe, path in (("livenessProbe", "/health"), ("readinessProbe", "/ready")):
        got = container.get(probe, {}).get("httpGet", {})
        check(got.get("path") == path and got.get("port") in ("http", bind_port),
              f"{probe} is not GET {path} on the served port")

    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    models = mounts.get("models", {})
    check(models.get("readOnly") is True, "the models volume is not mounted read-only")
    claim_ref = volumes.get("models", {}).get("persistentVolumeClaim", {})
    check(claim_ref.get("claimName") == claim["metadata"]["name"] and claim_ref.get("readOnly") is True,
          "the models volume is not the read-only claim")
    check(claim["spec"]["accessModes"] == ["ReadOnlyMany"], "the models claim is not ReadOnlyMany")
    for model in serve.get("models", []):
        check(model["folder"].startswith(models.get("mountPath", "/models") + "/"),
              f"model {model['name']} is not on the models volume: {model['folder']}")

    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selected = lambda selector: all(pod_labels.get(k) == v for k, v in selector.items())  # noqa: E731
    check(selected(deployment["spec"]["selector"]["matchLabels"]), "the Deployment's selector misses its pods")
    check(selected(service["spec"]["selector"]), "the Service does not select the pods")
    service_labels = service["metadata"].get("labels", {})
    check(all(service_labels.get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items()),
          "the ServiceMonitor does not select the Service")
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        check(endpoint["port"] in service_ports, f"the ServiceMonitor scrapes port {endpoint['port']} the Service lacks")
        check(endpoint["path"] == "/metrics", "the ServiceMonitor does not scrape /metrics")


def main(argv: list[str]) -> int:
    directory = Path(argv[0]) if argv else Path(__file__).resolve().parent
    resources = load(directory)
    failures: list[str] = []
    notes: list[str] = []
    schema_checks(resources, failures, notes)
    try:
        consistency_checks(resources, failures)
    except (LookupError, KeyError, ValueError) as error:
        failures.append(f"cannot check the manifests together: {error!r}")
    version = kubernetes_validate.latest_version()
    for note in notes:
        print(f"note: {note}")
    if failures:
        for failure in failures:
            print(f"FAIL: {failure}")
        return 1
    print(f"ok: {len(resources)} manifests in {directory} (schemas of Kubernetes {version}, strict)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
