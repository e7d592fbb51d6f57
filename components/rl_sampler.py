"""The rollout sampler's public names (the implementation is the `components.rl_sampling` package).

Kept so `components.rl`, the pipeline configs and older callers import from one stable place.
"""

from components.rl_sampling import *  # noqa: F401,F403
from components.rl_sampling import __all__  # noqa: F401
