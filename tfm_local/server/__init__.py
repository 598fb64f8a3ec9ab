"""tfm-serve: an OpenAI-compatible HTTP server on one speculative Engine.

``create_app(engine, model_name, api_key=None)`` builds the FastAPI app
(app.py: routes; schemas.py: request bodies; messages.py: chat messages
for the template, tool use; errors.py: OpenAI error bodies; middleware.py:
API key and body limit; stream.py: one generation at a time, worker
threads, SSE). The command line is ``tfm_local/cli/serve.py``.
"""
from .app import create_app

__all__ = ["create_app"]
