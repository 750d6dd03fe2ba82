"""The memory a served variant takes, measured: an ONNX Runtime session of it, written as
it is published (:func:`converters.model_dir.write_onnx`: large weights in a file beside
the graph, which ONNX Runtime maps), opened in a fresh process and run once at its
largest served batch.

The figure is the process's resident set size (RSS) after the run minus its RSS just
before the session was opened, with numpy, ONNX Runtime and the inputs already loaded:
what the session itself holds (weights, pre-packed kernels, the arena the run grew), not
the interpreter. A fresh process, because a session in the converter's own process
shares an arena and pages already touched by the variants measured before it.

Run as ``python -m converters.footprint MODEL INPUTS.npz SETTINGS_JSON``: prints one
JSON line ``{"rss_before": n, "rss_after": n}``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters.model_dir import write_onnx
from converters.runtime import RuntimeSettings

METHOD = ("RSS of a fresh process after opening an ONNX Runtime session ({providers}) and "
          "running one batch of {batch}, minus its RSS just before opening it")


@dataclass(frozen=True)
class Footprint:
    bytes: int
    method: str
    batch: int

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "method": self.method, "batch": self.batch}


class FootprintError(RuntimeError):
    """The measuring process failed (its stderr's end is in the message)."""


def measure_footprint(model: Path, runtime: RuntimeSettings,
                      feeds: Mapping[str, np.ndarray], timeout_s: float = 120.0) -> Footprint:
    """Open ``model`` as it is published with ``runtime`` in a fresh Python process, run
    ``feeds`` once."""
    batch = int(next(iter(feeds.values())).shape[0]) if feeds else 1
    with tempfile.TemporaryDirectory(prefix="footprint.") as tmp:
        served = write_onnx(model, Path(tmp) / "model.onnx")[0]
        inputs = Path(tmp) / "inputs.npz"
        arrays: dict[str, Any] = dict(feeds)  # Any: np.savez types its keywords as options
        np.savez(inputs, **arrays)
        done = subprocess.run(
            [sys.executable, "-m", "converters.footprint", str(served), str(inputs),
             json.dumps(asdict(runtime))],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )
    if done.returncode != 0:
        raise FootprintError(f"measuring {model.name} exited {done.returncode}: "
                             f"{done.stderr.strip()[-800:]}")
    sizes = json.loads(done.stdout.strip().splitlines()[-1])
    method = METHOD.format(providers=", ".join(runtime.providers), batch=batch)
    return Footprint(max(0, sizes["rss_after"] - sizes["rss_before"]), method, batch)


def _measure_here(model: Path, inputs: Path, settings: RuntimeSettings) -> dict[str, int]:
    import onnxruntime  # noqa: F401 - loaded before the baseline: the library is not the model
    import psutil

    from converters.runtime import feeds_for, open_session

    with np.load(inputs) as stored:
        feeds = {name: stored[name] for name in stored.files}
    process = psutil.Process()
    before = process.memory_info().rss
    session = open_session(model, settings)
    session.run(None, feeds_for(session, feeds))
    return {"rss_before": before, "rss_after": process.memory_info().rss}


def main(argv: list[str]) -> None:
    model, inputs, settings = argv
    fields = json.loads(settings)
    runtime = RuntimeSettings(
        intra_op_threads=int(fields["intra_op_threads"]),
        disabled_optimizers=tuple(fields["disabled_optimizers"]),
        providers=tuple(fields["providers"]),
    )
    print(json.dumps(_measure_here(Path(model), Path(inputs), runtime)))


if __name__ == "__main__":
    main(sys.argv[1:])
