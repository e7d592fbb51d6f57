"""The pipeline as KFP v2: the components written from the stage table, the DAG and its compilation, the run
store's PVC step, recurring runs."""
