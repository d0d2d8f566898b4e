"""Offline validation of deploy/k8s (docs/DEPLOY.md), as strict as this
machine allows without a cluster:

1. every manifest parses (PyYAML) and validates against the vendored
   subset of the Kubernetes OpenAPI schema in k8s_schema.json (JSON Schema
   via python3-jsonschema: required fields, types, enums, unknown fields
   rejected);
2. the Kustomize base lists exactly the manifests present;
3. structure: selectors match the pod labels (Deployment, Service, PDB),
   the HPA targets the Deployment, the Service's target ports are named
   container ports, the ports are TF Serving's and the Dockerfile's, probe
   paths are routes Kiln serves (src/serve/routes.c), preStop + drain time
   (KILN_SERVE_DRAIN_MS) fit the grace period, the pod runs as the image's
   non-root user with a read-only root, resources are set, mounts name
   volumes, the ConfigMap holds the monitoring file the args name, and the
   HPA's pods metric is one Kiln exports (src/serve/metrics.c).

Then it proves it can fail: a set of broken copies (a typo'd field, a bad
enum, a selector that matches nothing, a probe on a path Kiln lacks, a
grace period shorter than the drain, ...) must each be caught.
usage: check_k8s.py REPO_ROOT
"""

import copy
import json
import re
import sys
from pathlib import Path

import jsonschema
import yaml

REPO = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
K8S = REPO / "deploy" / "k8s"
SCHEMA = json.loads((REPO / "tests" / "deploy" / "k8s_schema.json").read_text())


def load():
    docs = {}
    for p in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(p.read_text()):
            if d is not None:
                docs.setdefault(p.name, []).append(d)
    return docs


