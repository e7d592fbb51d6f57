"""From episodes to text and tokens: chat templates, the tool-call protocol and formats, token-level
rendering, the OpenAI-messages export."""
