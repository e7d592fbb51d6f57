"""The KFP and Argo YAML: they compile, load back, validate, hold the DAG of the diagram, and match golden files."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import jsonschema
import pytest
import yaml
from google.protobuf import json_format
from kubernetes.utils.quantity import parse_quantity

from pipelines.argo.schema import validate_argo
from pipelines.cli import ARGO_CRON_FILE, ARGO_TEMPLATE_FILE, KFP_FILE, compile_all, main
from pipelines.kfp.schedule import RecurringRunSpec, recurring_run_arguments

GOLDEN = Path(__file__).resolve().parents[2] / "pipelines" / "golden"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, Path]:
    return compile_all(tmp_path_factory.mktemp("compiled"))


@pytest.fixture(scope="module")
def gpu_compiled(tmp_path_factory) -> dict[str, Path]:
    """Compiled with the GPU stages on GPUs (the presets run them on CPU)."""
    return compile_all(tmp_path_factory.mktemp("gpu"), sets=["resources.gpu=true"])


def _kfp_docs(compiled) -> list[dict]:
    return list(yaml.safe_load_all(compiled["kfp"].read_text()))


def test_kfp_yaml_loads_back_with_the_sdk_and_parses_as_pipeline_spec(compiled):
    from kfp import components
    from kfp.pipeline_spec import pipeline_spec_pb2

    loaded = components.load_component_from_file(str(compiled["kfp"]))
    assert loaded.name == "orchard-training"
    assert {
        "recipe",
        "preset",
        "overrides_json",
        "start_from",
        "promotion_margin",
        "train_tasks",
        "data_store",
        "window_runs",
        "image",
        "gpu_image",
        "sandbox_url",
        "mlflow_uri",
        "sandbox_token_secret",
        "gpu_node_selector",
        "volume_size",
    } <= set(loaded.component_spec.inputs)
    margin = loaded.component_spec.inputs["promotion_margin"]  # a typed optional, not a -1.0 sentinel
    assert (margin.type, margin.optional, margin.default) == ("Float", True, None)
    docs = _kfp_docs(compiled)
    assert len(docs) == 2, "kfp-kubernetes settings compile into a second YAML document"
    spec = json_format.ParseDict(docs[0], pipeline_spec_pb2.PipelineSpec())
    assert spec.pipeline_info.name == "orchard-training"


def test_kfp_dag_reads_like_the_diagram(compiled):
    spec = _kfp_docs(compiled)[0]
    assert set(spec["root"]["dag"]["tasks"]) == {"exit-handler-1", "close-run"}
    tasks = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    deps = {name: set(t.get("dependentTasks", [])) for name, t in tasks.items()}
    display = {name: t["taskInfo"]["name"] for name, t in tasks.items()}
    assert deps["provision"] == {"start"}
    assert "provision" in deps["distill"]
    assert "distill" in deps["credit"]
    assert "credit" in deps["accumulate"] and {"accumulate", "init-policy"} <= deps["sft"]
    assert "sft" in deps["rl"]
    assert display == {n: n for n in tasks}, "task names are the stage names (no evaluate-2)"
    assert {"init-policy"} <= deps["evaluate-untrained"]
    assert "sft" in deps["evaluate-sft"] and "rl" in deps["evaluate-rl"]
    assert {f"evaluate-{a}" for a in ("teacher", "untrained", "sft", "rl")} <= deps["report"]
    # typed artifacts between steps
    comps = spec["components"]
    assert (
        comps["comp-distill"]["outputDefinitions"]["artifacts"]["trajectories"]["artifactType"]["schemaTitle"]
        == "system.Dataset"
    )
    assert comps["comp-sft"]["outputDefinitions"]["artifacts"]["model"]["artifactType"]["schemaTitle"] == "system.Model"
    assert (
        comps["comp-sft"]["outputDefinitions"]["artifacts"]["metrics"]["artifactType"]["schemaTitle"]
        == "system.Metrics"
    )


def test_kfp_kubernetes_settings_gpu_pvc_secrets(gpu_compiled):
    from kfp.kubernetes import kubernetes_executor_config_pb2 as k8s_pb

    spec, platform = _kfp_docs(gpu_compiled)
    executors = spec["deploymentSpec"]["executors"]
    for step in ("sft", "rl"):
        resources = executors[f"exec-{step}"]["container"]["resources"]
        assert resources["accelerator"]["resourceType"] == "nvidia.com/gpu"
        assert resources["accelerator"]["resourceCount"] == "1"
        assert (
            executors[f"exec-{step}"]["container"]["image"] == "{{$.inputs.parameters['pipelinechannel--gpu_image']}}"
        )
    assert executors["exec-provision"]["container"]["image"] == "{{$.inputs.parameters['pipelinechannel--image']}}"
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name, cfg in k8s.items():
        json_format.ParseDict(cfg, k8s_pb.KubernetesExecutorConfig())  # the kfp-kubernetes schema
    for step in ("sft", "rl"):
        assert (
            k8s[f"exec-{step}"]["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"]
            == "pipelinechannel--gpu_node_selector"
        )
        assert (
            k8s[f"exec-{step}"]["tolerations"][0]["tolerationJson"]["componentInputParameter"]
            == "pipelinechannel--gpu_tolerations"
        )
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["gpu_node_selector"]["defaultValue"] == {"orchard.dev/pool": "gpu"}
    for step in ("distill", "credit"):
        assert k8s[f"exec-{step}"]["pvcMount"][0]["mountPath"] == "/mnt/run-store"
    for step in ("provision", "distill", "credit", "sft", "rl", "evaluate-untrained", "evaluate-teacher"):
        secrets = {e["envVar"]: s for s in k8s[f"exec-{step}"]["secretAsEnv"] for e in s["keyToEnv"]}
        assert (
            secrets["ORCHARD_SANDBOX_TOKEN"]["secretNameParameter"]["componentInputParameter"]
            == "pipelinechannel--sandbox_token_secret"
        )
    assert params["sandbox_token_secret"]["defaultValue"] == "orchard-api-token"
    assert params["sandbox_url"]["defaultValue"] == "http://orchard-sandbox-service.orchard.svc:8765"
    assert not [p for p in params if p.endswith("token")], "secrets are never parameters (only Secret names)"


def test_argo_yaml_validates_against_the_workflow_schema(compiled):
    template = yaml.safe_load(compiled["argo_template"].read_text())
    cron = yaml.safe_load(compiled["argo_cron"].read_text())
    validate_argo(template)
    validate_argo(cron)
    broken = yaml.safe_load(compiled["argo_template"].read_text())
    broken["spec"]["templates"][0]["contianer"] = broken["spec"]["templates"][0].pop("container")
    with pytest.raises(jsonschema.ValidationError):
        validate_argo(broken)


def test_argo_dag_gpu_steps_and_cron(compiled, gpu_compiled):
    template = yaml.safe_load(compiled["argo_template"].read_text())
    assert template["kind"] == "WorkflowTemplate"
    templates = {t["name"]: t for t in template["spec"]["templates"]}
    dag = {t["name"]: t for t in templates[template["spec"]["entrypoint"]]["dag"]["tasks"]}
    for name, task in dag.items():
        assert task["template"] in templates, f"{name} references a missing template"
    assert dag["distill"]["depends"] == "provision"
    assert set(dag["credit"]["depends"].split(" && ")) == {"distill", "provision"}
    assert set(dag["accumulate"]["depends"].split(" && ")) == {"credit", "provision"}
    assert set(dag["sft"]["depends"].split(" && ")) == {"accumulate", "init-policy"}
    assert set(dag["rl"]["depends"].split(" && ")) == {"sft", "provision"}
    assert {f"evaluate-{a}" for a in ("teacher", "untrained", "sft", "rl")} <= set(
        dag["report"]["depends"].split(" && ")
    )
    for name in dag:
        assert dag[name]["template"] == name, "one template per stage, named after it"
    gpu = {t["name"]: t for t in yaml.safe_load(gpu_compiled["argo_template"].read_text())["spec"]["templates"]}["sft"]
    assert gpu["container"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["podSpecPatch"] == (
        '{"nodeSelector": {{workflow.parameters.gpu_node_selector}}, '
        '"tolerations": {{workflow.parameters.gpu_tolerations}}}'
    )
    args = {p["name"]: p["value"] for p in template["spec"]["arguments"]["parameters"]}
    assert json.loads(args["gpu_node_selector"]) == {"orchard.dev/pool": "gpu"}
    assert args["sandbox_token_secret"] == "orchard-api-token"
    env = {e["name"]: e for e in templates["provision"]["container"]["env"]}
    assert (
        env["ORCHARD_SANDBOX_TOKEN"]["valueFrom"]["secretKeyRef"]["name"]
        == "{{workflow.parameters.sandbox_token_secret}}"
    )
    assert template["spec"]["onExit"] == "close-run"
    assert template["spec"]["serviceAccountName"] == "orchard-pipeline"
    claim = template["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "run-data"
    assert "storageClassName" not in claim["spec"]  # the cluster's default class
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    # The controller parses the claim's quantities before substituting parameters (a real Argo 3.7 rejects
    # '{{workflow.parameters.volume_size}}' as malformed): the size is compiled in, not a parameter.
    assert parse_quantity(claim["spec"]["resources"]["requests"]["storage"]) == 20 * 2**30
    assert "volume_size" not in args

    cron = yaml.safe_load(compiled["argo_cron"].read_text())
    assert cron["kind"] == "CronWorkflow"
    assert cron["spec"]["schedules"] == ["0 3 * * 0"]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    # the retraining knobs are the schedule's parameters, with defaults, and the template accepts them
    cron_args = {p["name"]: p["value"] for p in cron["spec"]["workflowSpec"]["arguments"]["parameters"]}
    # a schedule grows the persistent store (on its PVC) by default; a one-off run of the template does not
    assert cron_args == {
        "start_from": "base",
        "promotion_margin": "",
        "train_tasks": "0",
        "data_store": "/orchard-store/data-store",
        "window_runs": "0",
    }
    assert args["data_store"] == ""
    template_args = {p["name"] for p in template["spec"]["arguments"]["parameters"]}
    assert set(cron_args) <= template_args
    assert cron["spec"]["workflowSpec"]["workflowTemplateRef"]["name"] == template["metadata"]["name"]
    assert cron["spec"]["workflowSpec"]["serviceAccountName"] == "orchard-pipeline"


STORE_STAGES = {"provision", "accumulate"}  # the stages that read or write retrain.data_store


def test_the_data_store_claim_is_mounted_by_exactly_the_store_stages(compiled):
    """Both runners mount the persistent store's PVC (ClusterConfig) on provision and accumulate only."""
    from pipelines import stages
    from pipelines.cluster import ClusterConfig

    cluster = ClusterConfig()
    assert {s.name for s in stages.STAGES if s.store_volume} == STORE_STAGES
    spec, platform = _kfp_docs(compiled)
    assert spec["root"]["inputDefinitions"]["parameters"]["data_store_claim"]["defaultValue"] == "orchard-data-store"
    assert spec["root"]["inputDefinitions"]["parameters"]["data_store"]["defaultValue"] == ""  # one-off runs
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    store_mounts = {
        name.removeprefix("exec-"): m
        for name, cfg in k8s.items()
        for m in cfg.get("pvcMount", [])
        if m["pvcNameParameter"].get("componentInputParameter") == "pipelinechannel--data_store_claim"
    }
    assert set(store_mounts) == STORE_STAGES
    assert {m["mountPath"] for m in store_mounts.values()} == {cluster.data_store_mount} == {"/orchard-store"}

    template = yaml.safe_load(compiled["argo_template"].read_text())
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == "data-store"]
    assert volume["persistentVolumeClaim"]["claimName"] == "{{workflow.parameters.data_store_claim}}"
    args = {p["name"]: p["value"] for p in template["spec"]["arguments"]["parameters"]}
    assert args["data_store_claim"] == cluster.data_store_claim
    mounted = {
        t["name"]: m["mountPath"]
        for t in template["spec"]["templates"]
        for m in t.get("container", {}).get("volumeMounts", [])
        if m["name"] == "data-store"
    }
    assert mounted == {name: cluster.data_store_mount for name in STORE_STAGES}
    assert cluster.data_store_path.startswith(cluster.data_store_mount + "/")  # the schedules' default store


