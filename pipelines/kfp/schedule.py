"""Scheduled retraining: a KFP recurring run, or an Argo CronWorkflow (`pipelines/argo/workflow.py`).

`recurring_run_arguments` builds the exact keyword arguments of `kfp.Client.create_recurring_run`
(testable without a server); `create_recurring_run` sends them to a KFP API server.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipelines.argo.workflow import build_cron_workflow  # noqa: F401  (the Argo side of scheduling)
from pipelines.parameters import retrain_arguments


class RecurringRunSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    experiment: str = Field("orchard", description="KFP experiment the recurring run belongs to (created if absent).")
    name: str = Field("orchard-retrain", description="Recurring run (job) name.")
    cron: str = Field("0 3 * * 0", description="Cron schedule, 5 fields (min hour dom mon dow) or KFP's 6 (sec first).")
    package_path: str = Field(description="Compiled pipeline YAML (orchard compile).")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Pipeline parameters (retraining ones: defaults from pipelines.parameters.retrain_arguments).",
    )
    max_concurrency: int = Field(1, ge=1, description="Runs allowed at once (1: a slow retrain blocks the next).")
    no_catchup: bool = Field(True, description="Skip schedules missed while paused instead of backfilling.")
    enabled: bool = Field(True, description="Start the schedule enabled.")
    enable_caching: bool = Field(False, description="Retraining must not reuse cached steps.")
    service_account: str | None = Field(None, description="Kubernetes service account for the runs.")
    namespace: str | None = Field(
        None,
        description="KFP namespace (multi-user KFP: the profile's; None: the client's default, `kubeflow` "
        "on KFP standalone). The runs' pods, the data store PVC and the Secrets live there.",
    )

    @field_validator("cron")
    @classmethod
    def _check_cron(cls, value: str) -> str:
        fields = value.split()
        if len(fields) not in (5, 6):
            raise ValueError(f"cron {value!r} has {len(fields)} fields; give 5 (min hour dom mon dow) or 6 (sec first)")
        return value

    @property
    def kfp_cron(self) -> str:
        """KFP schedules take a seconds field first: '0 3 * * 0' becomes '0 0 3 * * 0'."""
        fields = self.cron.split()
        return " ".join(["0", *fields]) if len(fields) == 5 else self.cron


def recurring_run_arguments(spec: RecurringRunSpec, experiment_id: str) -> dict[str, Any]:
    """Keyword arguments for `kfp.Client.create_recurring_run`."""
    return {
        "experiment_id": experiment_id,
        "job_name": spec.name,
        "description": "orchard scheduled retraining",
        "cron_expression": spec.kfp_cron,
        "max_concurrency": spec.max_concurrency,
        "no_catchup": spec.no_catchup,
        # an optional parameter left unset (None) is left out: the pipeline's own default is None
        "params": {k: v for k, v in {**retrain_arguments(), **spec.params}.items() if v is not None},
        "pipeline_package_path": spec.package_path,
        "enabled": spec.enabled,
        "enable_caching": spec.enable_caching,
        "service_account": spec.service_account,
    }


class KfpUnreachable(ConnectionError):
    """The KFP API could not be reached or refused the call; the message is one line saying which and why."""


def create_recurring_run(spec: RecurringRunSpec, *, host: str | None = None, client: Any = None):
    """Create the recurring run on a KFP server (get-or-create the experiment first).

    Raises KfpUnreachable when the server cannot be reached or answers with an error."""
    from kfp_server_api.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        if client is None:
            import kfp

            client = kfp.Client(host=host, namespace=spec.namespace)
        try:
            experiment = client.get_experiment(experiment_name=spec.experiment, namespace=spec.namespace)
        except (ValueError, ApiException):  # the SDK's answer when the experiment does not exist
            experiment = client.create_experiment(name=spec.experiment, namespace=spec.namespace)
        return client.create_recurring_run(**recurring_run_arguments(spec, experiment.experiment_id))
    except (HTTPError, OSError) as err:
        reason = getattr(err, "reason", None) or err
        raise KfpUnreachable(f"cannot reach the KFP API at {host}: {str(reason).splitlines()[0]}") from err
    except ApiException as err:
        body = (err.body or "").strip().splitlines()
        raise KfpUnreachable(
            f"the KFP API at {host} answered {err.status} {err.reason}" + (f": {body[0][:200]}" if body else "")
        ) from err
