"""Dataset inputs logged by concurrent runs of one experiment (parallel evaluations, ablation arms)."""

from __future__ import annotations

import threading

from components.core.tracking import log_dataset_input


def test_runs_logging_the_same_dataset_at_once_all_record_it(tmp_path):
    # Found in CI: two ablation arms evaluated at once; MLflow's SQL store looks the dataset up, then
    # inserts it, and the loser of that race failed its whole stage on the unique key.
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.set_experiment("datasets-race").experiment_id
    client = MlflowClient(uri)
    rows = [{"task_id": f"t{i}", "seed": i} for i in range(20)]
    errors: list[BaseException] = []
    run_ids: list[str] = []

    for attempt in range(4):  # each round a new dataset: every round is a fresh race
        run_ids_round = [client.create_run(experiment).info.run_id for _ in range(6)]
        barrier = threading.Barrier(len(run_ids_round))

        def log(run_id: str, name: str = f"heldout-{attempt}") -> None:
            try:
                with mlflow.start_run(run_id=run_id):
                    barrier.wait()
                    log_dataset_input(rows, tmp_path, name=name, context="evaluation")
            except BaseException as err:  # noqa: BLE001 - collected and asserted below
                errors.append(err)

        threads = [threading.Thread(target=log, args=(r,)) for r in run_ids_round]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        run_ids += run_ids_round
    assert not errors, errors[:2]
    for run_id in run_ids:
        assert [d.dataset.name for d in client.get_run(run_id).inputs.dataset_inputs], run_id
