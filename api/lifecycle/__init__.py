"""How the server starts and stops under an orchestrator: the drain (SIGTERM or an operator's
POST /admin/drain), the readiness probe that announces it, and the uvicorn server that waits for it
before exiting."""
