"""Python client for sbx, a self-hosted code-execution sandbox runtime.

The API follows the Cloudflare Sandbox SDK (``@cloudflare/sandbox``) with
Python naming; see ``sdk/python/README.md`` for the name mapping.  Standard
library only.

Example::

    from sbx_sandbox import SbxClient, get_sandbox, errors

    client = SbxClient()                      # $SBX_URL, $SBX_API_KEY
    sb = get_sandbox(client, "my-sandbox")
    r = sb.exec("echo hello")
    print(r.exit_code, r.stdout)
    sb.write_file("/workspace/a.txt", "hi")
    print(sb.read_file("/workspace/a.txt"))
    print(sb.run_code("1 + 1").text)          # "2"
    sb.destroy()

Units: durations and timeouts are milliseconds unless a parameter says
seconds; sizes are bytes.  Errors are :class:`errors.SandboxError`
subclasses (one per error code, see :mod:`sbx_sandbox.errors`).
"""

from . import errors
from .errors import SandboxError
from .models import (CodeContext, ExecResult, Execution, ExecutionError, ExposedPort, FileInfo,
                     ListFilesResult, LogMatch, Logs, PortReady, ProcessExit, ReadFileResult,
                     Result, SessionInfo)
from .sandbox import (DEFAULT_URL, ExecutionSession, FileStream, Process, Sandbox, SbxClient,
                      get_sandbox)
from .streams import EventStream, parse_sse
from .terminal import Terminal, WebSocket

__version__ = "0.1.0"

__all__ = [
    "errors", "SandboxError", "SbxClient", "get_sandbox", "Sandbox", "ExecutionSession",
    "Process", "FileStream", "EventStream", "Terminal", "WebSocket", "parse_sse",
    "ExecResult", "FileInfo", "ListFilesResult", "ReadFileResult", "SessionInfo", "CodeContext",
    "Result", "Logs", "ExecutionError", "Execution", "ExposedPort", "LogMatch", "PortReady",
    "ProcessExit", "DEFAULT_URL", "__version__",
]
