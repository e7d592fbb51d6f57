"""How the service talks to the agent inside each sandbox: the client, its shared base, mutual TLS."""
