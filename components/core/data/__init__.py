"""Records and stores: the schemas that cross stage boundaries, parquet stores, the retraining store,
splits by unit, episodes as MLflow traces."""
