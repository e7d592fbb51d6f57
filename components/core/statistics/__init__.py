"""Rates measured on tasks: confidence intervals, paired tests, pass@k."""
