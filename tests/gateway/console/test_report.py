"""Reports as HTML: raw HTML escaped, only the converter's own plots linked."""

from __future__ import annotations

from pathlib import Path

from gateway.console.report import report_file, report_html


def test_report_html_escapes_html_and_links_only_the_converters_plots() -> None:
    html = report_html("# r <script>x()</script>\n\n| a |\n|---|\n| <b>1</b> |\n\n"
                       "![latency](latency.png) ![t](tradeoff.png) ![evil](http://evil/x.png)\n",
                       "/files/{file}")
    assert "<script>" not in html and "&lt;script&gt;" in html and "<table>" in html
    assert 'src="/files/latency.png"' in html and 'src="/files/tradeoff.png"' in html
    assert "evil/x.png" not in html and "evil" in html  # its alt text, as text


def test_report_file_serves_only_the_converters_files(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    report.write_text("r")
    (tmp_path / "latency.png").write_bytes(b"png")
    (tmp_path / "model.onnx").write_bytes(b"onnx")
    assert report_file(report, "latency.png") == tmp_path / "latency.png"
    assert report_file(report, "tradeoff.png") is None  # not written
    assert report_file(report, "model.onnx") is None
    assert report_file(report, "../report.md") is None
