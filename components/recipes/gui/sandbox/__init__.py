"""Programs copied into a GUI sandbox at setup (stdlib + Playwright only; never imported by the host)."""
