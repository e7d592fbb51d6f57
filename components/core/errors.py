"""The error a stage raises when it ran but must not hand its output on (the stages, the gate, the launcher)."""


class StageFailed(RuntimeError):
    """A stage that ran but must not hand its output on (reason in the message)."""
