"""Static checks of deploy/kubernetes, deploy/Dockerfile and deploy/config.yaml."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.deploy._deploy import (
    CONTRACT_CONFIG_KEYS,
    DEPLOY,
    K8S,
    ROOT,
    expand_env,
    load_manifests,
)

IMAGE = "ghcr.io/calmon/calmon:0.1.0"
CONFIG_PATH = "/etc/calmon/config.yaml"
STATE_MOUNT = "/var/lib/calmon"
PORT = 9108
POD_INDEX_FIELD = "metadata.labels['apps.kubernetes.io/pod-index']"
SAMPLE_ORDINAL = "2"
POD_NAME_FIELD = "metadata.name"
SAMPLE_POD_NAME = "calmon-2"

MANIFESTS = load_manifests()
WORKLOADS = [(p, d) for p, d in MANIFESTS if d["kind"] in {"Deployment", "StatefulSet"}]


def workload_id(item: tuple[Path, dict[str, Any]]) -> str:
    path, doc = item
    return f"{path.name}:{doc['kind']}/{doc['metadata']['name']}"


def calmon_container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = [
        c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == "calmon"
    ]
    assert len(containers) == 1, "exactly one container named calmon"
    return containers[0]


def same_file(path: Path, kind: str) -> list[dict[str, Any]]:
    return [d for p, d in MANIFESTS if p == path and d["kind"] == kind]


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's env as calmon would see it (downward API filled with samples)."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == POD_INDEX_FIELD:
            env[var["name"]] = SAMPLE_ORDINAL
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == POD_NAME_FIELD:
            env[var["name"]] = SAMPLE_POD_NAME
    return env


def config_text(path: Path, workload: dict[str, Any]) -> str:
    """The raw config.yaml of the ConfigMap mounted on /etc/calmon."""
    container = calmon_container(workload)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert "/etc/calmon" in mounts, "the config is mounted at /etc/calmon"
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    volume = volumes[mounts["/etc/calmon"]]
    assert "configMap" in volume, "the /etc/calmon volume is a ConfigMap"
    name = volume["configMap"]["name"]
    maps = [d for d in same_file(path, "ConfigMap") if d["metadata"]["name"] == name]
    assert maps, f"ConfigMap {name} is defined next to the workload in {path.name}"
    assert "config.yaml" in maps[0]["data"]
    return maps[0]["data"]["config.yaml"]


def parsed_config(path: Path, workload: dict[str, Any]) -> dict[str, Any]:
    text = expand_env(config_text(path, workload), container_env(calmon_container(workload)))
    config = yaml.safe_load(text)
    assert isinstance(config, dict)
    return config


def check_contract_keys(config: dict[str, Any]) -> None:
    unknown = set(config) - set(CONTRACT_CONFIG_KEYS)
    assert not unknown, f"keys outside the contract: {sorted(unknown)}"
    for key, value in config.items():
        allowed = CONTRACT_CONFIG_KEYS[key]
        if allowed is not None and isinstance(value, dict):
            extra = set(value) - allowed
            assert not extra, f"{key}: keys outside the contract: {sorted(extra)}"
    triggers = config.get("recalibration", {}).get("triggers") or {}
    assert set(triggers) <= {"ece_above", "ece_increase", "observed_over_expected"}


def test_every_manifest_is_a_kubernetes_object() -> None:
    assert {p.name for p, _ in MANIFESTS} >= {
        "sidecar",
        "scaled-out",
        "group",
        "group-static",
        "servicemonitor.yaml",
        "podmonitor.yaml",
        "prometheusrule.yaml",
        "dashboard.yaml",
    }
    for path, doc in MANIFESTS:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), path.name
        assert doc["metadata"].get("name"), path.name


def test_there_is_a_sidecar_a_static_statefulset_and_two_group_workloads() -> None:
    kinds = sorted((p.name, d["kind"]) for p, d in WORKLOADS)
    assert kinds == [("group", "Deployment"), ("group-static", "StatefulSet"),
                     ("scaled-out", "StatefulSet"), ("sidecar", "Deployment")]


@pytest.mark.parametrize("item", WORKLOADS, ids=workload_id)
def test_calmon_container_runs_the_daemon(item: tuple[Path, dict[str, Any]]) -> None:
    _, workload = item
    c = calmon_container(workload)
    assert c["image"] == IMAGE
    argv = list(c.get("command", ["calmon"])) + list(c.get("args", []))
    assert argv == ["calmon", "run", "-c", CONFIG_PATH]
    assert {"containerPort": PORT, "name": "metrics"} in c["ports"]


@pytest.mark.parametrize("item", WORKLOADS, ids=workload_id)
def test_probes(item: tuple[Path, dict[str, Any]]) -> None:
    _, workload = item
    c = calmon_container(workload)
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": PORT}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": PORT}
    # SIGTERM: checkpoint, commit, exit within 10 s.
    grace = workload["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    assert grace >= 15


@pytest.mark.parametrize("item", WORKLOADS, ids=workload_id)
def test_resources_and_security(item: tuple[Path, dict[str, Any]]) -> None:
    _, workload = item
    c = calmon_container(workload)
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    assert "memory" in c["resources"]["limits"]
    # two processes (Kafka consumer, engine): a core each, never throttled below two
    assert cpu_cores(c["resources"]["requests"]["cpu"]) >= 1
    assert cpu_cores(c["resources"]["limits"].get("cpu", "2")) >= 2
    pod = workload["spec"]["template"]["spec"]
    run_as_non_root = c.get("securityContext", {}).get(
        "runAsNonRoot", pod.get("securityContext", {}).get("runAsNonRoot")
    )
    assert run_as_non_root is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("item", WORKLOADS, ids=workload_id)
def test_scrape_annotations(item: tuple[Path, dict[str, Any]]) -> None:
    _, workload = item
    annotations = workload["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(PORT)


@pytest.mark.parametrize("item", WORKLOADS, ids=workload_id)
def test_state_volume(item: tuple[Path, dict[str, Any]]) -> None:
    path, workload = item
    c = calmon_container(workload)
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert STATE_MOUNT in mounts, "a volume is mounted at /var/lib/calmon"
    state = mounts[STATE_MOUNT]
    assert not state.get("readOnly", False)
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}
    claims = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
    if state["name"] in volumes:
        assert {"emptyDir", "persistentVolumeClaim"} & set(volumes[state["name"]])
    else:
        assert state["name"] in claims, "the state volume is a volumeClaimTemplate"
    config = parsed_config(path, workload)
    state_dir = config["state"]["dir"]
    assert state_dir == STATE_MOUNT or state_dir.startswith(STATE_MOUNT + "/")
    # Everything calmon writes is on a volume (the root filesystem is read-only).
    if c["securityContext"].get("readOnlyRootFilesystem"):
        writable = [m for m in mounts if not mounts[m].get("readOnly", False)]
        output_dir = config["recalibration"]["output_dir"]
        assert any(output_dir == m or output_dir.startswith(m + "/") for m in writable)


@pytest.mark.parametrize("item", WORKLOADS, ids=workload_id)
def test_configmap_uses_only_contract_keys(item: tuple[Path, dict[str, Any]]) -> None:
    path, workload = item
    config = parsed_config(path, workload)
    check_contract_keys(config)
    assert config["server"]["port"] == PORT
    assert config["kafka"]["bootstrap_servers"]
    # Every referenced env var is set in the container or has a default.
    expand_env(config_text(path, workload), container_env(calmon_container(workload)))


def cpu_cores(value: str | int | float) -> float:
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def memory_bytes(value: str | int) -> int:
    """A Kubernetes memory quantity in bytes (Ki/Mi/Gi/Ti, k/M/G/T, or plain)."""
    text = str(value)
    for suffix, factor in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("Ti", 2**40),
                           ("k", 10**3), ("M", 10**6), ("G", 10**9), ("T", 10**12)):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(float(text))


@pytest.mark.parametrize("item", WORKLOADS, ids=workload_id)
def test_memory_covers_the_worst_case_of_the_shipped_configs(
        item: tuple[Path, dict[str, Any]]) -> None:
    """Memory limit and request >= calmon check-config's worst case, for the ConfigMap's
    config and for the image's deploy/config.yaml: calmon is never OOM-killed there."""
    from calmon.capacity import worst_case
    from calmon.config import loads

    path, workload = item
    resources = calmon_container(workload)["resources"]
    limit = memory_bytes(resources["limits"]["memory"])
    request = memory_bytes(resources["requests"]["memory"])
    env = container_env(calmon_container(workload))
    for text in (config_text(path, workload), (DEPLOY / "config.yaml").read_text()):
        worst = worst_case(loads(text, env)).memory
        assert limit >= worst and request >= worst, (path.name, worst / 2**30)
    # and not needlessly more: within 1 GiB of the ConfigMap's worst case
    assert limit - worst_case(loads(config_text(path, workload), env)).memory < 2**30


