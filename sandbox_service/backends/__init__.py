"""Where a sandbox lives (deployment). What you can do in it (exec, files) is the agent's job."""