def test_every_compiled_pod_has_a_memory_limit_equal_to_its_request(compiled):
    """A pod without a memory limit may take the node's memory from every other pod: each step and stage pod
    (KFP executors, Argo containers) is limited to what it requests, as a stage's PyTorchJob pods are."""
    executors = _kfp_docs(compiled)[0]["deploymentSpec"]["executors"]
    for name, executor in executors.items():
        if executor["container"]["image"].startswith("argostub/"):  # kfp-kubernetes' DeletePVC: the driver's, no pod
            continue
        resources = executor["container"].get("resources", {})
        assert resources.get("resourceMemoryLimit") == resources.get("resourceMemoryRequest") is not None, (
            name,
            resources,
        )
    templates = yaml.safe_load(compiled["argo_template"].read_text())["spec"]["templates"]
    for t in templates:
        if "container" in t:
            resources = t["container"].get("resources", {})
            assert resources["limits"]["memory"] == resources["requests"]["memory"], (t["name"], resources)


def test_kfp_integer_parameters_default_to_integers(compiled):
    """KFP keeps defaults as protobuf doubles (`seed: 0.0`); the compiled file shows an int parameter's as an int,
    in the spec and in the header's `# Inputs:` comments."""
    text = compiled["kfp"].read_text()
    inputs = _kfp_docs(compiled)[0]["root"]["inputDefinitions"]["parameters"]
    ints = {name: p["defaultValue"] for name, p in inputs.items() if p["parameterType"] == "NUMBER_INTEGER"}
    assert {"seed", "train_tasks", "window_runs"} <= set(ints)
    assert all(type(v) is int for v in ints.values()), ints
    assert "#    seed: int [Default: 0]\n" in text and "int [Default: 0.0]" not in text
    # an optional float has no default at all: no sentinel such as -1.0 standing for "unset"
    assert "#    promotion_margin: float\n" in text and "promotion_margin: float [Default" not in text


