"""The pipeline as an Argo WorkflowTemplate and CronWorkflow (hera), and the schema check of the YAML."""
