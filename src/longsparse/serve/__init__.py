"""``longsparse serve``: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over the continuous-batching engine.

:mod:`.app` builds the app, :mod:`.protocol` holds the request bodies, :mod:`.metrics` the Prometheus metrics and
:mod:`.cli` the command. FastAPI, uvicorn and prometheus-client come with the ``serve`` extra.
"""
