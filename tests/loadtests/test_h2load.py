"""h2load's command lines and output, as the benchmarks read them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loadtests import h2load

H2LOAD_OUT = """\
starting benchmark...
spawning thread #0: 4 total client(s). Timing-based test with 0s of warm-up time and 2s of main duration for measurements.
Application protocol: h2c
Main benchmark duration is over for thread #0. Stopping all clients.

finished in 2.00s, 12621.00 req/s, 1.59MB/s
requests: 25242 total, 25258 started, 25242 done, 25240 succeeded, 2 failed, 0 errored, 0 timeout
status codes: 25240 2xx, 0 3xx, 2 4xx, 0 5xx
traffic: 3.18MB (3332102) total, 74.24KB (76026) headers (space savings 96.28%), 2.29MB (2397990) data
                     min         max         mean         sd        +/- sd
time for request:      242us      6.13ms      1.25ms       384us    83.41%
time for connect:      329us       362us       349us        14us    75.00%
time to 1st byte:     3.52ms      3.58ms      3.56ms        26us    75.00%
req/s           :    3132.81     3166.34     3154.07       15.95    75.00%
"""  # noqa: E501 - h2load's own lines

# h2load as far as the runner sees it: it appends to its --log-file (the last line cut
# short), sleeps argv[1] seconds unless interrupted, then prints its summary
FAKE_H2LOAD = f"""
import signal, sys, time
def interrupted(*_): raise InterruptedError
signal.signal(signal.SIGINT, interrupted)
with open(sys.argv[sys.argv.index("--log-file") + 1], "a") as log:
    log.write("1796117577143390\\t200\\t1500\\n1796117577143391\\t429\\t20\\n17961175")
try:
    time.sleep(float(sys.argv[1]))
except InterruptedError:
    pass
print({H2LOAD_OUT!r})
"""

def test_parse_h2load_reads_rate_counts_and_mean_when_output_is_real() -> None:
    h2 = h2load.parse_h2load(H2LOAD_OUT)
    assert h2.seconds == pytest.approx(2.0)
    assert h2.req_per_s == pytest.approx(12621.0)
    assert (h2.started, h2.done, h2.succeeded, h2.failed) == (25258, 25242, 25240, 2)
    assert h2.mean_us == pytest.approx(1250.0)


def test_parse_h2load_raises_when_the_summary_is_missing() -> None:
    with pytest.raises(ValueError, match="unexpected h2load output"):
        h2load.parse_h2load("starting benchmark...\nconnect: Connection refused\n")


@pytest.mark.parametrize(("text", "us"), [("242us", 242.0), ("6.13ms", 6130.0),
                                          ("1.5s", 1.5e6)])
def test_duration_us_converts_every_unit_h2load_prints(text: str, us: float) -> None:
    assert h2load.duration_us(text) == pytest.approx(us)


def test_parse_log_reads_status_and_time_when_lines_are_tab_separated() -> None:
    log = h2load.parse_log("1796117577143390\t200\t2839\n1796117577143391\t503\t120\n\n"
                       "1796117577143392\t200\t99\n")
    assert log == [(200, 2839.0), (503, 120.0), (200, 99.0)]
    assert h2load.status_counts(log) == {200: 2, 503: 1}


def test_complete_log_drops_a_line_h2load_was_interrupted_writing() -> None:
    text = "1796117577000000\t200\t20000\n" * 3 + "1796117577999999\t20"
    assert h2load.complete_log(text) == [(200, 20_000.0)] * 3
    assert h2load.complete_log("") == []


def test_runs_start_at_once_on_empty_logs_and_one_past_its_limit_is_interrupted(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.tsv").write_text("1796117570000000\t503\t1\n")  # an earlier run's
    quick, slow = h2load.run_h2loads(
        [[sys.executable, "-c", FAKE_H2LOAD, sleep, "--log-file", str(tmp_path / name)]
         for sleep, name in (("0", "a.tsv"), ("60", "b.tsv"))], limit_s=1.5)
    assert not quick.cut_off and quick.returncode == 0
    assert quick.log == ((200, 1500.0), (429, 20.0)) == slow.log
    assert quick.ok_us() == [1500.0] and quick.summary().succeeded == 25240
    assert slow.cut_off and slow.summary().done == 25242  # SIGINT: it still printed it
    assert h2load.run_h2load(["true"], 5).log == ()  # no --log-file: no log


def test_h2load_gist_keeps_counts_and_error_lines_when_a_run_fails() -> None:
    out = ("starting benchmark...\nprogress: 10% done\n"
           "requests: 8 total, 16 started, 8 done, 4 succeeded, 4 failed, 4 errored, 0 timeout\n")
    err = "Stream was reset\nStream was reset\nconnect: Connection refused\n"
    assert h2load.h2load_gist(out, err) == (
        "requests: 8 total, 16 started, 8 done, 4 succeeded, 4 failed, 4 errored, 0 timeout"
        " | Stream was reset | connect: Connection refused")
    assert h2load.h2load_gist("", "") == "(h2load said nothing)"


def test_h2load_command_multiplexes_grpc_and_opens_one_http1_connection_per_request(
    tmp_path: Path,
) -> None:
    work = h2load.Workload("tiny", tmp_path / "t.grpc", tmp_path / "t.bin", 123)
    endpoints = type("E", (), {"grpc_url": "127.0.0.1:1", "http_url": "127.0.0.1:2"})()
    grpc = h2load.h2load_command(work, "grpc", endpoints, 16, "3000ms", None)
    assert grpc[grpc.index("-c") + 1] == "4" and grpc[grpc.index("-m") + 1] == "4"
    assert grpc[-1] == "http://127.0.0.1:1/inference.GRPCInferenceService/ModelInfer"
    http = h2load.h2load_command(work, "http", endpoints, 16, "3000ms", tmp_path / "l")
    assert "--h1" in http and http[http.index("-c") + 1] == "16"
    assert "Inference-Header-Content-Length: 123" in http
    assert http[-1] == "http://127.0.0.1:2/v2/models/tiny/infer"