def scaled_out(name: str) -> tuple[Path, dict[str, Any]]:
    [item] = [(p, d) for p, d in WORKLOADS if p.name == name]
    return item


@pytest.mark.parametrize("name", ["group", "group-static"])
def test_scaled_out_workloads_join_the_consumer_group(name: str) -> None:
    """Both scale-out overlays take partitions from the consumer group (contract §8),
    with the changelog topic named and a session timeout a heartbeat fits in."""
    path, workload = scaled_out(name)
    config = parsed_config(path, workload)
    kafka = config["kafka"]
    assert kafka["instance"] == "group"
    assert kafka["state_changelog_topic"] == f"{kafka['group_id']}-state-changelog"
    client = kafka["client"]
    assert client["heartbeat_interval_ms"] * 3 <= client["session_timeout_ms"]
    assert workload["spec"]["replicas"] >= 2
    # nothing of the static {index, count} mode is left; recalibration has one owner
    # per model through the joined topic, as in the static mode
    assert "CALMON_INSTANCE" not in config_text(path, workload)
    assert config["recalibration"]["enabled"] is True
    assert kafka["joined_topic"] and kafka["calibrators_topic"]


def test_deployment_scales_with_an_hpa_one_pod_at_a_time() -> None:
    path, deployment = scaled_out("group")
    assert deployment["kind"] == "Deployment"
    # dynamic membership: a random pod name would make a new static member each time
    assert "group_instance_id" not in parsed_config(path, deployment)["kafka"]["client"]
    [hpa] = same_file(path, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    assert 2 <= hpa["spec"]["minReplicas"] <= deployment["spec"]["replicas"]
    assert hpa["spec"]["maxReplicas"] >= deployment["spec"]["replicas"]
    # every step is a rebalance: one pod at a time, and scale-down only after a
    # long calm (a rebalance storm otherwise)
    for direction in ("scaleUp", "scaleDown"):
        policies = hpa["spec"]["behavior"][direction]["policies"]
        assert policies == [{"type": "Pods", "value": 1,
                             "periodSeconds": policies[0]["periodSeconds"]}]
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300
    strategy = deployment["spec"]["strategy"]
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0
    # the state is a cache on an emptyDir: the changelog is the source of truth
    c = calmon_container(deployment)
    mount = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}[STATE_MOUNT]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes[mount]


