"""`export --format k8s`: a Deployment and a Service for the trial (GPUs from the layout, the model on a
volume, readiness and liveness probes on vLLM's /health, the flags as container args, the trial's env
knobs as the container's env)."""

from __future__ import annotations

import re

import yaml

from autotune.export.container import PORT, gpu_count, header, image_for, model_mount, server_args
from autotune.export.formats import knob_env
from autotune.export.options import ExportContext


def k8s_name(text: str) -> str:
    """A DNS-1123 label (what Kubernetes accepts as a Deployment or Service name)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    return name or "autotune"


def manifests(ctx: ExportContext) -> list[dict]:
    name = k8s_name(f"vllm-{ctx.study.name}")
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "autotune",
              "autotune/trial": str(ctx.trial.number)}
    mount = model_mount(ctx.study.model)
    gpus = gpu_count(ctx)
    volume: dict = ({"name": "model", "hostPath": {"path": mount.host, "type": "Directory"}} if mount.read_only
                    else {"name": "model", "persistentVolumeClaim": {"claimName": "hf-cache"}})
    probe = {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 10, "timeoutSeconds": 5}
    container = {
        "name": "vllm", "image": image_for(ctx), "args": server_args(ctx, mount),
        **({"env": [{"name": k, "value": v} for k, v in knob_env(ctx.trial).items()]} if knob_env(ctx.trial) else {}),
        "ports": [{"name": "http", "containerPort": PORT}],
        "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
        "volumeMounts": [{"name": "model", "mountPath": mount.container, "readOnly": mount.read_only},
                         {"name": "shm", "mountPath": "/dev/shm"}],
        # model loading can take minutes: readiness waits for it, liveness only starts after it
        "readinessProbe": {**probe, "initialDelaySeconds": 30, "failureThreshold": 60},
        "livenessProbe": {**probe, "initialDelaySeconds": 600, "failureThreshold": 6},
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                 "template": {"metadata": {"labels": dict(labels)}, "spec": {
                     "containers": [container],
                     # vLLM's workers share tensors through /dev/shm (docker: --ipc=host)
                     "volumes": [volume, {"name": "shm", "emptyDir": {"medium": "Memory"}}]}}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"selector": {"app.kubernetes.io/name": name},
                 "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]},
    }
    return [deployment, service]


class _NoAliases(yaml.SafeDumper):
    """Shared sub-dicts are written out in full: a reader of the manifest should not chase anchors."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def k8s_manifests(ctx: ExportContext) -> str:
    docs = "---\n".join(yaml.dump(d, Dumper=_NoAliases, sort_keys=False) for d in manifests(ctx))
    return "\n".join(header(ctx, "a Kubernetes Deployment and Service")) + "\n" + docs
