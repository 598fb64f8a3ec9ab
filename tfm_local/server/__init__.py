"""tfm-serve: an OpenAI-compatible HTTP server on one speculative Engine.

``create_app(engine, model_name, ...)`` builds the FastAPI app
(app.py: routes; schemas.py: request bodies; messages.py: chat messages
for the template, tool use; errors.py: OpenAI error bodies; middleware.py:
API key and body limit; stream.py: one generation at a time, worker
threads, SSE; logprobs.py: per-token log-probabilities in OpenAI's shapes; report.py: the decoding
statistics reported, ``usage.tfm`` and ``x_tfm``; page.py: the chat page at ``/``, files in static/;
tool_calls.py: the model's tool calls in an answer, whole or streamed, as OpenAI ``tool_calls``).
``serve(app, sock)`` runs it under uvicorn and stops
gracefully on SIGTERM or Ctrl-C (run.py). The command line is
``tfm_local/cli/serve.py``.
"""
from .app import create_app
from .run import serve

__all__ = ["create_app", "serve"]