@pytest.mark.parametrize(
    "kind,filename", [("kfp", KFP_FILE), ("argo_template", ARGO_TEMPLATE_FILE), ("argo_cron", ARGO_CRON_FILE)]
)
def test_golden_files(compiled, kind, filename):
    """Compiled YAML equals the committed golden file; ORCHARD_REGENERATE_GOLDEN=1 rewrites it."""
    golden = GOLDEN / filename
    fresh = compiled[kind].read_text()
    if os.environ.get("ORCHARD_REGENERATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(fresh)
    assert golden.exists(), f"missing {golden}: run with ORCHARD_REGENERATE_GOLDEN=1 to create it"
    # Parsed, not as text: KFP writes dict-valued parameter defaults through protobuf maps, whose key
    # order varies between processes (the `# Inputs:` comment and the defaults; the content is equal).
    assert list(yaml.safe_load_all(fresh)) == list(yaml.safe_load_all(golden.read_text())), (
        f"{filename} differs from its golden file; if the change is intended, regenerate with "
        "ORCHARD_REGENERATE_GOLDEN=1 pytest tests/pipelines/test_compile.py and review the diff"
    )


def test_cli_compile_writes_all_three(tmp_path, capsys):
    assert main(["compile", "--out", str(tmp_path), "--preset", "tiny", "--schedule", "30 2 * * *"]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {KFP_FILE, ARGO_TEMPLATE_FILE, ARGO_CRON_FILE}
    cron = yaml.safe_load((tmp_path / ARGO_CRON_FILE).read_text())
    assert cron["spec"]["schedules"] == ["30 2 * * *"]
    params = yaml.safe_load_all((tmp_path / KFP_FILE).read_text()).__next__()["root"]["inputDefinitions"]["parameters"]
    assert params["preset"]["defaultValue"] == "tiny"


def test_cli_compile_image_registry_names_every_image_like_make_images(tmp_path, capsys):
    assert (
        main(["compile", "--out", str(tmp_path), "--image-registry", "registry.example/team", "--image-tag", "7"]) == 0
    )
    kfp_params = next(yaml.safe_load_all((tmp_path / KFP_FILE).read_text()))["root"]["inputDefinitions"]["parameters"]
    argo = yaml.safe_load((tmp_path / ARGO_TEMPLATE_FILE).read_text())
    argo_params = {p["name"]: p["value"] for p in argo["spec"]["arguments"]["parameters"]}
    for param, image in (("image", "stage-runtime"), ("gpu_image", "stage-runtime-gpu")):
        assert kfp_params[param]["defaultValue"] == argo_params[param] == f"registry.example/team/{image}:7"
    # make images builds these very names: tests/manifests/test_images.py


def test_cli_compile_refuses_an_unknown_cluster_name_in_one_line(tmp_path, capsys):
    assert main(["compile", "--out", str(tmp_path), "--cluster", "namespaec=ml"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "namespaec" in err


def test_recurring_run_arguments_match_the_kfp_client_signature():
    """No KFP server here: check the arguments bind to the real Client.create_recurring_run signature."""
    import kfp

    spec = RecurringRunSpec(
        package_path="build/pipelines/orchard-training.kfp.yaml", cron="0 3 * * 0", params={"preset": "demo"}
    )
    kwargs = recurring_run_arguments(spec, experiment_id="exp-1")
    bound = inspect.signature(kfp.Client.create_recurring_run).bind(None, **kwargs)
    assert bound.arguments["cron_expression"] == "0 0 3 * * 0"  # KFP wants a seconds field
    assert bound.arguments["max_concurrency"] == 1
    assert bound.arguments["params"] == {
        "preset": "demo",
        "start_from": "base",  # promotion_margin unset: left out
        "train_tasks": 0,
        "data_store": "/orchard-store/data-store",
        "window_runs": 0,
    }
    retrain = RecurringRunSpec(package_path="x", params={"start_from": "champion", "promotion_margin": 0.05})
    assert recurring_run_arguments(retrain, "exp-1")["params"]["start_from"] == "champion"
    assert RecurringRunSpec(package_path="x", cron="0 0 3 * * 0").kfp_cron == "0 0 3 * * 0"
    with pytest.raises(ValueError, match="fields"):
        RecurringRunSpec(package_path="x", cron="every sunday")


def test_cli_schedule_passes_namespace_and_service_account(monkeypatch, capsys):
    """`orchard schedule --namespace --service-account` reach the KFP client and the recurring run."""
    import kfp

    calls: dict = {}

    class Client:
        def __init__(self, host=None, namespace=None, **kw):
            calls["client"] = (host, namespace)

        def get_experiment(self, experiment_name=None, namespace=None):
            calls["get"] = (experiment_name, namespace)
            raise ValueError("no such experiment")

        def create_experiment(self, name, namespace=None):
            calls["create"] = (name, namespace)
            return type("E", (), {"experiment_id": "exp-1"})()

        def create_recurring_run(self, **kw):
            calls["run"] = kw
            return type("R", (), {"recurring_run_id": "rr-1"})()

    monkeypatch.setattr(kfp, "Client", Client)
    assert (
        main(
            [
                "schedule",
                "--host",
                "http://kfp:8080",
                "--package",
                "p.yaml",
                "--namespace",
                "team-a",
                "--service-account",
                "trainer",
            ]
        )
        == 0
    )
    assert calls["client"] == ("http://kfp:8080", "team-a")
    assert calls["get"][1] == calls["create"][1] == "team-a"
    assert calls["run"]["service_account"] == "trainer"
    assert capsys.readouterr().out.strip() == "rr-1"


def test_cli_schedule_says_in_one_line_that_the_host_is_unreachable(capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        unused_tcp_port = s.getsockname()[1]
    code = main(["schedule", "--host", f"http://127.0.0.1:{unused_tcp_port}", "--package", "p.yaml"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert "Traceback" not in err and err.count("\n") == 0, err
    assert err.startswith(f"orchard schedule: cannot reach the KFP API at http://127.0.0.1:{unused_tcp_port}")
