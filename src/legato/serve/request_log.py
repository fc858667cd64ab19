"""The request log of ``legato serve --request-log FILE``: one JSON line per finished
request — when it arrived (seconds on the engine's clock since the engine started), its
adapter, its prompt and output lengths — which ``legato serve simulate --workload FILE``
replays (the prompts themselves are not kept)."""

from __future__ import annotations

import json
from pathlib import Path

from legato.errors import DataError
from legato.serve.workload import BenchRequest


class RequestLog:
    """Appends a line per finished request to ``path``; ``origin``: the clock reading the
    arrivals count from."""

    def __init__(self, path: str | Path, origin: float) -> None:
        self.origin = origin
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115

    def finished(self, request) -> None:
        row = {"arrival_s": request.arrival_s - self.origin, "adapter": request.adapter,
               "prompt_tokens": len(request.prompt), "output_tokens": len(request.output),
               "finish_reason": request.finish_reason}  # fmt: skip
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()


def read_request_log(path: str | Path) -> list[BenchRequest]:
    """The requests of a request log, in arrival order; DataError naming a bad line."""
    rows = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DataError(f"--workload: cannot read {path} ({exc.strerror or exc})") from None
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            rows.append((float(r["arrival_s"]), r["adapter"], int(r["prompt_tokens"]),
                         max(1, int(r["output_tokens"]))))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            raise DataError(
                f"--workload: {path} line {i}: expected a request log line (arrival_s, "
                f"adapter, prompt_tokens, output_tokens)"
            ) from None
    rows.sort(key=lambda r: r[0])
    return [BenchRequest(i, *row) for i, row in enumerate(rows)]
