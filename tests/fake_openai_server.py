"""A stand-in OpenAI-compatible server for the HTTP-arm tests: standard library only, starts in a fraction of a
second, and behaves like a server that is not this project's (vLLM's counter names, no token ids, no
per-request acceptance).

    python tests/fake_openai_server.py PORT [--delay S] [--crash] [--child] [--ignore-sigint]

/health answers 200 once ``--delay`` seconds have passed; /v1/models lists ``fake``; /v1/chat/completions
streams, one character per chunk, the last user message reversed, cut at ``max_tokens`` characters
(finish_reason ``length``, else ``stop``), then a usage chunk; /metrics exports vLLM's speculative-decoding
counters, grown by every request (one draft of 3 tokens per output character, 2 of them accepted, at
positions 0 and 1). ``--crash`` writes a line to stderr and exits 3 before serving; ``--child`` starts a
sleeping child process first (it must not outlive a stop of the group); ``--ignore-sigint`` ignores SIGINT
(a stop must escalate to SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COUNTS = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "pos0": 0, "pos1": 0}
LOCK = threading.Lock()
STARTED = time.monotonic()


def metrics_text() -> str:
    c = COUNTS
    lines = []
    for name, value in (("vllm:spec_decode_num_drafts", c["drafts"]), ("vllm:spec_decode_num_draft_tokens", c["draft_tokens"]),
                        ("vllm:spec_decode_num_accepted_tokens", c["accepted"])):
        lines += [f"# HELP {name} fake", f"# TYPE {name} counter", f'{name}_total{{model_name="fake"}} {value}']
    name = "vllm:spec_decode_num_accepted_tokens_per_pos"
    lines += [f"# HELP {name} fake", f"# TYPE {name} counter"]
    for position, key in enumerate(("pos0", "pos1", None)):
        lines.append(f'{name}_total{{model_name="fake",position="{position}"}} {c[key] if key else 0}')
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    delay = 0.0

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: str, kind: str = "application/json") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200 if time.monotonic() - STARTED >= self.delay else 503, "{}")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}))
        elif self.path == "/metrics":
            with LOCK:
                self._send(200, metrics_text(), "text/plain; version=0.0.4")
        else:
            self._send(404, json.dumps({"error": {"message": f"no route {self.path}"}}))

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.path != "/v1/chat/completions" or body.get("model") != "fake":
            self._send(404, json.dumps({"error": {"message": f"unknown route or model {body.get('model')!r}"}}))
            return
        user = [m["content"] for m in body["messages"] if m.get("role") == "user"][-1]
        full = user[::-1]
        limit = int(body.get("max_tokens") or 16)
        text, reason = (full[:limit], "length") if len(full) > limit else (full, "stop")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()

        def event(payload) -> None:
            self.wfile.write(f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode())
            self.wfile.flush()

        base = {"id": "fake-1", "object": "chat.completion.chunk", "created": 0, "model": "fake"}
        event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        for ch in text:
            time.sleep(0.002)
            event({**base, "choices": [{"index": 0, "delta": {"content": ch}, "finish_reason": None}]})
        event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
        event({**base, "choices": [], "usage": {"prompt_tokens": len(user), "completion_tokens": len(text),
                                                "total_tokens": len(user) + len(text)}})
        event("[DONE]")
        with LOCK:
            n = len(text)
            COUNTS["drafts"] += n
            COUNTS["draft_tokens"] += 3 * n
            COUNTS["accepted"] += 2 * n
            COUNTS["pos0"] += n
            COUNTS["pos1"] += n
        self.close_connection = True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--crash", action="store_true")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--ignore-sigint", action="store_true")
    args = ap.parse_args()
    if args.crash:
        print("fake server: cannot load the model (a planted crash)", file=sys.stderr, flush=True)
        sys.exit(3)
    if args.child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"child pid {child.pid}", flush=True)
    if args.ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    Handler.delay = args.delay
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"fake server on port {args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