def test_statefulset_is_a_static_member_named_by_its_pod() -> None:
    path, sts = scaled_out("group-static")
    assert sts["kind"] == "StatefulSet"
    c = calmon_container(sts)
    env = {e["name"]: e for e in c["env"]}
    assert "${POD_NAME}" in config_text(path, sts)
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == POD_NAME_FIELD
    client = parsed_config(path, sts)["kafka"]["client"]
    assert client["group_instance_id"] == SAMPLE_POD_NAME
    # a restarted pod is back within the session timeout and keeps its partitions
    assert client["session_timeout_ms"] >= 60_000
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    # its cache on its own claim, so a restart reads only the changelog's tail
    [claim] = sts["spec"]["volumeClaimTemplates"]
    mount = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}[STATE_MOUNT]
    assert claim["metadata"]["name"] == mount
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_statefulset_instance_from_pod_ordinal() -> None:
    [(path, sts)] = [(p, d) for p, d in WORKLOADS if p.name == "scaled-out"]
    c = calmon_container(sts)
    env = {e["name"]: e for e in c["env"]}
    ref = env["CALMON_INSTANCE_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert ref == POD_INDEX_FIELD
    assert "${CALMON_INSTANCE_INDEX}" in config_text(path, sts)
    config = parsed_config(path, sts)
    instance = config["kafka"]["instance"]
    assert instance == {"index": int(SAMPLE_ORDINAL), "count": sts["spec"]["replicas"]}
    assert sts["spec"]["replicas"] >= 2
    # The count lives in the pod template (a change is a template change), and no
    # pod takes a template change until all are deleted together: two counts never
    # run at once.
    assert "${CALMON_INSTANCE_COUNT}" in config_text(path, sts)
    assert env["CALMON_INSTANCE_COUNT"]["value"] == str(sts["spec"]["replicas"])
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    # One state dir each: a PersistentVolumeClaim per pod.
    [claim] = sts["spec"]["volumeClaimTemplates"]
    mount = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}[STATE_MOUNT]
    assert claim["metadata"]["name"] == mount
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]


