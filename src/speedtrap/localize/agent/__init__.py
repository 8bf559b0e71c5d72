"""The in-worker agent's folder, put first on an engine's PYTHONPATH (see ``speedtrap_agent``)."""

__all__: list[str] = []
