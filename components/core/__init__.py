"""Shared building blocks of every stage: schemas, storage, harness, policies, task suites."""