@pytest.mark.parametrize("name", ["scaled-out", "group-static"])
def test_statefulset_headless_service(name: str) -> None:
    [(path, sts)] = [(p, d) for p, d in WORKLOADS if p.name == name]
    services = {s["metadata"]["name"]: s for s in same_file(path, "Service")}
    svc = services[sts["spec"]["serviceName"]]
    assert svc["spec"]["clusterIP"] == "None"
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert sts["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    [port] = svc["spec"]["ports"]
    assert port["port"] == PORT and port["name"] == "metrics"


def test_servicemonitor_selects_the_service() -> None:
    monitors = [d for _, d in MANIFESTS if d["kind"] == "ServiceMonitor"]
    assert monitors, "an optional ServiceMonitor is provided"
    services = [d for _, d in MANIFESTS if d["kind"] == "Service"]
    for mon in monitors:
        assert mon["apiVersion"] == "monitoring.coreos.com/v1"
        selected = [
            s
            for s in services
            if mon["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        ]
        assert selected
        port_names = {p["name"] for s in selected for p in s["spec"]["ports"]}
        for endpoint in mon["spec"]["endpoints"]:
            assert endpoint["port"] in port_names
            assert endpoint.get("path", "/metrics") == "/metrics"
        # The job label must be "calmon" for the alert rules (up{job="calmon"}).
        job_label = mon["spec"].get("jobLabel")
        job = selected[0]["metadata"]["labels"].get(job_label) if job_label else None
        assert (job or selected[0]["metadata"]["name"]) == "calmon"


def test_sidecar_shares_the_pod_with_a_model_server() -> None:
    [(path, dep)] = [(p, d) for p, d in WORKLOADS if p.name == "sidecar"]
    names = [c["name"] for c in dep["spec"]["template"]["spec"]["containers"]]
    assert "calmon" in names and len(names) >= 2
    # One consumer of the topics: replicas would each count every partition.
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    # Published calibrators survive a rescheduled pod: on a claim and on a topic.
    config = parsed_config(path, dep)
    assert config["kafka"]["calibrators_topic"]
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    out = config["recalibration"]["output_dir"]
    mounts = {m["mountPath"]: m for m in calmon_container(dep)["volumeMounts"]}
    [holder] = [m for p, m in mounts.items() if out.startswith(p + "/")]
    claim = volumes[holder["name"]]["persistentVolumeClaim"]["claimName"]
    assert claim in {d["metadata"]["name"] for d in same_file(path, "PersistentVolumeClaim")}
    server = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] != "calmon"]
    reads = [m for c in server for m in c.get("volumeMounts", []) if m["name"] == holder["name"]]
    assert reads and all(m["readOnly"] for m in reads), "the model server reads the calibrators"


def test_sidecar_state_volume_takes_one_pod() -> None:
    """Two replicas on one state volume would each count every sample: the claim
    admits one pod (not one node), and the state dir is calmon's own."""
    [(path, dep)] = [(p, d) for p, d in WORKLOADS if p.name == "sidecar"]
    state = parsed_config(path, dep)["state"]["dir"]
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m for m in calmon_container(dep)["volumeMounts"]}
    [holder] = [m for p, m in mounts.items() if state.startswith(p + "/")]
    claim_name = volumes[holder["name"]]["persistentVolumeClaim"]["claimName"]
    [claim] = [d for d in same_file(path, "PersistentVolumeClaim")
               if d["metadata"]["name"] == claim_name]
    assert claim["spec"]["accessModes"] == ["ReadWriteOncePod"]


