"""``examples/kubernetes/distrl-trainjob.yaml`` checked without a cluster: it parses, it is a
Kubeflow Trainer v2 ``TrainJob`` on the stock torch runtime with the fields of the API as it
stands (``runtimePatches``, which replaced ``podTemplateOverrides`` in Trainer v2.2; no
``elasticPolicy``), torchrun gets what a restart needs (c10d rendezvous at the Trainer's
master address, ``--max-restarts``), the run's arguments are a valid distrl command with
``resume=auto`` and a fixed name, and its run directory is on the shared volume every node
pod mounts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from presets import REPO, compose_run

MANIFEST = REPO / "examples" / "kubernetes" / "distrl-trainjob.yaml"
# set by the Trainer on the node container (Kubeflow Trainer, pkg/constants: TorchEnv*); a
# TrainJob that sets them itself is refused by its webhook
RESERVED_ENV = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                "PET_MASTER_PORT"}


def _documents() -> dict[str, dict[str, Any]]:
    return {document["kind"]: document for document in yaml.safe_load_all(MANIFEST.read_text())}


def _flags(command: list[str]) -> dict[str, str]:
    return dict(part.split("=", 1) for part in command if part.startswith("--"))


def _node_pod(job: dict[str, Any]) -> dict[str, Any]:
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    return node["template"]["spec"]["template"]["spec"]


def test_the_trainjob_uses_the_v2_api_on_the_stock_torch_runtime():
    job = _documents()["TrainJob"]
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org",
                                         "kind": "ClusterTrainingRuntime",
                                         "name": "torch-distributed"}
    assert set(job["spec"]) == {"runtimeRef", "trainer", "runtimePatches"}
    assert set(job["spec"]["trainer"]) <= {"image", "command", "args", "env", "numNodes",
                                           "resourcesPerNode", "numProcPerNode"}
    assert job["spec"]["trainer"]["numNodes"] >= 2
    assert not RESERVED_ENV & {env["name"] for env in job["spec"]["trainer"]["env"]}


def test_torchrun_gets_a_rendezvous_that_survives_a_restart():
    trainer = _documents()["TrainJob"]["spec"]["trainer"]
    assert trainer["command"][0] == "torchrun"
    assert trainer["command"][-1].endswith("/run.py")
    flags = _flags(trainer["command"])
    assert flags["--nnodes"] == "$(PET_NNODES)"
    assert flags["--nproc-per-node"] == "$(PET_NPROC_PER_NODE)"
    assert flags["--rdzv-backend"] == "c10d"  # a restarted pod rejoins; static would not
    assert flags["--rdzv-endpoint"] == "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)"
    assert flags["--rdzv-id"]
    assert int(flags["--max-restarts"]) >= 1


def test_the_run_arguments_are_a_valid_distrl_command_that_resumes(tmp_path: Path):
    args = _documents()["TrainJob"]["spec"]["trainer"]["args"]
    settings = dict(arg.split("=", 1) for arg in args)
    assert settings["resume"] == "auto" and settings["log.name"]
    run_overrides = [arg for arg in args if not arg.startswith(("hydra.", "resume="))]
    cfg = compose_run(tmp_path, "k8s", *run_overrides)  # composes and validates every field
    assert (cfg.agent.name, cfg.env.id, cfg.agent.device) == ("apex", "Pong", "cuda")


def test_the_run_directory_is_on_a_volume_every_node_pod_shares():
    documents = _documents()
    claim = documents["PersistentVolumeClaim"]
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    job = documents["TrainJob"]
    pod = _node_pod(job)
    (volume,) = pod["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    (container,) = pod["containers"]
    assert container["name"] == "node"
    (mount,) = container["volumeMounts"]
    assert mount["name"] == volume["name"]
    log_dir = dict(arg.split("=", 1) for arg in job["spec"]["trainer"]["args"])["log.dir"]
    assert Path(log_dir).is_relative_to(mount["mountPath"])
    # SIGTERM on deletion or preemption: time to write the checkpoint before SIGKILL
    assert pod["terminationGracePeriodSeconds"] >= 60


@pytest.mark.parametrize("field", ["elasticPolicy", "podTemplateOverrides", "podSpecOverrides"])
def test_no_field_the_current_api_removed(field: str):
    assert field not in MANIFEST.read_text()
