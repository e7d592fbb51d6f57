"""Programs copied into a Claw sandbox at setup (stdlib only; the host imports `claw` for its docs)."""