def schema_errors(doc):
    key = f"{doc.get('apiVersion')}/{doc.get('kind')}"
    if key not in SCHEMA["kinds"]:
        return [f"{key}: no schema for this apiVersion/kind"]
    root = dict(SCHEMA)
    root["$ref"] = "#/kinds/" + key.replace("~", "~0").replace("/", "~1")
    v = jsonschema.Draft7Validator(root)
    return [f"{key} {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc)]


def subset(a, b):
    return bool(a) and all(b.get(k) == v for k, v in a.items())


def check(docs, files_present):
    errs = []
    by_kind = {}
    for name, ds in docs.items():
        for d in ds:
            errs += [f"{name}: {e}" for e in schema_errors(d)]
            by_kind.setdefault(d.get("kind"), []).append(d)
    if errs:
        return errs
    kust = by_kind.get("Kustomization", [{}])[0]
    want = sorted(f for f in files_present if f != "kustomization.yaml")
    if sorted(kust.get("resources", [])) != want:
        errs.append(f"kustomization resources {kust.get('resources')} != manifests {want}")
    dep = by_kind["Deployment"][0]
    tmpl = dep["spec"]["template"]
    labels = tmpl["metadata"]["labels"]
    pod = tmpl["spec"]
    if not subset(dep["spec"]["selector"].get("matchLabels", {}), labels):
        errs.append("Deployment selector does not match its pod labels")
    for svc in by_kind.get("Service", []):
        if not subset(svc["spec"].get("selector", {}), labels):
            errs.append(f"Service {svc['metadata']['name']} selector matches no Kiln pod")
    for pdb in by_kind.get("PodDisruptionBudget", []):
        if not subset(pdb["spec"]["selector"].get("matchLabels", {}), labels):
            errs.append("PodDisruptionBudget selector matches no Kiln pod")
    for hpa in by_kind.get("HorizontalPodAutoscaler", []):
        ref = hpa["spec"]["scaleTargetRef"]
        if (ref.get("apiVersion"), ref["kind"], ref["name"]) != (dep["apiVersion"], "Deployment",
                                                                  dep["metadata"]["name"]):
            errs.append(f"HPA targets {ref}, not the Deployment")
        if hpa["spec"].get("minReplicas", 1) > hpa["spec"]["maxReplicas"]:
            errs.append("HPA minReplicas > maxReplicas")
        metrics_c = (REPO / "src" / "serve" / "metrics.c").read_text()
        for m in hpa["spec"].get("metrics", []):
            if m["type"] == "Pods" and f"# TYPE {m['pods']['metric']['name']} " not in metrics_c:
                errs.append(f"HPA metric {m['pods']['metric']['name']} is not one Kiln exports")
    c = pod["containers"][0]
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    if sorted(ports.values()) != [8500, 8501]:
        errs.append(f"container ports {ports} are not TF Serving's 8500 (gRPC) and 8501 (REST)")
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    exposed = sorted(int(x) for x in re.search(r"^EXPOSE (.*)$", dockerfile, re.M).group(1).split())
    if exposed != sorted(ports.values()):
        errs.append(f"Dockerfile EXPOSE {exposed} != container ports {sorted(ports.values())}")
    for svc in by_kind.get("Service", []):
        for p in svc["spec"]["ports"]:
            t = p.get("targetPort", p["port"])
            if (t not in ports) if isinstance(t, str) else (t not in ports.values()):
                errs.append(f"Service port {p['port']} targets {t!r}, not a container port")
    routes = (REPO / "src" / "serve" / "routes.c").read_text()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        pr = c.get(probe)
        if not pr:
            if probe != "startupProbe":
                errs.append(f"no {probe}")
            continue
        g = pr.get("httpGet", {})
        if f'"{g.get("path")}"' not in routes:
            errs.append(f"{probe} path {g.get('path')!r} is not a route of src/serve/routes.c")
        if g.get("port") not in ports and g.get("port") not in ports.values():
            errs.append(f"{probe} port {g.get('port')!r} is not a container port")
    if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/v2/health/ready":
        errs.append("readinessProbe must be /v2/health/ready")
    if c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/v2/health/live":
        errs.append("livenessProbe must be /v2/health/live")
    serve_c = (REPO / "src" / "cli" / "cmd_serve.c").read_text()
    drain_s = int(re.search(r"#define KILN_SERVE_DRAIN_MS (\d+)", serve_c).group(1)) / 1000
    pre = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if not pre:
        errs.append("no preStop sleep: the pod would get SIGTERM while still in the Service")
    if not pre + drain_s <= grace <= pre + drain_s + 10:
        errs.append(f"terminationGracePeriodSeconds {grace} does not match preStop {pre} s + "
                    f"drain {drain_s:g} s (want between {pre + drain_s:g} and {pre + drain_s + 10:g})")
    user = re.search(r"^USER (\d+)", dockerfile, re.M).group(1)
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    if not (psc.get("runAsNonRoot") or csc.get("runAsNonRoot")):
        errs.append("runAsNonRoot is not set")
    if str(psc.get("runAsUser", csc.get("runAsUser"))) != user:
        errs.append(f"runAsUser is not the image's USER {user}")
    if not csc.get("readOnlyRootFilesystem"):
        errs.append("readOnlyRootFilesystem is not set")
    if csc.get("allowPrivilegeEscalation") is not False:
        errs.append("allowPrivilegeEscalation is not false")
    res = c.get("resources", {})
    if "cpu" not in res.get("requests", {}) or "memory" not in res.get("requests", {}) or \
            "memory" not in res.get("limits", {}):
        errs.append("resources: cpu and memory requests and a memory limit are required")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        if m["name"] not in vols:
            errs.append(f"volumeMount {m['name']} names no volume")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    if env.get("MODEL_BASE_PATH") != "/models" or "MODEL_NAME" not in env:
        errs.append("MODEL_NAME and MODEL_BASE_PATH=/models are TF Serving's conventions")
    cms = {cm["metadata"]["name"]: cm for cm in by_kind.get("ConfigMap", [])}
    for v in vols.values():
        if "configMap" in v:
            name = v["configMap"].get("name")
            if name not in cms:
                errs.append(f"volume {v['name']} names ConfigMap {name!r}, which is not in the base")
                continue
            mount = next((m["mountPath"] for m in c.get("volumeMounts", [])
                          if m["name"] == v["name"]), None)
            for a in c.get("args", []):
                if mount and a.startswith("--monitoring_config_file=" + mount + "/"):
                    key = a.split("=", 1)[1][len(mount) + 1:]
                    if key not in cms[name].get("data", {}):
                        errs.append(f"ConfigMap {name} has no {key}")
                    else:
                        path = re.search(r'path: "([^"]+)"', cms[name]["data"][key]).group(1)
                        ann = tmpl["metadata"].get("annotations", {}).get("prometheus.io/path")
                        if ann and ann != path:
                            errs.append(f"prometheus.io/path {ann} != monitoring path {path}")
    return errs


def broken_variants(docs):
    """(description, mutated docs) pairs that a correct checker must reject."""
    def dep(d):
        return next(x for x in d["deployment.yaml"] if x["kind"] == "Deployment")

    def mutate(desc, fn):
        d = copy.deepcopy(docs)
        fn(d)
        return desc, d

    def c0(d):
        return dep(d)["spec"]["template"]["spec"]["containers"][0]
    return [
        mutate("unknown field (typo)", lambda d: c0(d).__setitem__("readinesProbe", {})),
        mutate("bad enum", lambda d: c0(d).__setitem__("imagePullPolicy", "Sometimes")),
        mutate("wrong type", lambda d: dep(d)["spec"].__setitem__("replicas", "two")),
        mutate("missing required", lambda d: c0(d).pop("image")),
        mutate("selector mismatch", lambda d: d["service.yaml"][0]["spec"]["selector"]
               .__setitem__("app.kubernetes.io/name", "kiln-typo")),
        mutate("probe path not served",
               lambda d: c0(d)["readinessProbe"]["httpGet"].__setitem__("path", "/healthz")),
        mutate("grace shorter than drain",
               lambda d: dep(d)["spec"]["template"]["spec"].__setitem__(
                   "terminationGracePeriodSeconds", 8)),
        mutate("root filesystem writable",
               lambda d: c0(d)["securityContext"].__setitem__("readOnlyRootFilesystem", False)),
        mutate("service targets a missing port",
               lambda d: d["service.yaml"][0]["spec"]["ports"][0].__setitem__("targetPort", "grcp")),
        mutate("HPA on an unknown metric",
               lambda d: d["hpa.yaml"][0]["spec"]["metrics"][1]["pods"]["metric"]
               .__setitem__("name", "requests_in_flight")),
        mutate("PDB with both minAvailable and maxUnavailable",
               lambda d: d["pdb.yaml"][0]["spec"].__setitem__("maxUnavailable", 1)),
    ]


def main():
    docs = load()
    files = sorted(docs)
    errs = check(docs, files)
    for e in errs:
        print("FAIL:", e)
    if errs:
        return 1
    n = sum(len(v) for v in docs.values())
    print(f"ok: {n} manifests in {len(files)} files valid and consistent")
    missed = []
    for desc, d in broken_variants(docs):
        found = check(d, files)
        if not found:
            missed.append(desc)
        else:
            print(f"ok: rejects {desc}: {found[0]}")
    for m in missed:
        print("FAIL: the checker accepted a broken variant:", m)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