# --- restricted Pod Security, schemas, disruption and network -----------------

RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


@pytest.mark.parametrize("item", WORKLOADS, ids=workload_id)
def test_pods_meet_restricted_pod_security(item: tuple[Path, dict[str, Any]]) -> None:
    """The "restricted" Pod Security Standard (kubernetes.io/docs/concepts/security/
    pod-security-standards), checked for every container of the pod template."""
    _, workload = item
    pod = workload["spec"]["template"]["spec"]
    pod_sc = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key), key
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        assert kinds <= RESTRICTED_VOLUMES, volume
    assert pod.get("automountServiceAccountToken") is False, "no API token in the pod"
    for c in pod.get("initContainers", []) + pod["containers"]:
        sc = c.get("securityContext", {})
        name = c["name"]
        assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, name
        assert sc.get("runAsUser", pod_sc.get("runAsUser")) != 0, name
        assert sc.get("allowPrivilegeEscalation") is False, name
        assert not sc.get("privileged"), name
        assert "ALL" in sc.get("capabilities", {}).get("drop", []), name
        assert set(sc.get("capabilities", {}).get("add", [])) <= {"NET_BIND_SERVICE"}, name
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
        assert seccomp.get("type") in {"RuntimeDefault", "Localhost"}, name
        assert sc.get("readOnlyRootFilesystem") is True, name
        for port in c.get("ports", []):
            assert "hostPort" not in port, name


def test_manifests_validate_against_the_kubernetes_schemas() -> None:
    """Every core object against the OpenAPI schemas bundled with kubernetes-validate
    (offline, strict: unknown fields fail). The Operator's CRDs have no schema there:
    tests/integration/deploy/test_mixin.py checks them."""
    kv = pytest.importorskip("kubernetes_validate",
                             reason="kubernetes-validate is not installed (test extra)")
    import kubernetes_validate.utils as kvu

    version = kvu.latest_version()
    checked = 0
    for path, doc in MANIFESTS:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as e:
            raise AssertionError(f"{path.name} {doc['kind']}/{doc['metadata']['name']}: "
                                 f"{e.message} at {list(e.path)}") from None
        checked += 1
    assert checked >= 9


