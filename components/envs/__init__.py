"""Our recipes as environments for other trainers: OpenEnv servers (`openenv_env.py`), TRL
`environment_factory` classes (`trl_env.py`), both over one episode core (`session.py`)."""