def test_disruption_budget_and_network_policies() -> None:
    for path, workload in WORKLOADS:
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        policies = [d for d in same_file(path, "NetworkPolicy")
                    if d["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()]
        assert policies, f"{path.name}: no NetworkPolicy selects the pods"
        # calmon's port admits only the monitoring namespace
        rules = [r for p in policies for r in p["spec"]["ingress"]
                 if any(port["port"] in ("metrics", PORT) for port in r.get("ports", []))]
        assert rules and all(r.get("from") for r in rules), path.name
        config = parsed_config(path, workload)
        # listening on every interface only because the pod is scraped from outside
        assert config["server"]["host"] == "0.0.0.0"
        assert pod_labels.get("calmon/job") == "calmon", "selected by the PodMonitor"
        if path.name != "sidecar":
            [pdb] = same_file(path, "PodDisruptionBudget")
            assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
            assert pdb["spec"]["maxUnavailable"] == 1


@pytest.mark.skipif(
    importlib.util.find_spec("calmon.cli") is None, reason="calmon.cli is not written yet"
)
@pytest.mark.parametrize("item", WORKLOADS, ids=workload_id)
def test_calmon_check_config_accepts_the_configmap(
    item: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    path, workload = item
    config = tmp_path / "config.yaml"
    config.write_text(config_text(path, workload))
    env = dict(os.environ, **container_env(calmon_container(workload)))
    code = "import sys; from calmon.cli import main; sys.argv[0] = 'calmon'; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", code, "check-config", "-c", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the container image ------------------------------------------------------

DOCKERFILE = (DEPLOY / "Dockerfile").read_text()


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_entrypoint_and_cmd() -> None:
    ins = dockerfile_instructions()
    [entrypoint] = [json.loads(a) for w, a in ins if w == "ENTRYPOINT"]
    [cmd] = [json.loads(a) for w, a in ins if w == "CMD"]
    assert entrypoint == ["calmon"]
    assert cmd == ["run", "-c", CONFIG_PATH]
    assert ("EXPOSE", str(PORT)) in ins
    volumes = [a for w, a in ins if w == "VOLUME"]
    assert any(STATE_MOUNT in v for v in volumes)


def test_dockerfile_base_and_user() -> None:
    ins = dockerfile_instructions()
    args = dict(a.split("=", 1) for w, a in ins if w == "ARG" and "=" in a)
    froms = [
        a.split()[0].replace("${PYTHON_VERSION}", args.get("PYTHON_VERSION", ""))
        for w, a in ins
        if w == "FROM"
    ]
    assert froms and all(f == "python:3.11-slim" for f in froms)
    [user] = [a for w, a in ins if w == "USER"]
    assert user.split(":")[0] not in {"0", "root"}
    # the package with its fast extra (kafka.library: confluent) and every codec checked
    assert any(w == "RUN" and 'pip install ".[fast]"' in a and "has_zstd()" in a
               and "import confluent_kafka" in a for w, a in ins)


def test_dockerfile_copies_existing_files() -> None:
    ins = dockerfile_instructions()
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    readme = "README.md"  # pyproject's readme, written with the top-level docs
    for word, args in ins:
        if word != "COPY" or args.startswith("--from"):
            continue
        *sources, _dest = args.split()
        for src in sources:
            if src != readme:
                assert (ROOT / src).exists(), f"COPY {src}: no such file in the repo"
            assert any(line.startswith("!" + src) for line in ignore), (
                f"{src} is excluded by Dockerfile.dockerignore"
            )


def test_image_default_config_uses_contract_keys() -> None:
    text = (DEPLOY / "config.yaml").read_text()
    config = yaml.safe_load(expand_env(text, {}))
    check_contract_keys(config)
    assert config["server"]["port"] == PORT
    assert config["state"]["dir"].startswith(STATE_MOUNT)
    assert config["recalibration"]["output_dir"].startswith(STATE_MOUNT)


def test_manifest_files_are_listed() -> None:
    # A new manifest must be parsed by these tests: keep them YAML, in an overlay's
    # kustomization (or operator/, which the tests read file by file).
    assert all(p.suffix in {".yaml", ".yml"} for p in K8S.rglob("*") if p.is_file())
    listed = set()
    for d in [K8S / "base", *(K8S / "overlays").iterdir()]:
        kust = yaml.safe_load((d / "kustomization.yaml").read_text())
        listed |= {(d / r).resolve() for r in kust.get("resources", [])}
        listed |= {(d / f).resolve() for g in kust.get("configMapGenerator", [])
                   for f in g.get("files", [])}
        listed.add((d / "kustomization.yaml").resolve())
    files = {p.resolve() for p in K8S.rglob("*.y*ml") if "operator" not in p.parts}
    assert files <= listed, f"not in any kustomization: {sorted(map(str, files - listed))}"


def test_overlays_render_and_share_the_base() -> None:
    """kubectl kustomize renders both overlays; the config is a generated ConfigMap
    named after its content, and each workload mounts the one of its overlay."""
    for name in ("sidecar", "scaled-out", "group", "group-static"):
        docs = [d for p, d in MANIFESTS if p.name == name]
        [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
        assert re.fullmatch(r"calmon-config-[a-z0-9]{10}", cm["metadata"]["name"])
        assert cm["metadata"]["labels"]["app.kubernetes.io/part-of"] == "calmon"
        [workload] = [d for d in docs if d["kind"] in {"Deployment", "StatefulSet"}]
        names = {v["configMap"]["name"] for v in workload["spec"]["template"]["spec"]["volumes"]
                 if "configMap" in v}
        assert names == {cm["metadata"]["name"]}
    base = (K8S / "base" / "config.yaml").read_text()
    [sidecar_cm] = [d for p, d in MANIFESTS if p.name == "sidecar" and d["kind"] == "ConfigMap"]
    assert sidecar_cm["data"]["config.yaml"] == base
